// The libpmem2 media layer: what OpenMedia accepts and refuses, the namespace
// lock, growing image files, and that every kind of store reaches the file,
// under each store granularity libpmem2 can be forced to.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "nvfs/media.hpp"
#include "skip_count.hpp"

namespace nvfs {
namespace {

using test::DecoyFuseMount;
using test::FileSize;
using test::MakeFile;
using test::PathExists;
using test::ReadFile;
using test::RunInChild;
using test::TempPath;

constexpr uint64_t kMiB = 1024 * 1024;
constexpr int kChildAborted = 1000 + SIGABRT;

MediaOptions ReadOnly() {
  MediaOptions o;
  o.read_only = true;
  return o;
}

MediaOptions Writable() { return MediaOptions{}; }

// Sets (or, given nullptr, unsets) PMEM2_FORCE_GRANULARITY for the life of
// the object, then restores what was there, so a failing test does not leak it
// into the next one or into a program a test runs.
class ForcedGranularity {
 public:
  explicit ForcedGranularity(const char* value) {
    if (const char* old = std::getenv(kVar)) saved_ = old;
    if (value != nullptr) {
      setenv(kVar, value, 1);
    } else {
      unsetenv(kVar);
    }
  }
  ~ForcedGranularity() {
    if (saved_) {
      setenv(kVar, saved_->c_str(), 1);
    } else {
      unsetenv(kVar);
    }
  }
  ForcedGranularity(const ForcedGranularity&) = delete;
  ForcedGranularity& operator=(const ForcedGranularity&) = delete;

 private:
  static constexpr const char* kVar = "PMEM2_FORCE_GRANULARITY";
  std::optional<std::string> saved_;
};

// Runs `body` in a child with stderr closed and returns how it ended: the
// media layer's "BUG" line would only clutter the test log.
int RunQuietlyInChild(const std::function<void()>& body) {
  return RunInChild([&] {
    if (std::freopen("/dev/null", "w", stderr) == nullptr) return 253;
    body();
    return 0;
  });
}

// For a child process: the OpenMedia error code, or `wrong_message` when the
// message lacks `must_contain`, or 0 when it opened.
int OpenErrorCode(const std::string& path, const MediaOptions& options,
                  const std::string& must_contain, int wrong_message = 200) {
  auto media = OpenMedia(path, options);
  if (media.ok()) return 0;
  if (media.error().message.find(must_contain) == std::string::npos) return wrong_message;
  return media.error().code;
}

// Opens `path` while `holder` is closed 300 ms later on another thread: the
// open must wait for it and then succeed. The new holder.
std::unique_ptr<Media> OpenAfterRelease(const std::string& path, const MediaOptions& options,
                                        std::unique_ptr<Media>& holder) {
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    holder.reset();  // closes: the lock goes
  });
  const auto from = std::chrono::steady_clock::now();
  auto next = OpenMedia(path, options);
  const auto waited = std::chrono::steady_clock::now() - from;
  releaser.join();
  INFO((next.ok() ? std::string("ok") : next.error().message));
  REQUIRE(next.ok());
  CHECK(waited >= std::chrono::milliseconds(250));
  return std::move(next.value());
}

// ---------------------------------------------------------------------------
// What OpenMedia refuses
// ---------------------------------------------------------------------------

TEST_CASE("OpenMedia: a missing path is ENOENT and named", "[media]") {
  TempPath missing("missing");
  for (const MediaOptions& options : {ReadOnly(), Writable()}) {
    auto media = OpenMedia(missing.path(), options);
    REQUIRE_FALSE(media.ok());
    CHECK(media.error().code == ENOENT);
    CHECK_THAT(media.error().message, Catch::Contains(missing.path()));
  }
  CHECK_FALSE(PathExists(missing.path()));  // nothing was created
}

TEST_CASE("OpenMedia: a directory is ENODEV", "[media]") {
  TempPath dir("dir");
  REQUIRE(mkdir(dir.path().c_str(), 0755) == 0);
  for (const MediaOptions& options : {ReadOnly(), Writable()}) {
    auto media = OpenMedia(dir.path(), options);
    REQUIRE_FALSE(media.ok());
    CHECK(media.error().code == ENODEV);
    CHECK_THAT(media.error().message, Catch::Contains(dir.path()));
  }
  MediaOptions grow;
  grow.grow_to = kMiB;
  CHECK(OpenMedia(dir.path(), grow).code() == ENODEV);
}

