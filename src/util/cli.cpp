#include "nvfs/cli.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace nvfs {

std::optional<uint64_t> ParseSize(std::string_view text) {
  size_t pos = 0;
  uint64_t value = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    const uint64_t digit = static_cast<uint64_t>(text[pos] - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
    ++pos;
  }
  std::string suffix;
  for (; pos < text.size(); ++pos) suffix += static_cast<char>(std::tolower(text[pos]));
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else {
    static constexpr const char* kUnits = "kmgtpe";
    const char* unit = std::strchr(kUnits, suffix[0]);
    if (unit == nullptr || *unit == '\0') return std::nullopt;
    const std::string rest = suffix.substr(1);
    if (!(rest.empty() || rest == "b" || rest == "ib")) return std::nullopt;
    shift = 10 * static_cast<int>(unit - kUnits + 1);
  }
  if (shift != 0 && value > (UINT64_MAX >> shift)) return std::nullopt;
  return value << shift;
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::optional<Uuid> ParseUuid(std::string_view text) {
  Uuid uuid{};
  size_t nibble = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '-' && (i == 8 || i == 13 || i == 18 || i == 23)) continue;
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return std::nullopt;
    if (nibble >= 32) return std::nullopt;
    uuid[nibble / 2] = static_cast<uint8_t>(uuid[nibble / 2] | (v << ((nibble % 2) ? 0 : 4)));
    ++nibble;
  }
  if (nibble != 32 || text.size() != 36) return std::nullopt;
  return uuid;
}

std::string FormatUuid(const Uuid& uuid) {
  char buf[37];
  char* p = buf;
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    std::snprintf(p, 3, "%02x", uuid[i]);
    p += 2;
  }
  return std::string(buf, 36);
}

namespace {
void FillRandom(void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    const ssize_t n = getrandom(p, len, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // No entropy source: fall back to something unique enough for a UUID.
      uint64_t x = static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull ^
                   reinterpret_cast<uintptr_t>(buf);
      for (; len > 0; --len) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        *p++ = static_cast<uint8_t>(x >> 56);
      }
      return;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}
}  // namespace

Uuid RandomUuid() {
  Uuid uuid;
  FillRandom(uuid.data(), uuid.size());
  uuid[6] = static_cast<uint8_t>((uuid[6] & 0x0F) | 0x40);
  uuid[8] = static_cast<uint8_t>((uuid[8] & 0x3F) | 0x80);
  return uuid;
}

bool FillSecret(void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    const ssize_t n = getrandom(p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

uint64_t RandomU64() {
  uint64_t v;
  FillRandom(&v, sizeof v);
  return v;
}

Progress::Progress(const char* label, uint64_t total, bool quiet)
    : label_(label), total_(total), enabled_(!quiet && total > 0 && isatty(STDERR_FILENO)) {}

Progress::~Progress() {
  if (enabled_ && last_percent_ >= 0) std::fprintf(stderr, "\r%s: done          \n", label_);
}

void Progress::Update(uint64_t done) {
  if (!enabled_) return;
  const int percent = static_cast<int>(done * 100 / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  std::fprintf(stderr, "\r%s: %" PRIu64 "/%" PRIu64 " (%d%%)", label_, done, total_, percent);
  std::fflush(stderr);
}

}  // namespace nvfs
