// The recording media backend: the crash model (volatile and durable images,
// per-line in-order prefixes), the operation-end checks, the log, the crash
// hook, write protection, and a whole filesystem running on it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>

#include <cstring>
#include <vector>

#include "helpers.hpp"
#include "nvfs/fs.hpp"
#include "nvfs/fsck.hpp"
#include "nvfs/mkfs.hpp"
#include "testing/recording_media.hpp"

namespace nvfs::test {
namespace {

constexpr uint64_t kSize = 1 << 16;

uint64_t DurableWord(const RecordingMedia& m, uint64_t offset) {
  uint64_t v;
  std::memcpy(&v, m.durable() + offset, 8);
  return v;
}

uint64_t VolatileWord(const RecordingMedia& m, uint64_t offset) {
  uint64_t v;
  std::memcpy(&v, m.base() + offset, 8);
  return v;
}

TEST_CASE("recording: a store is visible at once, durable after flush and fence",
          "[recording]") {
  RecordingMedia m(kSize);
  m.Store64(128, 7);
  CHECK(VolatileWord(m, 128) == 7);
  CHECK(DurableWord(m, 128) == 0);
  CHECK(m.pending().size() == 1);
  m.Drain();  // a fence alone makes nothing durable
  CHECK(DurableWord(m, 128) == 0);
  m.Flush(128, 8);
  CHECK(DurableWord(m, 128) == 0);
  m.Drain();
  CHECK(DurableWord(m, 128) == 7);
  CHECK(m.pending().empty());
}

TEST_CASE("recording: stores after a line's flush stay pending past the fence",
          "[recording]") {
  RecordingMedia m(kSize);
  m.Store64(0, 1);
  m.Flush(0, 8);
  m.Store64(8, 2);  // same line, after the flush
  m.Drain();
  CHECK(DurableWord(m, 0) == 1);
  CHECK(DurableWord(m, 8) == 0);
  REQUIRE(m.pending().size() == 1);
  CHECK(m.pending().at(0).writes.size() == 1);
  m.Persist(0, 64);
  CHECK(DurableWord(m, 8) == 2);
  CHECK(m.pending().empty());
}

TEST_CASE("recording: stores are cut into aligned words per line, in program order",
          "[recording]") {
  RecordingMedia m(kSize);
  std::vector<std::byte> bytes(70, std::byte{0xAB});
  m.Store(60, bytes.data(), bytes.size());  // lines 0, 64; words 56.., 64.., ...
  const auto& first = m.pending().at(0);
  REQUIRE(first.writes.size() == 1);
  CHECK(first.writes[0].offset == 60);
  CHECK(first.writes[0].len == 4);
  const auto& second = m.pending().at(64);
  CHECK(second.writes.size() == 8);  // 64..127, one piece per word
  const auto& third = m.pending().at(128);  // 60 + 70 = 130: two bytes here
  REQUIRE(third.writes.size() == 1);
  CHECK(third.writes[0].len == 2);
  CHECK(m.pending().size() == 3);
}

TEST_CASE("recording: crash images take an in-order prefix of each pending line",
          "[recording]") {
  RecordingMedia m(kSize);
  m.Store64(0, 1);
  m.Store64(0, 2);
  m.Store64(64, 3);
  REQUIRE(m.pending().size() == 2);
  auto none = m.CrashImage({0, 0});
  auto first_only = m.CrashImage({1, 0});
  auto all = m.CrashImage({2, 1});
  uint64_t v;
  std::memcpy(&v, none.data(), 8);
  CHECK(v == 0);
  std::memcpy(&v, first_only.data(), 8);
  CHECK(v == 1);
  std::memcpy(&v, all.data(), 8);
  CHECK(v == 2);
  std::memcpy(&v, all.data() + 64, 8);
  CHECK(v == 3);
  std::byte line[64];
  m.LineAfter(0, 1, line);
  std::memcpy(&v, line, 8);
  CHECK(v == 1);
}

TEST_CASE("recording: an operation that leaves a store unpersisted is reported by name and offset",
          "[recording]") {
  RecordingMedia m(kSize);
  m.BeginOp("good");
  m.Store64(0, 1);
  m.Persist(0, 8);
  m.EndOp();
  CHECK(m.violations().empty());

  m.BeginOp("forgets-the-fence");
  m.Store64(640, 1);
  m.Flush(640, 8);
  m.EndOp();
  REQUIRE(m.violations().size() == 1);
  CHECK(m.violations()[0].op == "forgets-the-fence");
  REQUIRE(m.violations()[0].offsets.size() == 1);
  CHECK(m.violations()[0].offsets[0] == 640);
  CHECK_THAT(m.violations()[0].Describe(), Catch::Contains("640"));
  m.ClearViolations();
  m.Drain();

  m.BeginOp("outer");
  m.BeginOp("inner");
  m.Store64(0, 5);
  m.EndOp();  // inner: not the end of the operation yet
  CHECK(m.violations().empty());
  m.Persist(0, 8);
  m.EndOp();
  CHECK(m.violations().empty());
}

TEST_CASE("recording: a write that bypasses the media shows at the operation end",
          "[recording]") {
  RecordingMedia m(kSize);
  const_cast<std::byte*>(m.base())[4096] = std::byte{1};  // the bug being caught
  m.BeginOp("stray");
  m.EndOp();
  REQUIRE(m.violations().size() == 1);
  CHECK(m.violations()[0].offsets.at(0) == 4096);
}

TEST_CASE("recording: with protect, a stray write faults and media stores do not",
          "[recording]") {
  RecordingOptions options;
  options.protect = true;
  const int ok = RunInChild([&] {
    RecordingMedia m(kSize, options);
    m.Store64(8, 1);
    m.Fill(100, 0x5A, 3000);
    m.Persist(0, 4096);
    return VolatileWord(m, 8) == 1 ? 0 : 1;
  });
  CHECK(ok == 0);
  const int faulted = RunInChild([&] {
    RecordingMedia m(kSize, options);
    const_cast<std::byte*>(m.base())[8] = std::byte{1};
    return 0;
  });
  CHECK(faulted == 1000 + SIGSEGV);
}

TEST_CASE("recording: the log holds every store, flush, fence and operation mark",
          "[recording]") {
  RecordingMedia m(kSize);
  m.BeginOp("op");
  const char text[] = "hello";
  m.Store(200, text, 5);
  m.Flush(200, 5);
  m.Drain();
  m.EndOp();
  using K = RecordingMedia::EventKind;
  const auto& log = m.log();
  REQUIRE(log.size() == 5);
  CHECK(log[0].kind == K::kBeginOp);
  CHECK(log[0].op == "op");
  CHECK(log[1].kind == K::kStore);
  CHECK(log[1].offset == 200);
  CHECK(std::memcmp(m.EventBytes(log[1]), text, 5) == 0);
  CHECK(log[2].kind == K::kFlush);
  CHECK(log[3].kind == K::kFence);
  CHECK(log[4].kind == K::kEndOp);
  m.ClearLog();
  CHECK(m.log().empty());
}

TEST_CASE("recording: the crash hook sees every fence and operation end", "[recording]") {
  RecordingMedia m(kSize);
  std::vector<std::pair<RecordingMedia::PointKind, size_t>> seen;
  m.set_crash_hook([&](const RecordingMedia& media, const RecordingMedia::CrashPoint& point) {
    seen.push_back({point.kind, media.pending().size()});
  });
  m.BeginOp("op");
  m.Store64(0, 1);
  m.Store64(64, 1);
  m.Persist(0, 128);
  m.EndOp();
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].first == RecordingMedia::PointKind::kFence);
  CHECK(seen[0].second == 2);
  CHECK(seen[1].first == RecordingMedia::PointKind::kOpEnd);
  CHECK(seen[1].second == 0);
  CHECK(m.crash_points() == 2);
}