TEST_CASE("OpenMedia: a FIFO is ENODEV and does not block", "[media]") {
  TempPath fifo("fifo");
  REQUIRE(mkfifo(fifo.path().c_str(), 0644) == 0);
  // In a child with a timer: opening a FIFO with no writer would block for
  // ever, and a hang must fail the test rather than stall the suite.
  CHECK(RunInChild([&] { return OpenErrorCode(fifo.path(), ReadOnly(), fifo.path()); }, 5) ==
        ENODEV);
  CHECK(RunInChild([&] { return OpenErrorCode(fifo.path(), Writable(), fifo.path()); }, 5) ==
        ENODEV);
}

TEST_CASE("OpenMedia: /dev/null is refused cleanly", "[media]") {
  // A character device, but not a DAX one: libpmem2 must refuse it, and we
  // must turn that into an error rather than crash.
  const int ro = RunInChild([] { return OpenErrorCode("/dev/null", ReadOnly(), "/dev/null"); });
  INFO("read-only open of /dev/null ended with " << ro);
  CHECK(ro == ENODEV);
}

TEST_CASE("OpenMedia: a namespace smaller than min_size is ENOSPC naming the minimum",
          "[media]") {
  TempPath image("small");
  MakeFile(image.path(), 64 * 1024);
  MediaOptions options = ReadOnly();
  options.min_size = 3 * kMiB;
  auto media = OpenMedia(image.path(), options);
  REQUIRE_FALSE(media.ok());
  CHECK(media.error().code == ENOSPC);
  CHECK_THAT(media.error().message, Catch::Contains(std::to_string(3 * kMiB)));
  CHECK_THAT(media.error().message, Catch::Contains(image.path()));

  options.min_size = 64 * 1024;  // exactly enough
  CHECK(OpenMedia(image.path(), options).ok());

}

// Regression: with no min_size, a file shorter than a page was refused with
// "nvfs needs at least 0 bytes".
TEST_CASE("OpenMedia: less than a page is ENOSPC with a true minimum", "[media]") {
  TempPath image("tiny");
  for (uint64_t size : {uint64_t{0}, uint64_t{3000}}) {
    MakeFile(image.path(), size, size ? 't' : 0);
    auto media = OpenMedia(image.path(), ReadOnly());
    INFO("size " << size);
    REQUIRE_FALSE(media.ok());
    CHECK(media.error().code == ENOSPC);
    CHECK_THAT(media.error().message, Catch::Contains(std::to_string(size) + " bytes"));
    CHECK_THAT(media.error().message, !Catch::Contains("at least 0 bytes"));
    CHECK_THAT(media.error().message, Catch::Contains("at least 4096 bytes"));
  }
}

TEST_CASE("OpenMedia: no permission is EACCES", "[media]") {
  TempPath image("private");
  MakeFile(image.path(), kMiB);
  REQUIRE(chown(image.path().c_str(), 0, 0) == 0);
  REQUIRE(chmod(image.path().c_str(), 0600) == 0);
  constexpr int kCannotDrop = 251;
  for (bool read_only : {true, false}) {
    const int code = RunInChild([&] {
      // Become nobody for good: supplementary groups, then gid, then uid.
      if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
          setresuid(65534, 65534, 65534) != 0) {
        return kCannotDrop;
      }
      MediaOptions options;
      options.read_only = read_only;
      return OpenErrorCode(image.path(), options, "permission denied");
    });
    INFO((read_only ? "read-only" : "writable") << " open as uid 65534 ended with " << code);
    if (code == kCannotDrop) {
      WARN("cannot switch to uid 65534 here; permission test not run");
      continue;
    }
    CHECK(code == EACCES);
  }
}

// ---------------------------------------------------------------------------
// The lock
// ---------------------------------------------------------------------------

TEST_CASE("OpenMedia: a writer excludes every other opener", "[media][lock]") {
  TempPath image("lock");
  MakeFile(image.path(), kMiB);
  auto first = OpenMedia(image.path(), Writable());
  REQUIRE(first.ok());

  auto second = OpenMedia(image.path(), Writable());
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().code == EBUSY);
  CHECK_THAT(second.error().message, Catch::Contains(image.path()));
  CHECK_THAT(second.error().message, Catch::Contains("in use"));

  auto reader = OpenMedia(image.path(), ReadOnly());
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.error().code == EBUSY);

  // Another process is refused the same way.
  CHECK(RunInChild([&] { return OpenErrorCode(image.path(), Writable(), "in use"); }) == EBUSY);
  CHECK(RunInChild([&] { return OpenErrorCode(image.path(), ReadOnly(), "in use"); }) == EBUSY);

  // Without the lock (for tools that know what they do) the open succeeds.
  MediaOptions unlocked = ReadOnly();
  unlocked.lock = false;
  CHECK(OpenMedia(image.path(), unlocked).ok());

  first->reset();
  auto again = OpenMedia(image.path(), Writable());
  CHECK(again.ok());
}

