// Media errors on the libpmem2 backend's mappings (include/nvfs/media.hpp's
// FaultPoint): one SIGBUS handler for the process, installed with the first
// mapping, and the fixed table of mappings it recognises (written under a
// mutex at open, grow and close, read by the handler without one). A fault
// in a recovery point jumps out of it; one outside replaces the page (see
// SubstituteLostPage in sigbus.cpp); any other SIGBUS kills the process.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nvfs {

// The pages lost in the mapping at `base`.
uint64_t LostPagesOf(const std::byte* base);
// Faults in [base, base + size) are the media's from now on.
void RegisterMapping(const std::byte* base, uint64_t size);
// The mapping at `base` grew (Media::Grow): faults in its new part are ours.
void ResizeMapping(const std::byte* base, uint64_t size);
void UnregisterMapping(const std::byte* base);

}  // namespace nvfs
