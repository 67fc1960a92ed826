// Names: lookup, forget, mknod, mkdir, symlink, link, unlink, rmdir, rename,
// readlink. Each hands the kernel at most one reference, taken back if the
// reply does not arrive.
#include <cstdio>
#include <new>
#include <string>
#include <string_view>

#include "fuse/ops.hpp"

namespace nvfs::fuse_ops {

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    const std::string_view n(name);
    // "." on any inode is how the kernel turns an NFS file handle back into
    // an inode (FUSE_CAP_EXPORT_SUPPORT); the core's Lookup wants a directory.
    Result<Attr> attr = n == "." ? adapter.fs().LookupInode(parent)
                                 : adapter.fs().Lookup(parent, n);
    if (!attr.ok() && attr.code() == ENOENT) {
      fuse_entry_param negative{};  // ino 0: the kernel caches the absence
      negative.entry_timeout = adapter.options().entry_timeout;
      fuse_reply_entry(req, &negative);
      return;
    }
    ReplyEntry(req, adapter, attr);
  });
}

namespace {

// Drops the references of a batch of forgets, each on its own. Forget never
// throws: a reclaim that fails (an allocation) is said on stderr by the
// core, and the inode stays on the orphan list for the next mount.
void ForgetEach(fuse_req_t req, size_t count, const fuse_forget_data* forgets) noexcept {
  Filesystem& fs = AdapterOf(req).fs();
  for (size_t i = 0; i < count; ++i) fs.Forget(forgets[i].ino, forgets[i].nlookup);
}

}  // namespace

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) noexcept {
  const fuse_forget_data one{ino, nlookup};
  ForgetEach(req, 1, &one);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) noexcept {
  ForgetEach(req, count, forgets);
  fuse_reply_none(req);
}

void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
             dev_t rdev) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Mknod(parent, name, mode, rdev, CredOf(req)));
  });
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Mkdir(parent, name, mode, CredOf(req)));
  });
}

void OpSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Symlink(parent, name, target, CredOf(req)));
  });
}

void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) noexcept {
  Guarded(req, [&] {
    FuseAdapter& adapter = AdapterOf(req);
    ReplyEntry(req, adapter, adapter.fs().Link(ino, new_parent, new_name));
  });
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().Unlink(parent, name)); });
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) noexcept {
  Guarded(req, [&] { ReplyStatus(req, AdapterOf(req).fs().Rmdir(parent, name)); });
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned int flags) noexcept {
  Guarded(req, [&] {
    ReplyStatus(req, AdapterOf(req).fs().Rename(parent, name, new_parent, new_name, flags,
                                                  CredOf(req)));
  });
}

void OpReadlink(fuse_req_t req, fuse_ino_t ino) noexcept {
  Guarded(req, [&] {
    Result<std::string> target = AdapterOf(req).fs().Readlink(ino);
    if (!target.ok()) {
      fuse_reply_err(req, target.code());
      return;
    }
    fuse_reply_readlink(req, target->c_str());
  });
}

}  // namespace nvfs::fuse_ops