TEST_CASE("OpenMedia: readers share, and keep writers out", "[media][lock]") {
  TempPath image("shared");
  MakeFile(image.path(), kMiB);
  auto a = OpenMedia(image.path(), ReadOnly());
  auto b = OpenMedia(image.path(), ReadOnly());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(OpenMedia(image.path(), Writable()).code() == EBUSY);
  a->reset();
  CHECK(OpenMedia(image.path(), Writable()).code() == EBUSY);  // b still reads
  b->reset();
  CHECK(OpenMedia(image.path(), Writable()).ok());
}

// ---------------------------------------------------------------------------
// Growing image files
// ---------------------------------------------------------------------------

TEST_CASE("OpenMedia: grow_to creates a missing file", "[media][grow]") {
  TempPath image("create");
  MediaOptions options;
  options.grow_to = 2 * kMiB;
  auto media = OpenMedia(image.path(), options);
  REQUIRE(media.ok());
  CHECK((*media)->size() == 2 * kMiB);
  CHECK_FALSE((*media)->read_only());
  CHECK((*media)->path() == image.path());
  CHECK(FileSize(image.path()) == 2 * kMiB);

  // Read-only opens never create.
  TempPath other("nocreate");
  MediaOptions ro = ReadOnly();
  ro.grow_to = kMiB;
  CHECK(OpenMedia(other.path(), ro).code() == ENOENT);
  CHECK_FALSE(PathExists(other.path()));
}

