// The recording backend (recording_media.hpp gives the model).
#include "testing/recording_media.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace nvfs {

namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Crash tests create thousands of same-sized images: mappings are kept for
// reuse, which saves the page faults of a fresh mapping.
class MappingPool {
 public:
  std::byte* Take(size_t bytes) {
    {
      std::lock_guard lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second == bytes) {
          std::byte* p = it->first;
          free_.erase(it);
          return p;
        }
      }
    }
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
      std::fprintf(stderr, "nvfs: recording media: cannot map %zu bytes: %s\n", bytes,
                   std::strerror(errno));
      std::abort();
    }
    return static_cast<std::byte*>(map);
  }
  // REQUIRES: the mapping is readable and writable again.
  void Give(std::byte* p, size_t bytes) {
    std::lock_guard lock(mu_);
    if (free_.size() < kKeep) {
      free_.emplace_back(p, bytes);
      return;
    }
    munmap(p, bytes);
  }

 private:
  static constexpr size_t kKeep = 8;
  std::mutex mu_;
  std::vector<std::pair<std::byte*, size_t>> free_;  // protected by mu_
};

MappingPool& Pool() {
  static MappingPool* pool = new MappingPool();  // never destroyed: used by static images
  return *pool;
}

}  // namespace

RecordingMedia::RecordingMedia(uint64_t size, const RecordingOptions& options)
    : options_(options) {
  Init(nullptr, size);
}

RecordingMedia::RecordingMedia(const void* image, uint64_t size, const RecordingOptions& options)
    : options_(options) {
  Init(image, size);
}

void RecordingMedia::Init(const void* image, uint64_t size) {
  if (!options_.record) options_.keep_log = false;
  const size_t page = PageSize();
  mapped_ = std::max<size_t>(page, (size + page - 1) / page * page);
  base_ = Pool().Take(mapped_);
  size_ = size;
  read_only_ = options_.read_only;
  granularity_ = Granularity::kCacheLine;
  path_ = "recording-media";
  if (image != nullptr) {
    std::memcpy(base_, image, size);
  } else {
    std::memset(base_, 0, mapped_);
  }
  if (options_.record) {
    durable_ = Pool().Take(mapped_);
    std::memcpy(durable_, base_, size);
  }
  if (options_.protect) Protect(0, size);
}

RecordingMedia::~RecordingMedia() {
  if (options_.protect) mprotect(base_, mapped_, PROT_READ | PROT_WRITE);
  Pool().Give(base_, mapped_);
  if (durable_ != nullptr) Pool().Give(durable_, mapped_);
}

// ---------------------------------------------------------------------------
// The volatile image
// ---------------------------------------------------------------------------

void RecordingMedia::Protect(uint64_t offset, size_t len) {
  if (!options_.protect || len == 0) return;
  const size_t page = PageSize();
  const uint64_t first = offset / page * page;
  const uint64_t end = (offset + len + page - 1) / page * page;
  mprotect(base_ + first, end - first, PROT_READ);
}

void RecordingMedia::Unprotect(uint64_t offset, size_t len) {
  if (!options_.protect || len == 0) return;
  const size_t page = PageSize();
  const uint64_t first = offset / page * page;
  const uint64_t end = (offset + len + page - 1) / page * page;
  if (mprotect(base_ + first, end - first, PROT_READ | PROT_WRITE) != 0) {
    std::fprintf(stderr, "nvfs: recording media: mprotect: %s\n", std::strerror(errno));
    std::abort();
  }
}

void RecordingMedia::WriteVolatile(uint64_t offset, const void* src, size_t len) {
  Unprotect(offset, len);
  std::memcpy(base_ + offset, src, len);
  Protect(offset, len);
}

void RecordingMedia::FillVolatile(uint64_t offset, int byte, size_t len) {
  Unprotect(offset, len);
  std::memset(base_ + offset, byte, len);
  Protect(offset, len);
}

// ---------------------------------------------------------------------------
// Stores, flushes and fences
// ---------------------------------------------------------------------------

// Cuts the store into aligned pieces of at most 8 bytes, appended to their
// lines' pending writes in program order (a prefix may end between pieces:
// an 8-byte aligned word is the unit the hardware never tears).
void RecordingMedia::RecordStore(uint64_t offset, const std::byte* bytes, size_t len) {
  if (options_.keep_log) {
    Event e{EventKind::kStore, offset, len, log_bytes_.size(), {}};
    log_bytes_.insert(log_bytes_.end(), bytes, bytes + len);
    log_.push_back(std::move(e));
  }
  uint64_t at = offset;
  const uint64_t end = offset + len;
  PendingLine* line = nullptr;
  uint64_t line_offset = ~uint64_t{0};
  while (at < end) {
    const uint64_t word_end = std::min(end, (at & ~uint64_t{7}) + 8);
    const uint64_t this_line = at & ~(kLine - 1);
    if (this_line != line_offset) {
      line_offset = this_line;
      line = &pending_[this_line];
      touched_.insert(this_line);
    }
    Piece piece;
    piece.thread = ThreadTag();
    piece.offset = static_cast<uint8_t>(at - this_line);
    piece.len = static_cast<uint8_t>(word_end - at);
    std::memcpy(piece.bytes, bytes + (at - offset), piece.len);
    line->writes.push_back(piece);
    at = word_end;
  }
}

