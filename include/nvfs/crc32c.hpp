// CRC32C (Castagnoli), as used by the on-media checksums.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nvfs {

// Extends `crc` (0 to start) over `len` bytes; Crc32c(0, "123456789", 9) is
// 0xE3069283. Uses SSE4.2 when the CPU has it.
uint32_t Crc32c(uint32_t crc, const void* data, size_t len);

}  // namespace nvfs
