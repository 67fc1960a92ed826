#include "arena_media.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace nvfs::fuzz {

namespace {
// Wide enough that a stray read a little outside the image faults.
constexpr uint64_t kGuard = 1 << 20;
}  // namespace

Arena::Arena(uint64_t size) : size_(size) {
  mapping_size_ = size + 2 * kGuard;
  void* p = mmap(nullptr, mapping_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("arena: mmap failed");
  mapping_ = static_cast<std::byte*>(p);
  data_ = mapping_ + kGuard;
  if (mprotect(data_, size_, PROT_READ | PROT_WRITE) != 0) {
    throw std::runtime_error("arena: mprotect failed");
  }
}

Arena::~Arena() { munmap(mapping_, mapping_size_); }

void Arena::Load(const std::vector<std::byte>& image) {
  if (image.size() > size_) throw std::runtime_error("arena: image too large");
  pristine_ = image;
  pristine_.resize(size_);
  expected_ = pristine_;
  std::memcpy(data_, pristine_.data(), size_);
  poked_.clear();
  poke_bytes_.clear();
  stored_.clear();
  refused_ = 0;
}

void Arena::Poke(uint64_t offset, const void* src, size_t len) {
  if (offset > size_ || len > size_ - offset) throw std::runtime_error("arena: poke outside");
  std::memcpy(data_ + offset, src, len);
  std::memcpy(expected_.data() + offset, src, len);
  poked_.push_back({offset, len});
  const auto* bytes = static_cast<const std::byte*>(src);
  poke_bytes_.insert(poke_bytes_.end(), bytes, bytes + len);
}

void Arena::Restore() {
  for (const std::vector<Range>* ranges : {&poked_, &stored_}) {
    for (const Range& r : *ranges) std::memcpy(data_ + r.offset, pristine_.data() + r.offset, r.len);
  }
  for (const Range& r : poked_) {
    std::memcpy(expected_.data() + r.offset, pristine_.data() + r.offset, r.len);
  }
  poked_.clear();
  poke_bytes_.clear();
  stored_.clear();
  refused_ = 0;
}

bool Arena::Unchanged() const { return std::memcmp(data_, expected_.data(), size_) == 0; }

void Arena::SetWritable(bool writable) {
  if (mprotect(data_, size_, writable ? PROT_READ | PROT_WRITE : PROT_READ) != 0) {
    throw std::runtime_error("arena: mprotect failed");
  }
}

void Arena::UndoStores() {
  for (const Range& r : stored_) std::memcpy(data_ + r.offset, pristine_.data() + r.offset, r.len);
  // Stores may have overwritten poked bytes: poke them again, in order.
  const std::byte* payload = poke_bytes_.data();
  for (const Range& r : poked_) {
    std::memcpy(data_ + r.offset, payload, r.len);
    payload += r.len;
  }
  stored_.clear();
  refused_ = 0;
}

ArenaMedia::ArenaMedia(Arena& arena, bool read_only, const char* path) : arena_(arena) {
  base_ = arena.data();
  size_ = arena.size();
  read_only_ = read_only;
  granularity_ = Granularity::kByte;
  path_ = path;
}

bool ArenaMedia::Admit(uint64_t offset, size_t len) {
  if (offset > size_ || len > size_ - offset) {
    std::fprintf(stderr, "fuzz: BUG: media write of %zu bytes at %" PRIu64 " outside the image\n",
                 len, offset);
    std::abort();
  }
  if (read_only_) {
    ++arena_.refused_;
    return false;
  }
  if (len != 0) arena_.stored_.push_back({offset, len});
  CountStored(len);
  return true;
}

void ArenaMedia::Store(uint64_t offset, const void* src, size_t len) {
  if (Admit(offset, len)) std::memcpy(base_ + offset, src, len);
  if (hook_) hook_();
}

void ArenaMedia::Store64(uint64_t offset, uint64_t value) {
  if (offset % 8 != 0) {
    std::fprintf(stderr, "fuzz: BUG: unaligned 8-byte store at %" PRIu64 "\n", offset);
    std::abort();
  }
  if (Admit(offset, 8)) std::memcpy(base_ + offset, &value, 8);
  if (hook_) hook_();
}

bool ArenaMedia::CompareExchange64(uint64_t offset, uint64_t* expected, uint64_t desired) {
  if (offset % 8 != 0) {
    std::fprintf(stderr, "fuzz: BUG: unaligned 8-byte compare-and-swap at %" PRIu64 "\n", offset);
    std::abort();
  }
  bool swapped = false;
  if (Admit(offset, 8)) {
    swapped = __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(base_ + offset), expected,
                                          desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  }
  if (hook_) hook_();
  return swapped;
}

void ArenaMedia::Fill(uint64_t offset, int byte, size_t len) {
  if (Admit(offset, len)) std::memset(base_ + offset, byte, len);
  if (hook_) hook_();
}

void ArenaMedia::Flush(uint64_t offset, size_t len) {
  if (offset > size_ || len > size_ - offset) {
    std::fprintf(stderr, "fuzz: BUG: flush of %zu bytes at %" PRIu64 " outside the image\n", len,
                 offset);
    std::abort();
  }
}

}  // namespace nvfs::fuzz
