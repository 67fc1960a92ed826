#!/usr/bin/env python3
"""Sums Catch2 test-case counts over every test in one or more meson
testlog.json files (one per build directory).

A test whose output has no Catch2 summary (it crashed, timed out, or is not a
Catch2 binary) counts as one case, passed or failed by its meson result, or
skipped if meson says SKIP (a shell test that exited 77; a Catch2 binary whose
every case skipped exits 77 too, and counts one per skip line). Catch2 2.x has no
skip: a case that skips prints "NVFS-SKIPPED: why" (tests/mount/mount_fixture.hpp)
and Catch2 counts it as passed; each such line moves one case from passed to
skipped. Prints "N passed, N failed, N skipped" last and exits 1 if anything
failed.
"""
import json
import re
import sys

ALL_PASSED = re.compile(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)")
SUMMARY = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")
ONLY_FAILED = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) failed")
# No assertion ran (every case skipped): "test cases: 1 | 1 passed".
PASSED_ONLY = re.compile(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*$", re.M)
SKIPPED = re.compile(r"^NVFS-SKIPPED: ", re.M)

passed = failed = skipped = 0
for path in sys.argv[1:]:
    tests = []
    with open(path) as log:
        for number, line in enumerate(log, 1):
            try:
                tests.append(json.loads(line))
            except json.JSONDecodeError:
                # An unreadable record hides a result: count it as a failure.
                print(f"{path}:{number}: unreadable test record", file=sys.stderr)
                failed += 1
    for test in tests:
        out = test.get("stdout", "") or ""
        if test.get("result") == "SKIP":
            # A Catch2 binary whose every case skipped exits 77 too
            # (tests/lib/catch_main.cpp): one case per "NVFS-SKIPPED" line.
            skipped += max(1, len(SKIPPED.findall(out)))
            continue
        ok = test.get("result") in ("OK", "EXPECTEDFAIL")
        skips = len(SKIPPED.findall(out))
        m = ALL_PASSED.search(out) or PASSED_ONLY.search(out)
        if m and ok:
            passed += int(m.group(2)) - skips
            skipped += skips
            continue
        m = SUMMARY.search(out)
        if m:
            passed += int(m.group(2)) - skips
            skipped += skips
            failed += int(m.group(3))
            if not ok and int(m.group(3)) == 0:
                failed += 1
            continue
        m = ONLY_FAILED.search(out)
        if m:
            failed += int(m.group(2))
            continue
        if ok:
            passed += 1
        else:
            failed += 1
            print(f"{test.get('name')}: {test.get('result')} with no Catch2 summary",
                  file=sys.stderr)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
