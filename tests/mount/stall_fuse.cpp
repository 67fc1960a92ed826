// A FUSE file system that never answers FLUSH: what any user who may mount
// FUSE (fusermount3) can make to have a close(2) of one of its files wait
// for as long as the user likes. Once the server has read a FLUSH, the
// closing thread waits for the answer uninterruptibly (the kernel sends
// FLUSH as a forced request). tests/mount/test_direct.cpp passes such a file to
// the nvfs daemon.
//
//   stall_fuse MOUNTPOINT
//
// Serves, in the foreground on one thread, a root directory holding one
// empty file "f"; prints "flush" on stdout for each FLUSH it leaves
// unanswered. Ends (unmounting) on SIGTERM or SIGINT; a close still
// waiting then ends with an error, as the connection goes. Run by root, it
// mounts with allow_other, so that other users can open "f".
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace {

constexpr fuse_ino_t kFile = 2;

void Attr(fuse_ino_t ino, struct stat* st) {
  *st = {};
  st->st_ino = ino;
  st->st_mode = ino == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0644;
  st->st_nlink = ino == FUSE_ROOT_ID ? 2 : 1;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent != FUSE_ROOT_ID || std::strcmp(name, "f") != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = kFile;
  e.attr_timeout = e.entry_timeout = 3600;
  Attr(kFile, &e.attr);
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != FUSE_ROOT_ID && ino != kFile) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st;
  Attr(ino, &st);
  fuse_reply_attr(req, &st, 3600);
}

void Open(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) { fuse_reply_open(req, fi); }

void Read(fuse_req_t req, fuse_ino_t, size_t, off_t, fuse_file_info*) {
  fuse_reply_buf(req, nullptr, 0);
}

// Never answered: the request stays with the kernel's waiter.
void Flush(fuse_req_t, fuse_ino_t, fuse_file_info*) {
  std::printf("flush\n");
  std::fflush(stdout);
}

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: stall_fuse MOUNTPOINT\n");
    return 2;
  }
  fuse_lowlevel_ops ops{};
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.open = Open;
  ops.read = Read;
  ops.flush = Flush;
  ops.release = Release;
  // Mounted by root (where only root may open /dev/fuse), every user may
  // use it: allow_other.
  char arg0[] = "stall_fuse", o[] = "-o", opts[] = "fsname=stall,subtype=stall,allow_other";
  if (geteuid() != 0) std::strcpy(opts + std::strlen(opts) - std::strlen(",allow_other"), "");
  char* args_v[] = {arg0, o, opts, nullptr};
  fuse_args args = FUSE_ARGS_INIT(3, args_v);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  if (se == nullptr) return 1;
  int rc = 1;
  if (fuse_set_signal_handlers(se) == 0) {
    if (fuse_session_mount(se, argv[1]) == 0) {
      std::printf("mounted\n");
      std::fflush(stdout);
      rc = fuse_session_loop(se) == 0 ? 0 : 1;
      fuse_session_unmount(se);
    }
    fuse_remove_signal_handlers(se);
  }
  fuse_session_destroy(se);
  return rc;
}
