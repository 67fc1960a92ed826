// The recording backend: a namespace in memory that models what survives a
// power failure, for the crash tests (doc/integrity.md, "How the crash suite
// checks the argument").
//
// It keeps two images and a log:
//  - the *volatile* image (base()): what loads see, changed by every store;
//  - the *durable* image (durable()): what a crash would leave, changed only
//    when a fence makes flushed lines durable;
//  - the *pending lines*: for every 64-byte line stored since the last fence,
//    its stores in program order (cut into aligned pieces of at most 8 bytes)
//    and how many of them a flush has covered;
//  - an event log of every store (offset and bytes), flush, fence and
//    operation mark.
//
// Crash model (x86 with ADR, as libpmem2 describes it): at a crash the media
// holds the durable image plus, for each pending line, an in-order PREFIX of
// that line's stores, whether flushed or not. A Flush followed by a Drain
// makes the flushed stores of each line durable; stores to a line after its
// flush stay pending. So the crash states between two fences are exactly the
// prefix choices available at the second one, and a test that enumerates them
// at every fence (the crash hook) covers every instant.
//
// At the end of every operation (EndOp of the outermost BeginOp) nothing may
// be pending, and the two images must be equal: a violation is recorded with
// the operation's name and the offending lines (violations()).
//
// Thread safety: every store, flush and fence takes one mutex, so concurrent
// callers are serialised (the model needs one program order per line). The
// operation checks assume operations do not overlap unless `concurrent` is
// set: then each thread's operations are tracked on their own, and an
// operation's end checks only the lines that thread stored. The crash hook
// runs with the mutex held and must not call back into this object except
// through the const accessors. The gate (set_gate) runs before every store,
// flush, fence and operation mark, outside the mutex: a test's scheduler
// parks the calling thread there to choose the global order of the media
// writes of several threads (tests/crash/crash_concurrent.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "nvfs/media.hpp"

namespace nvfs {

struct RecordingOptions {
  // Keep the durable image, the pending lines and the crash hook. Off: a plain
  // namespace in memory whose stores are durable at once (the cheap backend
  // for mounting crash images).
  bool record = true;
  // Keep the event log (needs record).
  bool keep_log = true;
  // Map the volatile image read-only except inside this object's own store
  // functions, so a stray write through a const_cast pointer faults (SIGSEGV).
  bool protect = false;
  // At each operation end, also compare the whole volatile image with the
  // durable one (catches stray writes when protect is off).
  bool compare_at_op_end = true;
  // Print a violation and abort the process instead of recording it.
  bool abort_on_violation = false;
  bool read_only = false;
  // Operations of several threads overlap: operation marks are kept per
  // thread, an operation's end checks that no line the same thread stored is
  // still pending, and compare_at_op_end is ignored (other threads' stores
  // are in flight).
  bool concurrent = false;
};

class RecordingMedia final : public Media {
 public:
  static constexpr uint64_t kLine = 64;

  // A namespace of `size` zero bytes.
  explicit RecordingMedia(uint64_t size, const RecordingOptions& options = {});
  // A namespace holding a copy of `image` (both images start equal to it).
  RecordingMedia(const void* image, uint64_t size, const RecordingOptions& options = {});
  ~RecordingMedia() override;
  RecordingMedia(const RecordingMedia&) = delete;
  RecordingMedia& operator=(const RecordingMedia&) = delete;

  void Store(uint64_t offset, const void* src, size_t len) override;
  void Store64(uint64_t offset, uint64_t value) override;
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override;
  void Fill(uint64_t offset, int byte, size_t len) override;
  void Flush(uint64_t offset, size_t len) override;
  void Drain() override;
  void StoreFlush(uint64_t offset, const void* src, size_t len) override;
  void BeginOp(const char* name) override;
  void EndOp() override;

  // Sets bytes in both images as if they had always been there: not a store,
  // not logged, not a crash point (building a crash image to mount).
  // REQUIRES: nothing pending on those lines.
  void Preload(uint64_t offset, const void* src, size_t len);

  const RecordingOptions& options() const { return options_; }
  // The durable image (base() when !record).
  const std::byte* durable() const { return options_.record ? durable_ : base_; }

  // --- The crash model ---------------------------------------------------