uint32_t RecordingMedia::ThreadTag() {
  static std::atomic<uint32_t> next{1};
  thread_local const uint32_t tag = next.fetch_add(1, std::memory_order_relaxed);
  return tag;
}

void RecordingMedia::Store(uint64_t offset, const void* src, size_t len) {
  CheckWrite(offset, len);
  Gate();
  std::lock_guard lock(mu_);
  WriteVolatile(offset, src, len);
  CountStored(len);
  if (options_.record) RecordStore(offset, static_cast<const std::byte*>(src), len);
}

void RecordingMedia::Store64(uint64_t offset, uint64_t value) {
  CheckWrite(offset, 8);
  if (offset % 8 != 0) {
    std::fprintf(stderr, "nvfs: BUG: unaligned 8-byte store at %" PRIu64 "\n", offset);
    std::abort();
  }
  Gate();
  std::lock_guard lock(mu_);
  Unprotect(offset, 8);
  __atomic_store_n(reinterpret_cast<uint64_t*>(base_ + offset), value, __ATOMIC_RELAXED);
  Protect(offset, 8);
  CountStored(8);
  if (options_.record) RecordStore(offset, reinterpret_cast<const std::byte*>(&value), 8);
}

bool RecordingMedia::CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) {
  CheckWrite(offset, 8);
  if (offset % 8 != 0) {
    std::fprintf(stderr, "nvfs: BUG: unaligned 8-byte compare-and-swap at %" PRIu64 "\n", offset);
    std::abort();
  }
  Gate();
  std::lock_guard lock(mu_);
  Unprotect(offset, 8);
  const bool swapped = __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(base_ + offset),
                                                   expected, desired, false, __ATOMIC_ACQ_REL,
                                                   __ATOMIC_ACQUIRE);
  Protect(offset, 8);
  if (swapped) {
    CountStored(8);
    if (options_.record) RecordStore(offset, reinterpret_cast<const std::byte*>(&desired), 8);
  }
  return swapped;
}

void RecordingMedia::Fill(uint64_t offset, int byte, size_t len) {
  CheckWrite(offset, len);
  Gate();
  std::lock_guard lock(mu_);
  FillVolatile(offset, byte, len);
  CountStored(len);
  if (options_.record) RecordStore(offset, base_ + offset, len);
}

void RecordingMedia::StoreFlush(uint64_t offset, const void* src, size_t len) {
  Store(offset, src, len);
  Flush(offset, len);
}

void RecordingMedia::Flush(uint64_t offset, size_t len) {
  CheckWrite(offset, len);
  if (!options_.record || len == 0) return;
  Gate();
  std::lock_guard lock(mu_);
  if (options_.keep_log) log_.push_back({EventKind::kFlush, offset, len, 0, {}});
  const uint64_t first = offset & ~(kLine - 1);
  for (auto it = pending_.lower_bound(first); it != pending_.end() && it->first < offset + len;
       ++it) {
    it->second.flushed = it->second.writes.size();
  }
}

void RecordingMedia::Drain() {
  if (!options_.record) return;
  Gate();
  std::lock_guard lock(mu_);
  if (options_.keep_log) log_.push_back({EventKind::kFence, 0, 0, 0, {}});
  if (hook_) {
    const char* op = op_.c_str();
    if (options_.concurrent) {
      auto it = thread_ops_.find(ThreadTag());
      op = it == thread_ops_.end() ? "" : it->second.op.c_str();
    }
    hook_(*this, CrashPoint{PointKind::kFence, points_, op});
  }
  ++points_;
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingLine& line = it->second;
    for (size_t i = 0; i < line.flushed; ++i) {
      const Piece& piece = line.writes[i];
      std::memcpy(durable_ + it->first + piece.offset, piece.bytes, piece.len);
    }
    line.writes.erase(line.writes.begin(), line.writes.begin() + static_cast<long>(line.flushed));
    line.flushed = 0;
    it = line.writes.empty() ? pending_.erase(it) : std::next(it);
  }
}

