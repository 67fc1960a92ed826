// Directories: opendir, readdir, readdirplus, releasedir, fsyncdir.
#include <dirent.h>

#include <algorithm>
#include <cstring>

#include "fuse/ops.hpp"
#include "fuse/thread_buffers.hpp"

namespace nvfs::fuse_ops {

// Directory streams need no state: the core's cookies resume anywhere. So
// where the kernel allows it (FUSE_NO_OPENDIR_SUPPORT, 5.1+) the first
// OPENDIR fails with ENOSYS, and the kernel then opens and releases
// directories without asking; either way, with names cached as long as the
// mount (Protocol::cache_listings), it caches the listings too
// (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR, which that ENOSYS implies): only the
// kernel changes a directory, and it drops a listing when it changes its
// entries (fs/fuse/dir.c, fuse_dir_changed bumps the i_version the cache
// is checked against).
void OpOpendir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) noexcept {
  const FuseAdapter::Protocol& protocol = AdapterOf(req).protocol();
  if (protocol.no_opendir) {
    fuse_reply_err(req, ENOSYS);
    return;
  }
  fi->fh = 0;
  fi->keep_cache = protocol.cache_listings;
  fi->cache_readdir = protocol.cache_listings;
  fuse_reply_open(req, fi);
}

void OpReleasedir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* /*fi*/) noexcept {
  fuse_reply_err(req, 0);
}

// Directory operations are durable when they return: ENOSYS, as for FSYNC
// (file.cpp), and the kernel stops sending FSYNCDIR (fc->no_fsyncdir).
void OpFsyncdir(fuse_req_t req, fuse_ino_t /*ino*/, int /*datasync*/,
                fuse_file_info* /*fi*/) noexcept {
  fuse_reply_err(req, ENOSYS);
}

// readdir and readdirplus: entries from `cookie` on, as many as fit in `size`
// bytes; each entry's offset is the core's cookie that resumes after it.
// readdirplus takes a reference (LookupInode) only for an entry that fits,
// and none for "." and ".." (the kernel ignores their attributes); an entry
// whose inode went away after the listing copied it is left out.
static void ListDirectory(fuse_req_t req, fuse_ino_t ino, size_t size, off_t cookie, bool plus) {
  FuseAdapter& adapter = AdapterOf(req);
  Filesystem& fs = adapter.fs();
  ThreadBuffers& tb = LocalBuffers();
  tb.Reserve(size, fs.block_size());
  tb.looked_up().clear();
  // Room for a reference per entry that can fit, so recording one never
  // allocates (and cannot throw with the reference taken but unrecorded).
  if (plus) {
    tb.looked_up().reserve(size / fuse_add_direntry_plus(req, nullptr, 0, "", nullptr, 0) + 1);
  }
  struct Listing {
    fuse_req_t req;
    FuseAdapter& adapter;
    ThreadBuffers& tb;
    size_t size;
    bool plus;
    size_t used = 0;
    int error = 0;
  } l{req, adapter, tb, size, plus};
  // One capture, so the std::function stores it without allocating.
  auto add = [s = &l](const Filesystem::DirEntry& e, uint64_t next) {
    char* out = s->tb.data() + s->used;
    const size_t room = s->size - s->used;
    char* name = s->tb.name();
    const size_t len = std::min<size_t>(e.name.size(), format::kNameMax);
    std::memcpy(name, e.name.data(), len);
    name[len] = '\0';
    if (!s->plus) {
      struct stat attr {};
      attr.st_ino = e.ino;
      attr.st_mode = e.type << 12;
      const size_t need =
          fuse_add_direntry(s->req, out, room, name, &attr, static_cast<off_t>(next));
      if (need > room) return false;
      s->used += need;
      return true;
    }
    const size_t need = fuse_add_direntry_plus(s->req, nullptr, 0, name, nullptr, 0);
    if (need > room) return false;
    fuse_entry_param entry{};
    if (e.name == "." || e.name == "..") {
      entry.attr.st_ino = e.ino;
      entry.attr.st_mode = e.type << 12;
    } else {
      Result<Attr> attr = s->adapter.fs().LookupInode(e.ino);
      if (!attr.ok()) {
        if (attr.code() == ESTALE) return true;  // removed meanwhile
        s->error = attr.code();
        return false;
      }
      s->tb.looked_up().push_back(e.ino);
      entry = ToEntry(s->adapter, *attr);
    }
    fuse_add_direntry_plus(s->req, out, room, name, &entry, static_cast<off_t>(next));
    s->used += need;
    return true;
  };
  Status st;
  try {
    st = fs.ReadDir(ino, static_cast<uint64_t>(cookie), add);
  } catch (...) {
    for (uint64_t looked_up : tb.looked_up()) fs.Forget(looked_up, 1);
    throw;  // Guarded replies
  }
  if (l.used == 0 && (!st.ok() || l.error != 0)) {
    fuse_reply_err(req, st.ok() ? l.error : st.code());
    return;
  }
  // A failure after some entries: they go out now, the error on the next call.
  if (fuse_reply_buf(req, tb.data(), l.used) != 0) {
    for (uint64_t looked_up : tb.looked_up()) fs.Forget(looked_up, 1);
  }
}

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
               fuse_file_info* /*fi*/) noexcept {
  Guarded(req, [&] { ListDirectory(req, ino, size, off, false); });
}

void OpReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   fuse_file_info* /*fi*/) noexcept {
  Guarded(req, [&] { ListDirectory(req, ino, size, off, true); });
}

}  // namespace nvfs::fuse_ops