  // One store's bytes within one line: an aligned piece of 1..8 bytes.
  struct Piece {
    uint8_t offset;  // in the line
    uint8_t len;
    uint32_t thread;  // who stored it (ThreadTag)
    std::byte bytes[8];
  };
  // A small number naming the calling thread, unique in the process.
  static uint32_t ThreadTag();
  struct PendingLine {
    std::vector<Piece> writes;  // since the last fence, in program order
    size_t flushed = 0;         // writes [0, flushed) are durable at the next fence
  };
  // Lines stored since the last fence, by line offset. Stable only inside the
  // crash hook or between calls.
  const std::map<uint64_t, PendingLine>& pending() const { return pending_; }
  // The line at `line_offset` as a crash would leave it if the first `prefix`
  // of its pending writes (all of them past the end) had reached the media.
  void LineAfter(uint64_t line_offset, size_t prefix, std::byte out[kLine]) const;
  // Applies the first `prefix` writes of `line` to `out` (a copy of the line).
  static void ApplyWrites(const PendingLine& line, size_t prefix, std::byte out[kLine]);
  // The whole image a crash would leave: `prefixes[i]` writes of the i-th
  // pending line (in offset order) on top of the durable image.
  std::vector<std::byte> CrashImage(const std::vector<size_t>& prefixes) const;

  // Lines stored since construction or the last ResetTouched, by offset.
  const std::set<uint64_t>& touched() const { return touched_; }
  void ResetTouched() { touched_.clear(); }

  enum class PointKind { kFence, kOpEnd };
  struct CrashPoint {
    PointKind kind;
    uint64_t index;  // fences and op ends seen so far by this media, from 0
    const char* op;  // the operation in progress ("" outside any)
  };
  // Called at every fence before it takes effect, and at every operation end
  // after the check (nothing is pending then unless the check failed).
  using CrashHook = std::function<void(const RecordingMedia&, const CrashPoint&)>;
  void set_crash_hook(CrashHook hook) { hook_ = std::move(hook); }
  // Called first in every Store, Store64, Fill, Flush, Drain, BeginOp and
  // EndOp, without the mutex held. Set it while no other thread uses the
  // media.
  void set_gate(std::function<void()> gate) { gate_ = std::move(gate); }
  uint64_t crash_points() const { return points_; }

  // --- Operation checks ----------------------------------------------------
  struct Violation {
    std::string op;                 // the operation that ended (or began)
    std::string what;               // "left unflushed or unfenced", ...
    std::vector<uint64_t> offsets;  // the offending line offsets (at most 16)
    uint64_t count = 0;             // how many lines in all
    std::string Describe() const;
  };
  const std::vector<Violation>& violations() const { return violations_; }
  void ClearViolations() { violations_.clear(); }

  // --- The log -------------------------------------------------------------
  enum class EventKind { kStore, kFlush, kFence, kBeginOp, kEndOp };
  struct Event {
    EventKind kind;
    uint64_t offset = 0;  // stores and flushes
    uint64_t len = 0;
    size_t data = 0;      // stores: where their bytes start in the byte log
    std::string op;       // BeginOp: the name
  };
  const std::vector<Event>& log() const { return log_; }
  // The bytes a store event wrote.
  const std::byte* EventBytes(const Event& event) const { return log_bytes_.data() + event.data; }
  void ClearLog();

 private:
  void Init(const void* image, uint64_t size);
  void RecordStore(uint64_t offset, const std::byte* bytes, size_t len);
  void WriteVolatile(uint64_t offset, const void* src, size_t len);
  void FillVolatile(uint64_t offset, int byte, size_t len);
  void Unprotect(uint64_t offset, size_t len);
  void Protect(uint64_t offset, size_t len);
  void CheckOpEnd(const std::string& op);
  void CheckThreadOpEnd(const std::string& op, uint32_t thread, const char* what);
  void Gate() const {
    if (gate_) gate_();
  }
  void AddViolation(Violation v);

  RecordingOptions options_;
  size_t mapped_ = 0;               // bytes of the volatile mapping (whole pages)
  std::byte* durable_ = nullptr;    // when record: a mapping of mapped_ bytes

  std::mutex mu_;  // serialises everything below and the stores
  std::map<uint64_t, PendingLine> pending_;
  std::set<uint64_t> touched_;
  CrashHook hook_;
  uint64_t points_ = 0;
  int op_depth_ = 0;
  std::string op_;  // outermost operation in progress
  struct ThreadOp {
    int depth = 0;
    std::string op;
  };
  std::map<uint32_t, ThreadOp> thread_ops_;  // when concurrent, by ThreadTag
  std::function<void()> gate_;
  std::vector<Violation> violations_;
  std::vector<Event> log_;
  std::vector<std::byte> log_bytes_;
};

}  // namespace nvfs