void RecordingMedia::Preload(uint64_t offset, const void* src, size_t len) {
  CheckWrite(offset, len);
  std::lock_guard lock(mu_);
  WriteVolatile(offset, src, len);
  if (options_.record) std::memcpy(durable_ + offset, src, len);
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

std::string RecordingMedia::Violation::Describe() const {
  std::string out = "operation '" + op + "': " + std::to_string(count) + " line(s) " + what +
                    ", at offsets";
  char buf[32];
  for (uint64_t offset : offsets) {
    std::snprintf(buf, sizeof buf, " %" PRIu64, offset);
    out += buf;
  }
  if (count > offsets.size()) out += " ...";
  return out;
}

void RecordingMedia::AddViolation(Violation v) {
  if (options_.abort_on_violation) {
    std::fprintf(stderr, "nvfs: recording media: %s\n", v.Describe().c_str());
    std::abort();
  }
  violations_.push_back(std::move(v));
}

// REQUIRES: mu_ held.
void RecordingMedia::CheckOpEnd(const std::string& op) {
  if (!pending_.empty()) {
    Violation v{op, "left unflushed or unfenced", {}, pending_.size()};
    for (const auto& [offset, line] : pending_) {
      if (v.offsets.size() == 16) break;
      v.offsets.push_back(offset);
    }
    AddViolation(std::move(v));
    return;
  }
  if (options_.compare_at_op_end && std::memcmp(base_, durable_, size_) != 0) {
    Violation v{op, "differ between the volatile and durable images (a store that bypassed "
                    "the media layer?)", {}, 0};
    for (uint64_t line = 0; line < size_; line += kLine) {
      const uint64_t n = std::min<uint64_t>(kLine, size_ - line);
      if (std::memcmp(base_ + line, durable_ + line, n) != 0) {
        if (v.offsets.size() < 16) v.offsets.push_back(line);
        ++v.count;
      }
    }
    AddViolation(std::move(v));
  }
}

// REQUIRES: mu_ held.
void RecordingMedia::CheckThreadOpEnd(const std::string& op, uint32_t thread, const char* what) {
  Violation v{op, what, {}, 0};
  for (const auto& [offset, line] : pending_) {
    for (const Piece& piece : line.writes) {
      if (piece.thread != thread) continue;
      if (v.offsets.size() < 16) v.offsets.push_back(offset);
      ++v.count;
      break;
    }
  }
  if (v.count != 0) AddViolation(std::move(v));
}

void RecordingMedia::BeginOp(const char* name) {
  if (!options_.record) return;
  Gate();
  std::lock_guard lock(mu_);
  if (options_.keep_log) log_.push_back({EventKind::kBeginOp, 0, 0, 0, name});
  if (options_.concurrent) {
    const uint32_t thread = ThreadTag();
    ThreadOp& t = thread_ops_[thread];
    if (t.depth++ > 0) return;
    CheckThreadOpEnd(std::string("before ") + name, thread,
                     "stored by this thread left unflushed or unfenced outside any operation");
    t.op = name;
    return;
  }
  if (op_depth_++ > 0) return;
  if (!pending_.empty()) {
    Violation v{std::string("before ") + name, "left unflushed or unfenced outside any operation",
                {}, pending_.size()};
    for (const auto& [offset, line] : pending_) {
      if (v.offsets.size() == 16) break;
      v.offsets.push_back(offset);
    }
    AddViolation(std::move(v));
  }
  op_ = name;
}

void RecordingMedia::EndOp() {
  if (!options_.record) return;
  Gate();
  std::lock_guard lock(mu_);
  if (options_.keep_log) log_.push_back({EventKind::kEndOp, 0, 0, 0, {}});
  if (options_.concurrent) {
    const uint32_t thread = ThreadTag();
    auto it = thread_ops_.find(thread);
    if (it == thread_ops_.end() || it->second.depth == 0 || --it->second.depth > 0) return;
    const std::string op = std::move(it->second.op);
    thread_ops_.erase(it);
    CheckThreadOpEnd(op, thread, "stored by this thread left unflushed or unfenced");
    if (hook_) hook_(*this, CrashPoint{PointKind::kOpEnd, points_, op.c_str()});
    ++points_;
    return;
  }
  if (op_depth_ == 0 || --op_depth_ > 0) return;
  CheckOpEnd(op_);
  if (hook_) hook_(*this, CrashPoint{PointKind::kOpEnd, points_, op_.c_str()});
  ++points_;
  op_.clear();
}

// ---------------------------------------------------------------------------
// Crash images
// ---------------------------------------------------------------------------

void RecordingMedia::LineAfter(uint64_t line_offset, size_t prefix, std::byte out[kLine]) const {
  const uint64_t n = std::min<uint64_t>(kLine, size_ - line_offset);
  std::memcpy(out, durable() + line_offset, n);
  auto it = pending_.find(line_offset);
  if (it != pending_.end()) ApplyWrites(it->second, prefix, out);
}

void RecordingMedia::ApplyWrites(const PendingLine& line, size_t prefix, std::byte out[kLine]) {
  prefix = std::min(prefix, line.writes.size());
  for (size_t i = 0; i < prefix; ++i) {
    std::memcpy(out + line.writes[i].offset, line.writes[i].bytes, line.writes[i].len);
  }
}

std::vector<std::byte> RecordingMedia::CrashImage(const std::vector<size_t>& prefixes) const {
  std::vector<std::byte> image(durable(), durable() + size_);
  size_t i = 0;
  for (const auto& [offset, line] : pending_) {
    const size_t prefix = i < prefixes.size() ? prefixes[i] : 0;
    ++i;
    for (size_t w = 0; w < std::min(prefix, line.writes.size()); ++w) {
      const Piece& piece = line.writes[w];
      std::memcpy(image.data() + offset + piece.offset, piece.bytes, piece.len);
    }
  }
  return image;
}

void RecordingMedia::ClearLog() {
  std::lock_guard lock(mu_);
  log_.clear();
  log_bytes_.clear();
}

}  // namespace nvfs
