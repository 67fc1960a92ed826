#include "direct/libc.hpp"

#include <dlfcn.h>

namespace nvfs::direct::libc {

Table real{};

namespace {

template <class F>
NVFS_DIRECT_UNINSTRUMENTED void Find(F& slot, const char* name) {
  if (slot == nullptr) slot = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

NVFS_DIRECT_UNINSTRUMENTED void Resolve() {
  Find(real.pread, "pread");
  Find(real.pread64, "pread64");
  Find(real.pread_chk, "__pread_chk");
  Find(real.pread64_chk, "__pread64_chk");
  Find(real.preadv, "preadv");
  Find(real.preadv64, "preadv64");
  Find(real.preadv2, "preadv2");
  Find(real.preadv64v2, "preadv64v2");
  Find(real.pwrite, "pwrite");
  Find(real.pwrite64, "pwrite64");
  Find(real.pwritev, "pwritev");
  Find(real.pwritev64, "pwritev64");
  Find(real.pwritev2, "pwritev2");
  Find(real.pwritev64v2, "pwritev64v2");
  Find(real.fsync, "fsync");
  Find(real.fdatasync, "fdatasync");
  Find(real.close, "close");
  Find(real.close_range, "close_range");
  Find(real.closefrom, "closefrom");
  Find(real.dup, "dup");
  Find(real.dup2, "dup2");
  Find(real.dup3, "dup3");
  Find(real.fcntl, "fcntl");
  Find(real.ftruncate, "ftruncate");
  Find(real.ftruncate64, "ftruncate64");
  Find(real.truncate, "truncate");
  Find(real.truncate64, "truncate64");
  Find(real.fallocate, "fallocate");
  Find(real.fallocate64, "fallocate64");
  Find(real.posix_fallocate, "posix_fallocate");
  Find(real.posix_fallocate64, "posix_fallocate64");
  Find(real.fcntl64, "fcntl64");
  Find(real.open, "open");
  Find(real.open64, "open64");
  Find(real.open_2, "__open_2");
  Find(real.open64_2, "__open64_2");
  Find(real.openat, "openat");
  Find(real.openat64, "openat64");
  Find(real.openat_2, "__openat_2");
  Find(real.openat64_2, "__openat64_2");
  Find(real.creat, "creat");
  Find(real.creat64, "creat64");
  Find(real.fopen, "fopen");
  Find(real.fopen64, "fopen64");
  Find(real.freopen, "freopen");
  Find(real.freopen64, "freopen64");
  Find(real.fclose, "fclose");
  Find(real.fcloseall, "fcloseall");
  Find(real.recvmsg, "recvmsg");
  Find(real.opendir, "opendir");
  Find(real.closedir, "closedir");
  Find(real.socket, "socket");
  Find(real.socketpair, "socketpair");
  Find(real.accept, "accept");
  Find(real.accept4, "accept4");
  Find(real.pipe, "pipe");
  Find(real.pipe2, "pipe2");
  Find(real.eventfd, "eventfd");
  Find(real.epoll_create, "epoll_create");
  Find(real.epoll_create1, "epoll_create1");
  Find(real.memfd_create, "memfd_create");
  Find(real.mmap, "mmap");
  Find(real.mmap64, "mmap64");
  Find(real.munmap, "munmap");
  Find(real.mremap, "mremap");
  Find(real.madvise, "madvise");
  Find(real.sigaction, "sigaction");
  Find(real.setuid, "setuid");
  Find(real.seteuid, "seteuid");
  Find(real.setreuid, "setreuid");
  Find(real.setresuid, "setresuid");
  Find(real.setgid, "setgid");
  Find(real.setegid, "setegid");
  Find(real.setregid, "setregid");
  Find(real.setresgid, "setresgid");
  Find(real.setgroups, "setgroups");
  Find(real.initgroups, "initgroups");
  Find(real.setfsuid, "setfsuid");
  Find(real.setfsgid, "setfsgid");
  Find(real.capset, "capset");
  Find(real.unshare, "unshare");
  Find(real.setns, "setns");
  Find(real.syscall, "syscall");
  Find(real.clone, "clone");
}

}  // namespace nvfs::direct::libc
