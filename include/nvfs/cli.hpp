// Small helpers shared by the command-line programs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace nvfs {

// "4096", "64k", "1M", "16G", "2T" (also "KiB", "MB"...; powers of 1024).
std::optional<uint64_t> ParseSize(std::string_view text);
// "1.5 GiB"-style text for people.
std::string FormatSize(uint64_t bytes);

using Uuid = std::array<uint8_t, 16>;
std::optional<Uuid> ParseUuid(std::string_view text);
std::string FormatUuid(const Uuid& uuid);
// A random (version 4) UUID.
Uuid RandomUuid();
uint64_t RandomU64();
// Fills `len` bytes from getrandom(2), for secrets: unlike RandomUuid and
// RandomU64 it has no fallback, and returns false (errno set) when the kernel
// gives no random bytes.
bool FillSecret(void* buf, size_t len);

// Progress on a terminal: "label: done/total" redrawn in place on stderr;
// silent when stderr is not a terminal or `quiet`.
class Progress {
 public:
  Progress(const char* label, uint64_t total, bool quiet);
  ~Progress();
  void Update(uint64_t done);

 private:
  const char* label_;
  uint64_t total_;
  bool enabled_;
  int last_percent_ = -1;
};

}  // namespace nvfs
