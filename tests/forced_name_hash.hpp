// Names forced onto chosen hash values, for tests of hash collisions: the
// keyed hash (SipHash-2-4) makes real ones impossible to find on purpose.
// Built on the test-only hook of src/format/name_hash_hook.hpp, which changes
// NameHash for the whole process: the directory code, mkfs and fsck alike.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "format/name_hash_hook.hpp"
#include "nvfs/name_hash.hpp"

namespace nvfs::test {

// While alive: NameHash gives each name passed to Force its forced value,
// every other name the ForceAll value if one is set, else its real hash.
// One at a time; set up before the filesystem it is used on is opened (or,
// with ForceAll, formatted: mkfs hashes lost+found).
class ForcedNameHash {
 public:
  ForcedNameHash() { testing::SetNameHashHook(&Hook); }
  ~ForcedNameHash() {
    testing::SetNameHashHook(nullptr);
    State() = Forced{};
  }
  ForcedNameHash(const ForcedNameHash&) = delete;
  ForcedNameHash& operator=(const ForcedNameHash&) = delete;

  void Force(const std::string& name, uint64_t hash) { State().names[name] = hash; }
  void ForceAll(uint64_t hash) { State().all = hash; }

  // A new random name of `length` bytes (letters), forced onto `hash`.
  std::string MakeName(uint64_t hash, size_t length, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> letter('a', 'z');
    for (;;) {
      std::string name(length, 'x');
      for (char& c : name) c = static_cast<char>(letter(rng));
      if (State().names.count(name) != 0) continue;
      Force(name, hash);
      return name;
    }
  }

 private:
  struct Forced {
    std::map<std::string, uint64_t, std::less<>> names;
    std::optional<uint64_t> all;
  };
  static Forced& State() {
    static Forced forced;
    return forced;
  }
  // Read-only while a filesystem runs (fsck's threads call it concurrently).
  static uint64_t Hook(const NameHashKey& key, std::string_view name) {
    const Forced& forced = State();
    if (auto it = forced.names.find(name); it != forced.names.end()) return it->second;
    if (forced.all) return *forced.all;
    return SipHash24(key.k0, key.k1, name.data(), name.size());
  }
};

}  // namespace nvfs::test
