// Names forced onto chosen hash values, for tests of hash collisions: the
// keyed hash (SipHash-2-4) makes real ones impossible to find on purpose.
// Built on the test-only hook of tests/testing/name_hash_hook.hpp, which changes
// NameHash for the whole process: the directory code, mkfs and fsck alike.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "testing/name_hash_hook.hpp"
#include "nvfs/name_hash.hpp"

namespace nvfs::test {

// While alive: NameHash gives each name passed to Force its forced value,
// every other name the ForceAll value if one is set, else its real hash.
// One at a time; set up before the filesystem it is used on is opened (or,
// with ForceAll, formatted: mkfs hashes lost+found).
class ForcedNameHash {
 public:
  ForcedNameHash() {
    active_ = this;
    testing::SetNameHashHook(&Hook);
  }
  ~ForcedNameHash() {
    testing::SetNameHashHook(nullptr);
    active_ = nullptr;
  }
  ForcedNameHash(const ForcedNameHash&) = delete;
  ForcedNameHash& operator=(const ForcedNameHash&) = delete;

  void Force(const std::string& name, uint64_t hash) { names_[name] = hash; }
  void ForceAll(uint64_t hash) { all_ = hash; }

  // A new random name of `length` bytes (letters), forced onto `hash`.
  std::string MakeName(uint64_t hash, size_t length, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> letter('a', 'z');
    for (;;) {
      std::string name(length, 'x');
      for (char& c : name) c = static_cast<char>(letter(rng));
      if (names_.count(name) != 0) continue;
      Force(name, hash);
      return name;
    }
  }

 private:
  // Read-only while a filesystem runs (fsck's threads call it concurrently).
  static uint64_t Hook(const NameHashKey& key, std::string_view name) {
    const ForcedNameHash& forced = *active_;
    if (auto it = forced.names_.find(name); it != forced.names_.end()) return it->second;
    if (forced.all_) return *forced.all_;
    return SipHash24(key.k0, key.k1, name.data(), name.size());
  }

  static inline ForcedNameHash* active_ = nullptr;
  std::map<std::string, uint64_t, std::less<>> names_;
  std::optional<uint64_t> all_;
};

}  // namespace nvfs::test
