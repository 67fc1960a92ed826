// Reading names: readdir (with "." and "..", in batches handed out with no
// lock held) and readlink. The operations that change names are in
// namei.cpp.
#include <dirent.h>
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "fs/fs_impl.hpp"
#include "nvfs/media.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::Inode;

Result<std::string> FsImpl::Readlink(uint64_t ino) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (!S_ISLNK(inode.mode)) return Error(EINVAL);
  if (!SymlinkSizeValid(inode.size)) return Error(EIO);
  if (inode.size <= format::kInlineSymlinkMax) {
    return std::string(inode.map.symlink, inode.size);
  }
  uint64_t run;
  const uint64_t block = bmap_->Lookup(inode, 0, 1, &run);
  if (block == Bmap::kCorrupt) return BadMap(ino);
  if (block == 0) return Error(EIO);
  // A data block: copied under a recovery point (a lost page fails the
  // request, and stays lost for the next one; see ZeroMapped).
  char target[format::kSymlinkMax];
  const size_t len = inode.size;
  if (!RunFaultGuarded([&] { std::memcpy(target, ctx_->Block(block), len); })) {
    ReportMediaError("readlink", ino);
    return Error(EIO);
  }
  return std::string(target, len);
}

// Cookies: 0 starts with ".", 1 with "..", and c >= 2 resumes at entries of
// key >= c - 2; the entry of key k is followed by cookie k + 3.
Status FsImpl::ReadDir(uint64_t dir_ino, uint64_t cookie,
                       const std::function<bool(const DirEntry&, uint64_t)>& fn) {
  Result<InodeRef> dir = Get(dir_ino);
  if (!dir.ok()) return dir.take_error();
  uint64_t parent_ino;
  {
    std::shared_lock lock(dir.value()->lock);
    if (!S_ISDIR(dir->media().mode)) return Error(ENOTDIR);
    parent_ino = dir->media().parent;
  }
  if (cookie == 0) {
    if (!fn({".", dir_ino, DT_DIR}, 1)) return Status::Ok();
    cookie = 1;
  }
  if (cookie == 1) {
    if (!fn({"..", parent_ino, DT_DIR}, 2)) return Status::Ok();
    cookie = 2;
  }
  // Entries are copied out in batches under the shared lock, then handed to fn
  // with no lock held (fn may call back into the filesystem).
  struct Copied {
    std::string name;
    uint64_t ino;
    uint32_t type;
    uint64_t key;
  };
  std::vector<Copied> batch;
  uint64_t from_key = cookie - 2;
  for (;;) {
    batch.clear();
    {
      std::shared_lock lock(dir.value()->lock);
      Status st = dir_->ReadDir(dir->media(), from_key, [&](const DirEntryRef& e) {
        batch.push_back({std::string(e.name), e.ino, e.file_type, e.key});
        return batch.size() < 128;
      });
      if (!st.ok()) return st.code() == EUCLEAN ? Error(EIO) : st;
    }
    if (batch.empty()) return Status::Ok();
    for (const Copied& e : batch) {
      if (!fn({e.name, e.ino, e.type}, e.key + 3)) return Status::Ok();
    }
    if (batch.back().key >= format::kDirKeyMax) return Status::Ok();
    from_key = batch.back().key + 1;
  }
}

}  // namespace nvfs
