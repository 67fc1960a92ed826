// What the core does for direct readers (src/direct/): the slot table it
// keeps current, and the runs of a file as byte ranges of the namespace.
// The copy-then-check rule that makes a direct read safe is argued in
// doc/integrity.md section 10; the core's part is that every change of a
// file's mapping or size moves its slot (MappingChange), and a slot given
// up moves too (InodeCache::Delete).
#include <sys/stat.h>

#include <algorithm>
#include <shared_mutex>

#include "fs/fs_impl.hpp"

namespace nvfs {

void FsImpl::SetDirectTable(DirectSlot* table, uint32_t count) {
  cache_->SetDirectTable(table, count);
}

Result<Filesystem::DirectMapping> FsImpl::DirectMap(uint64_t ino, uint64_t offset,
                                                    DirectRun* runs, size_t max_runs) {
  if (cache_->direct_table() == nullptr || max_runs == 0) return Error(EINVAL);
  Result<InodeRef> ref = FsOps::Get(*this, ino);
  if (!ref.ok()) return ref.take_error();
  CachedInode* ci = ref->get();
  // Held shared: no MappingChange runs, so the seq read below is even and
  // the runs are the file's at that seq.
  std::shared_lock lock(ci->lock);
  const format::Inode& inode = *ci->media;
  if (!S_ISREG(inode.mode)) return Error(S_ISDIR(inode.mode) ? EISDIR : EINVAL);
  if (cache_->Opens(ci) == 0) return Error(EBADF);
  DirectSlot* slot = cache_->AssignSlot(ci);
  if (slot == nullptr) return Error(ENOSPC);
  DirectMapping m;
  m.slot = static_cast<uint32_t>(slot - cache_->direct_table());
  m.seq = slot->seq.load(std::memory_order_relaxed);
  m.size = inode.size;
  const uint32_t shift = geometry_->block_shift();
  uint64_t index = offset >> shift;
  m.start = index << shift;
  const uint64_t end = (inode.size + geometry_->block_size() - 1) >> shift;
  const uint64_t limit = std::min(end, bmap_->max_blocks());
  while (index < limit && m.run_count < max_runs) {
    uint64_t run;
    const uint64_t phys = bmap_->Lookup(inode, index, limit - index, &run);
    if (phys == Bmap::kCorrupt) return FsOps::BadMap(*this, ino);
    runs[m.run_count++] = {phys == 0 ? kDirectHole : phys << shift, run << shift};
    index += run;
  }
  return m;
}

}  // namespace nvfs
