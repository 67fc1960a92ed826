#!/usr/bin/env bash
# Runs the libFuzzer target (tests/fuzz/libfuzzer_main.cpp) for a bounded
# time: builds it with clang, AddressSanitizer and UndefinedBehaviorSanitizer
# in its own build directory, writes a seed corpus from the suite's seed
# images the first time, and fuzzes.
#
#   tools/fuzz.sh [SECONDS] [libFuzzer options...]     (default 60 s)
#
# NVFS_FUZZ_BUILD picks the build directory (default build-libfuzzer), and
# NVFS_FUZZ_JOBS runs that many fuzzing processes side by side (default 1).
# Crashes land in $NVFS_FUZZ_BUILD/fuzz-artifacts; replay one with
#   $NVFS_FUZZ_BUILD/tests/fuzz/nvfs-fuzz ARTIFACT
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

seconds=${1:-60}
[ $# -gt 0 ] && shift
build=${NVFS_FUZZ_BUILD:-$NVFS_TOP/build-libfuzzer}
jobs=${NVFS_FUZZ_JOBS:-1}

nvfs_install_deps clang libclang-rt-14-dev llvm

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ meson setup "$build" "$NVFS_TOP" -Dlibfuzzer=true \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C "$build" tests/fuzz/nvfs-fuzz >/dev/null
fuzzer="$build/tests/fuzz/nvfs-fuzz"

corpus="$build/fuzz-corpus"
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then
  NVFS_FUZZ_WRITE_CORPUS="$corpus" "$fuzzer"
fi

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
# Inputs name a seed and patch it (libfuzzer_main.cpp), so they stay small.
parallel=()
[ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
exec "$fuzzer" -max_total_time="$seconds" -max_len=512 -timeout=30 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "${parallel[@]}" "$@" "$corpus"
