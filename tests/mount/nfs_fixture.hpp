// An NFS export of an nvfs mount for tests/mount/test_nfs.cpp: nfs-ganesha
// (FSAL_VFS) serving a MountedFs on 127.0.0.1 with the sample
// doc/ganesha.conf, rpcbind where none runs, and libnfs as the client.
//
// What the fixture starts it stops, by PID, in its destructor (also when a
// REQUIRE failed): ganesha (SIGTERM, then SIGKILL after 20 s) and rpcbind.
// It never stops a server it did not start. Every wait is bounded in time;
// every libnfs call has a 30 s RPC timeout.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

struct nfs_context;

namespace nvfs::test {

// True if ganesha.nfsd, its VFS FSAL, rpcbind and the sample configuration
// are there; otherwise prints, once and loudly, what is missing
// (tools/check.sh installs them: tools/lib/common.sh).
bool GaneshaAvailable();

#define NVFS_REQUIRE_GANESHA()                                                          \
  do {                                                                                  \
    if (!::nvfs::test::GaneshaAvailable()) {                                            \
      NVFS_SKIP("nfs-ganesha (ganesha.nfsd, nfs-ganesha-vfs) or rpcbind is not installed"); \
    }                                                                                   \
  } while (0)

// rpcbind for the suite: the one already answering on /run/rpcbind.sock or
// 127.0.0.1:111, or else Debian's rpcbind on loopback sockets only
// (tools/lib/rpcbind_loopback.py: rpcbind's own -h binds TCP on every
// address), stopped by PID in the destructor.
class Rpcbind {
 public:
  Rpcbind();
  ~Rpcbind();
  Rpcbind(const Rpcbind&) = delete;
  Rpcbind& operator=(const Rpcbind&) = delete;
  bool started_here() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

// ganesha.nfsd exporting `export_dir` with doc/ganesha.conf (its
// "/mnt/nvfs" replaced by `export_dir`); config, pid file and log in a
// scratch directory of its own.
class Ganesha {
 public:
  explicit Ganesha(const std::string& export_dir);
  ~Ganesha();
  Ganesha(const Ganesha&) = delete;
  Ganesha& operator=(const Ganesha&) = delete;

  // Starts it in the foreground (-F) and waits (REQUIRE, 30 s) until it
  // has said "NFS SERVER INITIALIZED" and accepts on 127.0.0.1:2049.
  void Start();
  // SIGTERM, waits for it to exit (20 s, then SIGKILL). Returns its status.
  int Stop();
  bool running() const { return pid_ > 0; }
  std::string log() const;
  const std::string& export_dir() const { return export_dir_; }

 private:
  std::string export_dir_;
  std::string scratch_;
  std::string config_;
  std::string log_;
  std::string pid_file_;
  pid_t pid_ = -1;
};

// A libnfs (NFSv3) client of 127.0.0.1:`export_dir` as uid/gid.
class NfsClient {
 public:
  NfsClient(const std::string& export_dir, int uid, int gid);
  ~NfsClient();
  NfsClient(const NfsClient&) = delete;
  NfsClient& operator=(const NfsClient&) = delete;
  nfs_context* get() const { return nfs_; }
  std::string error() const;

 private:
  nfs_context* nfs_ = nullptr;
};

// Every socket of this machine's network namespace listening on TCP `port`
// or bound to UDP `port` on an address other than loopback (127.0.0.0/8,
// ::1, ::ffff:127.0.0.0/104), as "/proc/net/FILE ADDRESS" lines; empty if
// there is none.
std::vector<std::string> NonLoopbackSockets(int port);

// An NFSv3 file handle's bytes, kept by the test across restarts.
using NfsHandle = std::vector<char>;

// The handle of `path` (a file or a directory) on the client's export.
NfsHandle HandleOf(NfsClient& client, const std::string& path);

// Raw NFSv3 calls with a kept handle (libnfs's raw RPC layer, bounded poll
// loop). The NFS status (nfsstat3: 0 NFS3_OK, 70 NFS3ERR_STALE), or -1 if
// the RPC itself failed or timed out.
struct NfsAttr {
  int status = -1;
  uint64_t fileid = 0;
  uint64_t size = 0;
  uint32_t nlink = 0;
  uint32_t type = 0;  // ftype3: 1 regular, 2 directory
};
NfsAttr Getattr3(NfsClient& client, const NfsHandle& handle);
struct NfsRead {
  int status = -1;
  std::string data;
};
NfsRead Read3(NfsClient& client, const NfsHandle& handle, uint64_t offset, uint32_t count);
struct NfsLookup {
  int status = -1;
  NfsHandle handle;
};
NfsLookup Lookup3(NfsClient& client, const NfsHandle& dir, const std::string& name);

}  // namespace nvfs::test
