// The namespace the corrupted-image suite mounts: an image in an anonymous
// mapping with an inaccessible guard region on each side (so a read just
// outside the image faults at once, with or without AddressSanitizer), and a
// Media over it that records every byte range it writes. The suite loads a
// seed image once, mutates a few bytes, runs a case, and puts back only what
// the mutation and the case changed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "nvfs/media.hpp"

namespace nvfs::fuzz {

struct Range {
  uint64_t offset;
  uint64_t len;
};

class Arena {
 public:
  // A zeroed image of `size` bytes (a multiple of the page size).
  explicit Arena(uint64_t size);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

  // Makes `image` the pristine copy and the current content. REQUIRES:
  // image.size() <= size(); the rest is zeroed.
  void Load(const std::vector<std::byte>& image);
  const std::vector<std::byte>& pristine() const { return pristine_; }

  // Changes bytes outside any Media (a mutation), remembered for Restore.
  void Poke(uint64_t offset, const void* src, size_t len);
  template <class T>
  void PokeValue(uint64_t offset, const T& value) {
    Poke(offset, &value, sizeof value);
  }
  template <class T>
  T Peek(uint64_t offset) const {
    T value;
    std::memcpy(&value, data_ + offset, sizeof value);
    return value;
  }

  // Puts back the pristine bytes of everything poked or stored since the
  // last Restore.
  void Restore();
  // True if the image holds exactly the pristine bytes with the pokes since
  // the last Restore applied: nothing else changed it, through a Media or not.
  bool Unchanged() const;
  // Maps the image read-only (false) or read-write: while read-only, any
  // write, even one that bypasses every Media, faults at once.
  void SetWritable(bool writable);
  // Puts back the pristine bytes of what a Media stored, keeping the pokes.
  void UndoStores();
  // Ranges poked since the last Restore (the mutation), in order; they may
  // overlap, and a poke may write the bytes that were there.
  const std::vector<Range>& poked() const { return poked_; }
  // Ranges written by a Media since the last Restore (not pokes).
  const std::vector<Range>& stored() const { return stored_; }
  uint64_t stores() const { return stored_.size(); }
  // Writes attempted through a read-only ArenaMedia (refused).
  uint64_t refused_writes() const { return refused_; }

 private:
  friend class ArenaMedia;
  std::byte* mapping_ = nullptr;  // guard, image, guard
  uint64_t mapping_size_ = 0;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  std::vector<std::byte> pristine_;
  std::vector<std::byte> expected_;  // pristine_ with the pokes applied
  std::vector<Range> poked_;
  std::vector<std::byte> poke_bytes_;  // what each poke wrote, in order
  std::vector<Range> stored_;
  uint64_t refused_ = 0;
};

// A Media over an Arena (which must outlive it). Stores go straight to the
// image and are recorded; flushes and fences do nothing (the suite needs no
// crash model). A read-only ArenaMedia refuses and counts every write.
class ArenaMedia final : public Media {
 public:
  ArenaMedia(Arena& arena, bool read_only, const char* path = "fuzz-image");

  void Store(uint64_t offset, const void* src, size_t len) override;
  void Store64(uint64_t offset, uint64_t value) override;
  bool CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) override;
  void Fill(uint64_t offset, int byte, size_t len) override;
  void Flush(uint64_t offset, size_t len) override;
  void Drain() override {}
  void StoreFlush(uint64_t offset, const void* src, size_t len) override {
    Store(offset, src, len);
  }
  // Called after every store (seed building: a crash image in the middle of
  // an operation is a copy of the arena taken here).
  void set_store_hook(std::function<void()> hook) { hook_ = std::move(hook); }

 private:
  bool Admit(uint64_t offset, size_t len);

  Arena& arena_;
  std::function<void()> hook_;
};

}  // namespace nvfs::fuzz