TEST_CASE("recording: touched lines and preloaded bytes", "[recording]") {
  RecordingMedia m(kSize);
  const uint64_t v = 9;
  m.Preload(1024, &v, 8);
  CHECK(m.touched().empty());
  CHECK(DurableWord(m, 1024) == 9);
  m.Store64(2048, 1);
  m.Persist(2048, 8);
  CHECK(m.touched() == std::set<uint64_t>{2048});
  m.ResetTouched();
  CHECK(m.touched().empty());
}

TEST_CASE("recording: a whole filesystem runs on it, every operation persisted at its end",
          "[recording]") {
  RecordingOptions options;
  options.protect = true;
  auto media = std::make_unique<RecordingMedia>(8ull << 20, options);
  RecordingMedia* rec = media.get();
  MkfsOptions mkfs;
  mkfs.dir_hash_key = std::array<uint8_t, 16>{42};
  auto plan = PlanMkfs(media->size(), mkfs);
  REQUIRE(plan.ok());
  REQUIRE(WriteMkfs(*media, *plan).ok());
  auto fs = Filesystem::Mount(std::move(media), {});
  REQUIRE(fs.ok());
  Attr attr;
  auto file = (*fs)->Create(1, "f", 0644, O_RDWR, {}, &attr);
  REQUIRE(file.ok());
  std::vector<char> data(10000, 'x');
  REQUIRE((*fs)->Write(*file, 0, data.data(), data.size()).ok());
  (*fs)->Release(*file);
  REQUIRE((*fs)->Mkdir(1, "d", 0755, {}).ok());
  REQUIRE((*fs)->Unlink(1, "f").ok());
  REQUIRE((*fs)->Unmount().ok());
  for (const auto& v : rec->violations()) FAIL_CHECK(v.Describe());
  CHECK(rec->pending().empty());
  CHECK(std::memcmp(rec->base(), rec->durable(), rec->size()) == 0);
  std::string said;
  FsckReport report = CheckNamespace(*rec, RepairMode::kNone,
                                     [&](const std::string& line) { said += line + "\n"; });
  INFO(said);
  CHECK(report.exit_code == kFsckClean);
}

}  // namespace
}  // namespace nvfs::test