// The namespace is the boundary: an image created for nvfs is the owner's
// alone, whatever the umask; a file that exists keeps the mode it was given.
TEST_CASE("OpenMedia: grow_to creates the file 0600 even under umask 0, and keeps an existing "
          "file's mode", "[media][grow][namespace]") {
  TempPath created("create-mode");
  TempPath existing("keep-mode");
  MakeFile(existing.path(), 0);
  REQUIRE(chmod(existing.path().c_str(), 0640) == 0);
  const mode_t saved = umask(0);
  MediaOptions options;
  options.grow_to = 2 * kMiB;
  const bool created_ok = OpenMedia(created.path(), options).ok();
  const bool existing_ok = OpenMedia(existing.path(), options).ok();
  umask(saved);
  REQUIRE(created_ok);
  REQUIRE(existing_ok);
  struct stat st;
  REQUIRE(stat(created.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  REQUIRE(stat(existing.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0640);
  CHECK(FileSize(existing.path()) == 2 * kMiB);
}

TEST_CASE("OpenMedia: grow_to extends a short file and keeps its bytes", "[media][grow]") {
  TempPath image("extend");
  MakeFile(image.path(), 64 * 1024, 'x');
  MediaOptions options;
  options.grow_to = 3 * kMiB;
  {
    auto media = OpenMedia(image.path(), options);
    REQUIRE(media.ok());
    CHECK((*media)->size() == 3 * kMiB);
    const std::byte* base = (*media)->base();
    CHECK(base[0] == std::byte{'x'});
    CHECK(base[64 * 1024 - 1] == std::byte{'x'});
    CHECK(base[64 * 1024] == std::byte{0});
    CHECK(base[3 * kMiB - 1] == std::byte{0});
  }
  CHECK(FileSize(image.path()) == 3 * kMiB);
}

TEST_CASE("OpenMedia: grow_to never shrinks", "[media][grow]") {
  TempPath image("noshrink");
  MakeFile(image.path(), 4 * kMiB, 'y');
  MediaOptions options;
  options.grow_to = kMiB;
  {
    auto media = OpenMedia(image.path(), options);
    REQUIRE(media.ok());
    CHECK((*media)->size() == 4 * kMiB);
    CHECK((*media)->base()[4 * kMiB - 1] == std::byte{'y'});
  }
  CHECK(FileSize(image.path()) == 4 * kMiB);
}

TEST_CASE("OpenMedia: the mapping covers whole pages of the file", "[media]") {
  TempPath image("unaligned");
  MakeFile(image.path(), kMiB + 100, 'z');
  auto media = OpenMedia(image.path(), ReadOnly());
  REQUIRE(media.ok());
  CHECK((*media)->size() == kMiB);
  CHECK((*media)->read_only());
  CHECK((*media)->base()[kMiB - 1] == std::byte{'z'});
}

// ---------------------------------------------------------------------------
// Stores
// ---------------------------------------------------------------------------

struct GranularityCase {
  const char* env;  // PMEM2_FORCE_GRANULARITY, or nullptr for none
  Granularity expected;
};

TEST_CASE("Media stores reach the mapping and the file", "[media][store]") {
  // /dev/shm is not DAX: libpmem2 reports page granularity, which on tmpfs
  // (nothing to msync to) the media takes as memory; forcing page keeps msync.
  const GranularityCase cases[] = {{nullptr, Granularity::kMemory},
                                   {"byte", Granularity::kByte},
                                   {"cache_line", Granularity::kCacheLine},
                                   {"page", Granularity::kPage}};
  for (const GranularityCase& c : cases) {
    const std::string name = c.env ? c.env : "default";
    SECTION("granularity " + name) {
      const ForcedGranularity forced(c.env);
      TempPath image("store-" + name);
      MediaOptions options;
      options.grow_to = kMiB;
      auto opened = OpenMedia(image.path(), options);
      REQUIRE(opened.ok());
      Media& media = **opened;
      INFO("libpmem2 reports " << GranularityName(media.granularity()));
      CHECK(media.granularity() == c.expected);
      CHECK(media.bytes_stored() == 0);

      const char hello[] = "hello, pmem";
      media.Store(100, hello, sizeof hello);
      media.Store64(4096, 0x0123456789ABCDEFull);
      media.Store64(kMiB - 8, 0xFEEDFACECAFEBEEFull);  // the last word
      media.Fill(8192, 0x5A, 3000);
      std::vector<uint8_t> bulk(10000);
      for (size_t i = 0; i < bulk.size(); ++i) bulk[i] = static_cast<uint8_t>(i * 7 + 1);
      media.StoreFlush(65536 + 3, bulk.data(), bulk.size());  // unaligned start
      media.Persist(100, sizeof hello);
      media.Persist(4096, 8);
      media.Persist(kMiB - 8, 8);
      media.Flush(8192, 3000);
      media.Flush(0, 0);  // an empty flush is allowed
      media.Drain();
      CHECK(media.bytes_stored() == sizeof hello + 8 + 8 + 3000 + bulk.size());

      // Visible through base() at once.
      const std::byte* base = media.base();
      CHECK(std::memcmp(base + 100, hello, sizeof hello) == 0);
      uint64_t word;
      std::memcpy(&word, base + 4096, 8);
      CHECK(word == 0x0123456789ABCDEFull);
      CHECK(base[8191] == std::byte{0});
      CHECK(base[8192] == std::byte{0x5A});
      CHECK(base[8192 + 2999] == std::byte{0x5A});
      CHECK(base[8192 + 3000] == std::byte{0});
      CHECK(std::memcmp(base + 65536 + 3, bulk.data(), bulk.size()) == 0);

      // And in the file once the mapping is gone.
      opened->reset();
      const std::vector<char> file = ReadFile(image.path());
      REQUIRE(file.size() == kMiB);
      CHECK(std::memcmp(file.data() + 100, hello, sizeof hello) == 0);
      std::memcpy(&word, file.data() + 4096, 8);
      CHECK(word == 0x0123456789ABCDEFull);
      std::memcpy(&word, file.data() + kMiB - 8, 8);
      CHECK(word == 0xFEEDFACECAFEBEEFull);
      for (size_t i = 0; i < 3000; ++i) REQUIRE(file[8192 + i] == 0x5A);
      CHECK(file[8192 + 3000] == 0);
      CHECK(std::memcmp(file.data() + 65536 + 3, bulk.data(), bulk.size()) == 0);
      // Nothing else was touched.
      size_t nonzero = 0;
      for (char ch : file) nonzero += ch != 0;
      size_t expected_nonzero = sizeof hello - 1 + 3000 + bulk.size() + 8 + 8;
      for (uint8_t b : bulk) expected_nonzero -= b == 0;
      CHECK(nonzero == expected_nonzero);
    }
  }
}

TEST_CASE("Media: a read-only mapping shows the file", "[media][store]") {
  TempPath image("ro");
  MakeFile(image.path(), kMiB);
  const char text[] = "written by the test";
  test::WriteAt(image.path(), 12345, text, sizeof text);
  auto media = OpenMedia(image.path(), ReadOnly());
  REQUIRE(media.ok());
  CHECK((*media)->size() == kMiB);
  CHECK(std::memcmp((*media)->base() + 12345, text, sizeof text) == 0);
}

TEST_CASE("Media: stores outside the rules abort instead of writing", "[media][store]") {
  TempPath image("abort");
  MediaOptions options;
  options.grow_to = kMiB;
  auto writable = OpenMedia(image.path(), options);
  REQUIRE(writable.ok());
  Media& media = **writable;
  const uint64_t x = 1;
  // Each in a child: the process must die with SIGABRT, not scribble.
  CHECK(RunQuietlyInChild([&] { media.Store(kMiB - 4, &x, 8); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { media.Store(kMiB, &x, 1); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { media.Store(UINT64_MAX - 2, &x, 8); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { media.Fill(kMiB / 2, 0, kMiB); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { media.Store64(12, 1); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { media.Flush(kMiB - 1, 2); }) == kChildAborted);
  // The boundary itself is fine.
  CHECK(RunQuietlyInChild([&] { media.Store(kMiB - 8, &x, 8); }) == 0);
  writable->reset();
  // The in-bounds store above, made by the child through the shared mapping,
  // is the only change.
  const std::vector<char> file = ReadFile(image.path());
  REQUIRE(file.size() == kMiB);
  CHECK(file[kMiB - 8] == 1);
  size_t nonzero = 0;
  for (char ch : file) nonzero += ch != 0;
  CHECK(nonzero == 1);

  auto ro = OpenMedia(image.path(), ReadOnly());
  REQUIRE(ro.ok());
  Media& read_only = **ro;
  CHECK(RunQuietlyInChild([&] { read_only.Store(0, &x, 1); }) == kChildAborted);
  CHECK(RunQuietlyInChild([&] { read_only.Fill(0, 0, 1); }) == kChildAborted);
}

// ---------------------------------------------------------------------------
// Who else can read the namespace
// ---------------------------------------------------------------------------

TEST_CASE("NamespaceExposure: the bits of every other user, never the group's", "[media][namespace]") {
  TempPath image("exposure");
  MakeFile(image.path(), kMiB);
  const std::string& p = image.path();
  const std::string fix = " every file in it whatever its permissions; chmod o-rw " + p;
  struct Case {
    mode_t mode;
    std::string warning;
  };
  const Case cases[] = {
      {0600, ""},
      {0640, ""},
      {0660, ""},
      {0400, ""},
      {0604, p + " can be read by every user, who can then read" + fix},
      {0644, p + " can be read by every user, who can then read" + fix},
      {0602, p + " can be written by every user, who can then change" + fix},
      {0666, p + " can be read and written by every user, who can then read and change" + fix},
      {0605, p + " can be read by every user, who can then read" + fix},
  };
  for (const Case& c : cases) {
    INFO("mode 0" << std::oct << c.mode);
    REQUIRE(chmod(p.c_str(), c.mode) == 0);
    CHECK(NamespaceExposure(p) == c.warning);
  }
  // Nothing to say about what cannot be stat'ed: opening it says why.
  CHECK(NamespaceExposure(p + ".missing").empty());
  // A device node: its own mode (/dev/null is 0666).
  struct stat st;
  if (stat("/dev/null", &st) == 0 && (st.st_mode & 0006) == 0006) {
    CHECK_THAT(NamespaceExposure("/dev/null"),
               Catch::StartsWith("/dev/null can be read and written by every user"));
  }
}

// Pasted into a shell as it is, the advice works on a path with a space
// and a quote in it.
TEST_CASE("NamespaceExposure: the chmod it advises can be pasted into a shell",
          "[media][namespace]") {
  TempPath dir("exposure dir");
  REQUIRE(mkdir(dir.path().c_str(), 0700) == 0);
  const std::string p = dir.path() + "/it's.img";
  MakeFile(p, kMiB);
  REQUIRE(chmod(p.c_str(), 0664) == 0);
  const std::string warning = NamespaceExposure(p);
  const size_t advice = warning.rfind("; chmod o-rw ");
  REQUIRE(advice != std::string::npos);
  const test::RunResult pasted = test::RunShell(warning.substr(advice + 2));
  INFO(warning << "\n" << pasted.out);
  CHECK(pasted.exit_code == 0);
  CHECK(NamespaceExposure(p).empty());
  struct stat st;
  REQUIRE(stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0660);  // the group's bits stay
  unlink(p.c_str());
}

TEST_CASE("GranularityName names each granularity", "[media]") {
  CHECK(std::string(GranularityName(Granularity::kByte)) == "byte");
  CHECK(std::string(GranularityName(Granularity::kCacheLine)) == "cache line");
  CHECK(std::string(GranularityName(Granularity::kPage)) == "page");
  CHECK(std::string(GranularityName(Granularity::kMemory)) == "memory (tmpfs)");
}

// Issue 12.5: a sparse image is backed before anything stores into it.
TEST_CASE("Media::Back: a sparse image is backed in chunks, remembered; a full one is not",
          "[media]") {
  TempPath image("sparse");
  {
    MakeFile(image.path(), 0);
    MediaOptions options;
    options.grow_to = 16 * kMiB;  // ftruncate: all holes
    auto media = OpenMedia(image.path(), options);
    REQUIRE(media.ok());
    Media& m = **media;
    CHECK(m.HostAvailable() != Media::kBackedWhole);
    CHECK_FALSE(m.Backed(4 * kMiB, 4096));
    CHECK(m.BackedBytes() == 0);
    REQUIRE(m.Back(4 * kMiB + 4096, 4096).ok());
    CHECK(m.Backed(4 * kMiB, Media::kBackChunk));  // the whole aligned chunk
    CHECK_FALSE(m.Backed(6 * kMiB, 4096));
    CHECK(m.BackedBytes() == Media::kBackChunk);
    struct stat st;
    REQUIRE(stat(image.path().c_str(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 >= Media::kBackChunk);
    CHECK(static_cast<uint64_t>(st.st_size) == 16 * kMiB);  // KEEP_SIZE
    m.Fill(8 * kMiB, 'y', Media::kBackChunk);  // one chunk of data, stored
    m.Persist(8 * kMiB, Media::kBackChunk);
  }
  {
    // Reopened: a chunk holding data is found backed (SEEK_DATA), holes
    // are not. (A chunk only fallocated is a hole to SEEK_DATA on tmpfs:
    // it is backed again at its first use, at the cost of one fallocate.)
    auto media = OpenMedia(image.path(), MediaOptions{});
    REQUIRE(media.ok());
    CHECK((*media)->Backed(8 * kMiB, Media::kBackChunk));
    CHECK_FALSE((*media)->Backed(0, 4096));
    CHECK((*media)->Intact());
  }
  {
    // Without holes: backed whole, and Back costs nothing.
    MakeFile(image.path(), 4 * kMiB, 'z');
    auto media = OpenMedia(image.path(), MediaOptions{});
    REQUIRE(media.ok());
    CHECK((*media)->HostAvailable() == Media::kBackedWhole);
    CHECK((*media)->Backed(0, 4 * kMiB));
    CHECK((*media)->bad_ranges().empty());  // a tmpfs file has no bad block list
  }
}


// Issue 12.6: a load or store that faults in the mapping (here: past the
// end of an image file cut short under it, a SIGBUS as a poisoned pmem page
// gives) fails the innermost recovery point; outside every point the page
// is replaced by one that reads as all ones and counts as lost.
TEST_CASE("Media errors: a fault fails its recovery point; outside one the page is lost",
          "[media][fault]") {
  TempPath image("cut");
  MakeFile(image.path(), 1 * kMiB, 'a');
  auto opened = OpenMedia(image.path(), MediaOptions{});
  REQUIRE(opened.ok());
  Media& m = **opened;
  REQUIRE(truncate(image.path().c_str(), 256 * 1024) == 0);
  const auto load = [&](uint64_t offset) {
    return *reinterpret_cast<const volatile uint64_t*>(m.base() + offset);
  };
  const uint64_t errors_before = MediaErrorCount();

  CHECK(load(4096) == 0x6161616161616161);  // before the cut: untouched
  uint64_t seen = 0;
  CHECK_FALSE(RunFaultGuarded([&] { seen = load(512 * 1024); }));
  CHECK(MediaErrorCount() == errors_before + 1);
  CHECK(LastMediaErrorOffset() == 512 * 1024);
  CHECK(m.LostPages() == 0);  // a point took it: nothing replaced
  CHECK_FALSE(m.Intact());    // the file is shorter than the mapping

  // Outside every point: the page reads as ones from then on, and a store
  // into it goes nowhere else.
  CHECK(load(768 * 1024 + 8) == ~uint64_t{0});
  CHECK(m.LostPages() == 1);
  CHECK(MediaErrorCount() == errors_before + 2);
  m.Store64(900 * 1024, 42);  // a store into another lost page
  CHECK(m.LostPages() == 2);
  CHECK(load(900 * 1024) == 42);
  CHECK(load(900 * 1024 + 8) == ~uint64_t{0});
  // A point around a page already replaced does not fault any more; a
  // point around one still missing still does.
  CHECK(RunFaultGuarded([&] { seen = load(768 * 1024); }));
  CHECK(seen == ~uint64_t{0});
  CHECK_FALSE(RunFaultGuarded([&] { seen = load(512 * 1024 + 64); }));
  // The recovery points nest: the inner one takes the fault, the outer
  // goes on.
  bool inner = true;
  CHECK(RunFaultGuarded([&] { inner = RunFaultGuarded([&] { seen = load(600 * 1024); }); }));
  CHECK_FALSE(inner);
  CHECK(load(4096) == 0x6161616161616161);  // the surviving part is intact
}

// Issue 14.3: an opener that finds the namespace locked by a holder that
// is shutting down (EndService) waits for it; one held by a live holder is
// refused at once.
TEST_CASE("OpenMedia: waits for a holder that is releasing the namespace, not for a live one",
          "[media][lock]") {
  TempPath image("release");
  MakeFile(image.path(), 1 * kMiB);
  MediaOptions options;
  options.release_wait_ms = 5000;
  auto holder = OpenMedia(image.path(), options);
  REQUIRE(holder.ok());
  const auto started = std::chrono::steady_clock::now();
  auto refused = OpenMedia(image.path(), options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == EBUSY);
  CHECK(refused.error().message.find("in use") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));  // at once
  MediaOptions reader = options;
  reader.read_only = true;
  CHECK(OpenMedia(image.path(), reader).error().code == EBUSY);

  (*holder)->EndService();
  std::unique_ptr<Media> next = OpenAfterRelease(image.path(), options, *holder);

  // A holder that announced its end but does not let go: the wait is bounded.
  next->EndService();
  options.release_wait_ms = 200;
  auto stuck = OpenMedia(image.path(), options);
  REQUIRE_FALSE(stuck.ok());
  CHECK(stuck.error().code == EBUSY);
  CHECK(stuck.error().message.find("still in use") != std::string::npos);
}

// A device number that no FUSE mount has: that of the filesystem `path` is
// on (the tests' images are on /dev/shm, a tmpfs); no unique id.
MountName NoFuseMount(const std::string& path) {
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  return MountName{st.st_dev, 0};
}

// A daemon marks the namespace as served through its FUSE mount, by the
// mount's device number (ServeThroughMount); with no FUSE mount of that
// number in mountinfo (as after umount) an opener waits for the holder
// instead of refusing.
TEST_CASE("OpenMedia: a holder serving through a mount that is gone is waited for",
          "[media][lock]") {
  TempPath image("served");
  MakeFile(image.path(), 1 * kMiB);
  MediaOptions options;
  options.release_wait_ms = 5000;
  auto holder = OpenMedia(image.path(), options);
  REQUIRE(holder.ok());
  (*holder)->ServeThroughMount(NoFuseMount(image.path()));
  CHECK(FindServingMount(image.path()).code() == ENOENT);
  std::unique_ptr<Media> next = OpenAfterRelease(image.path(), options, *holder);
  // Its own mark is byte 0 again: a live holder that never served through
  // a mount is refused at once.
  auto refused = OpenMedia(image.path(), options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("in use") != std::string::npos);
}

// Issue 29 (3): the mount mark once said only "served through a mount", and
// openers looked for the mount by its source, which fsname= lets any user
// who may mount FUSE set to the image's path: with such a mount, a holder
// whose own mount was gone was refused at once instead of waited for. The
// mark now names the mount's device number. Several read-only holders each
// leave one (F_OFD_GETLK reports one lock of a range: all are found).
TEST_CASE("OpenMedia: mount marks name the mount by device number, never by its source",
          "[media][lock]") {
  TempPath image("marks");
  MakeFile(image.path(), 1 * kMiB);
  std::optional<DecoyFuseMount> decoy;
  if (geteuid() == 0) {
    decoy.emplace(image.path());  // a FUSE mount whose source is the image
    INFO(decoy->error());
    REQUIRE(decoy->mounted());
    REQUIRE(decoy->dev() != 0);
  } else {
    WARN("not root: no FUSE mount naming the image, and no live mount mark, are tried");
  }
  MediaOptions reader = ReadOnly();
  auto first = OpenMedia(image.path(), reader);
  auto second = OpenMedia(image.path(), reader);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  (*first)->ServeThroughMount(NoFuseMount(image.path()));
  (*second)->ServeThroughMount(NoFuseMount("/proc"));
  CHECK(FindServingMount(image.path()).code() == ENOENT);
  MediaOptions writer;
  writer.release_wait_ms = 300;
  const auto asked = std::chrono::steady_clock::now();
  auto waited = OpenMedia(image.path(), writer);
  REQUIRE_FALSE(waited.ok());
  CHECK(waited.error().message.find("still in use") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - asked >= std::chrono::milliseconds(250));
  if (!decoy) return;

  // A third holder whose mount is there: refused at once, and that mount
  // is the one FindServingMount gives.
  auto third = OpenMedia(image.path(), reader);
  REQUIRE(third.ok());
  (*third)->ServeThroughMount(MountName{decoy->dev(), 0});
  const auto again = std::chrono::steady_clock::now();
  auto refused = OpenMedia(image.path(), writer);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == EBUSY);
  CHECK(refused.error().message.find("still") == std::string::npos);
  CHECK(std::chrono::steady_clock::now() - again < std::chrono::milliseconds(250));
  Result<dev_t> found = FindServingMount(image.path());
  REQUIRE(found.ok());
  CHECK(*found == decoy->dev());
  // Its service over, the mark goes: waited for again.
  (*third)->EndService();
  CHECK(FindServingMount(image.path()).code() == ENOENT);
  CHECK(OpenMedia(image.path(), writer).error().message.find("still in use") !=
        std::string::npos);
}

// The kernel gives a FUSE mount's device number to the next mount as soon
// as the first is gone (the lowest free anonymous number): a holder whose
// mount was gone, marked by device number, was refused at once whenever
// another FUSE mount had come up meanwhile (the suite's own, running beside
// it). A mark by the mount's unique id (statmount(2), Linux 6.8) names that
// mount alone.
TEST_CASE("OpenMedia: a mount mark by unique id is not taken over by the next mount's "
          "device number", "[media][lock]") {
  if (geteuid() != 0) NVFS_SKIP("the FUSE mounts are made with mount(2), root only");
  TempPath image("reused");
  MakeFile(image.path(), 1 * kMiB);
  std::optional<DecoyFuseMount> first;
  first.emplace("nvfs-test-first");
  INFO(first->error());
  REQUIRE(first->mounted());
  const MountName served = first->name();
  if (served.unique_id == 0) NVFS_SKIP("this kernel gives no unique mount ids (before 6.8)");
  auto holder = OpenMedia(image.path(), ReadOnly());
  REQUIRE(holder.ok());
  (*holder)->ServeThroughMount(served);
  MediaOptions writer;
  writer.release_wait_ms = 300;
  // Served through a live mount: refused at once, and found.
  auto refused = OpenMedia(image.path(), writer);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("still") == std::string::npos);
  Result<dev_t> found = FindServingMount(image.path());
  REQUIRE(found.ok());
  CHECK(*found == served.dev);

  first.reset();  // the mount is gone, the holder has not let go
  DecoyFuseMount next("nvfs-test-next");
  REQUIRE(next.mounted());
  INFO("the next mount " << (next.dev() == served.dev ? "took" : "did not take")
                         << " the gone mount's device number");
  CHECK(next.name().unique_id != served.unique_id);
  CHECK(FindServingMount(image.path()).code() == ENOENT);
  const auto asked = std::chrono::steady_clock::now();
  auto waited = OpenMedia(image.path(), writer);
  REQUIRE_FALSE(waited.ok());
  CHECK(waited.error().message.find("still in use") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - asked >= std::chrono::milliseconds(250));
}

}  // namespace
}  // namespace nvfs
