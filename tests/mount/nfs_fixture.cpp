#include "nfs_fixture.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
// libnfs.h first: the raw headers use its EXTERN.
#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "mount_fixture.hpp"

// libnfs 4.0 keeps struct nfs_fh out of its public headers but hands it out
// (nfs_get_fh, libnfs-raw.h); its layout since libnfs 1.x.
struct nfs_fh {
  int len;
  char* val;
};

namespace nvfs::test {

namespace {

constexpr const char* kRpcbindSocket = "/run/rpcbind.sock";
constexpr const char* kRpcbind = "/usr/sbin/rpcbind";
constexpr const char* kGanesha = "/usr/bin/ganesha.nfsd";
// Debian's multiarch directory: /usr/lib/x86_64-linux-gnu/ganesha/ and so on.
constexpr const char* kVfsFsalGlob = "/usr/lib/*/ganesha/libfsalvfs.so";
constexpr int kNfsPort = 2049;
constexpr int kRpcTimeoutMs = 30000;

using Clock = std::chrono::steady_clock;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether something accepts a connection at the address (loopback: a
// refusal comes at once).
bool Answers(const sockaddr* addr, socklen_t len) {
  const int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = connect(fd, addr, len) == 0;
  close(fd);
  return ok;
}

bool UnixAnswers(const char* path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  return Answers(reinterpret_cast<sockaddr*>(&a), sizeof a);
}

sockaddr_in Loopback4(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

bool TcpAnswers(int port) {
  sockaddr_in a = Loopback4(port);
  return Answers(reinterpret_cast<sockaddr*>(&a), sizeof a);
}

}  // namespace

bool GaneshaAvailable() {
  static const bool available = [] {
    const char* conf = std::getenv("NVFS_GANESHA_CONF");
    std::string missing;
    if (access(kGanesha, X_OK) != 0) missing += " ganesha.nfsd (nfs-ganesha)";
    glob_t found{};
    if (glob(kVfsFsalGlob, 0, nullptr, &found) != 0) missing += " libfsalvfs.so (nfs-ganesha-vfs)";
    globfree(&found);
    if (access(kRpcbind, X_OK) != 0) missing += " rpcbind";
    const char* helper = std::getenv("NVFS_RPCBIND_HELPER");
    if (conf == nullptr || helper == nullptr || access(conf, R_OK) != 0) {
      missing += " NVFS_GANESHA_CONF/NVFS_RPCBIND_HELPER (run through meson)";
    }
    if (missing.empty()) return true;
    std::fprintf(stderr,
                 "\n**********************************************************\n"
                 "*** SKIPPING the NFS export tests: missing%s\n"
                 "*** tools/check.sh installs them (apt install nfs-ganesha\n"
                 "*** nfs-ganesha-vfs rpcbind libnfs-dev).\n"
                 "**********************************************************\n\n",
                 missing.c_str());
    return false;
  }();
  return available;
}

Rpcbind::Rpcbind() {
  if (UnixAnswers(kRpcbindSocket) || TcpAnswers(111)) {
    std::fprintf(stderr, "test_nfs: using the rpcbind that already runs\n");
    return;
  }
  // tools/lib/rpcbind_loopback.py binds the loopback sockets and execs
  // rpcbind: the PID is rpcbind's.
  log_ = "/dev/shm/nvfs-rpcbind-" + std::to_string(getpid()) + ".log";
  pid_ = SpawnProgram({"/usr/bin/python3", "-I", std::getenv("NVFS_RPCBIND_HELPER")}, log_);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!UnixAnswers(kRpcbindSocket)) {
    const int code = WaitForExit(pid_, 0);
    if (code >= 0) {
      pid_ = -1;
      FAIL("rpcbind exited with status " << code << ": " << ReadText(log_));
    }
    if (Clock::now() > deadline) FAIL("rpcbind did not answer within 10 s: " << ReadText(log_));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "test_nfs: started rpcbind (pid %d) on 127.0.0.1:111, ::1:111 and %s\n",
               static_cast<int>(pid_), kRpcbindSocket);
}

Rpcbind::~Rpcbind() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);  // our own child, by PID
  if (WaitForExit(pid_, 10) < 0) {
    kill(pid_, SIGKILL);
    WaitForExit(pid_, 5);
  }
  unlink(kRpcbindSocket);  // bound by us above
  unlink(log_.c_str());
}

Ganesha::Ganesha(const std::string& export_dir) : export_dir_(export_dir) {
  char dir[] = "/tmp/nvfs-ganesha-XXXXXX";
  if (mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
  scratch_ = dir;
  config_ = scratch_ + "/ganesha.conf";
  log_ = scratch_ + "/ganesha.log";
  pid_file_ = scratch_ + "/ganesha.pid";
  // The sample, as a reader of doc/nfs.md would use it: only the mount point
  // differs.
  std::string text = ReadText(std::getenv("NVFS_GANESHA_CONF"));
  for (size_t at = text.find("/mnt/nvfs"); at != std::string::npos;
       at = text.find("/mnt/nvfs", at + export_dir.size())) {
    text.replace(at, std::strlen("/mnt/nvfs"), export_dir);
  }
  std::ofstream(config_) << text;
}

Ganesha::~Ganesha() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    if (WaitForExit(pid_, 20) < 0) {
      kill(pid_, SIGKILL);
      WaitForExit(pid_, 5);
    }
  }
  for (const std::string& f : {config_, log_, pid_file_}) unlink(f.c_str());
  rmdir(scratch_.c_str());
}

std::string Ganesha::log() const { return ReadText(log_); }

void Ganesha::Start() {
  REQUIRE(pid_ <= 0);
  INFO("another server answers on 127.0.0.1:" << kNfsPort << " (a ganesha or nfsd not ours)");
  REQUIRE_FALSE(TcpAnswers(kNfsPort));
  const size_t log_before = log().size();
  pid_ = SpawnProgram({kGanesha, "-F", "-f", config_, "-L", log_, "-p", pid_file_});
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    const bool initialized = log().find("NFS SERVER INITIALIZED", log_before) != std::string::npos;
    if (initialized && TcpAnswers(kNfsPort)) break;
    const int code = WaitForExit(pid_, 0);
    if (code >= 0) {
      pid_ = -1;
      FAIL("ganesha.nfsd exited with status " << code << " before serving: " << log());
    }
    if (Clock::now() > deadline) FAIL("ganesha.nfsd did not serve within 30 s: " << log());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int Ganesha::Stop() {
  REQUIRE(pid_ > 0);
  kill(pid_, SIGTERM);
  int code = WaitForExit(pid_, 20);
  if (code < 0) {
    WARN("ganesha.nfsd did not exit within 20 s of SIGTERM; killed. Its log: " << log());
    kill(pid_, SIGKILL);
    code = WaitForExit(pid_, 5);
  }
  pid_ = -1;
  return code;
}

std::vector<std::string> NonLoopbackSockets(int port) {
  // /proc/net/{tcp,udp}[6]: "sl local_address rem_address st ...", the
  // address in hex as the kernel stores it (IPv4 one little-endian word,
  // IPv6 four), the port in hex. TCP sockets count when listening (state
  // 0A), UDP ones whenever bound to the port.
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", port);
  std::vector<std::string> found;
  for (const char* file : {"tcp", "tcp6", "udp", "udp6"}) {
    std::ifstream in(std::string("/proc/net/") + file);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (colon == std::string::npos || local.substr(colon + 1) != port_hex) continue;
      const bool tcp = file[0] == 't';
      if (tcp && state != "0A") continue;
      const std::string addr = local.substr(0, colon);
      const bool loopback =
          (addr.size() == 8 && addr.substr(6) == "7F") ||                     // 127.x.x.x
          addr == "00000000000000000000000001000000" ||                        // ::1
          (addr.size() == 32 && addr.substr(0, 24) == "0000000000000000FFFF0000" &&
           addr.substr(30) == "7F");                                           // ::ffff:127.x
      if (!loopback) found.push_back(std::string("/proc/net/") + file + " " + local);
    }
  }
  return found;
}

NfsClient::NfsClient(const std::string& export_dir, int uid, int gid) {
  nfs_ = nfs_init_context();
  REQUIRE(nfs_ != nullptr);
  nfs_set_uid(nfs_, uid);
  nfs_set_gid(nfs_, gid);
  nfs_set_timeout(nfs_, kRpcTimeoutMs);
  const int rc = nfs_mount(nfs_, "127.0.0.1", export_dir.c_str());
  INFO("nfs_mount 127.0.0.1:" << export_dir << ": " << error());
  REQUIRE(rc == 0);
}

NfsClient::~NfsClient() {
  if (nfs_ != nullptr) nfs_destroy_context(nfs_);
}

std::string NfsClient::error() const {
  const char* e = nfs_get_error(nfs_);
  return e != nullptr ? e : "";
}

NfsHandle HandleOf(NfsClient& client, const std::string& path) {
  nfsfh* fh = nullptr;
  const int rc = nfs_open(client.get(), path.c_str(), O_RDONLY, &fh);
  INFO("nfs_open " << path << ": " << client.error());
  REQUIRE(rc == 0);
  const nfs_fh* raw = nfs_get_fh(fh);
  REQUIRE(raw != nullptr);
  REQUIRE(raw->len > 0);
  REQUIRE(raw->len <= NFS3_FHSIZE);
  NfsHandle handle(raw->val, raw->val + raw->len);
  nfs_close(client.get(), fh);
  return handle;
}

namespace {

// One raw call in flight: the callback copies what the reply says (libnfs
// frees the reply after it). Heap-allocated and left behind if the wait
// times out, since the callback may still come.
template <class Out>
struct Pending {
  bool done = false;
  int rpc_status = RPC_STATUS_ERROR;
  Out out;
};

// Serves the context until `done`, for at most the RPC timeout. False on
// a transport error or the deadline.
bool WaitDone(rpc_context* rpc, const bool& done) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kRpcTimeoutMs);
  while (!done) {
    pollfd p{rpc_get_fd(rpc), static_cast<short>(rpc_which_events(rpc)), 0};
    const int n = poll(&p, 1, 100);
    if (n < 0 && errno != EINTR) return false;
    if (rpc_service(rpc, n > 0 ? p.revents : 0) < 0) return false;
    if (!done && Clock::now() > deadline) return false;
  }
  return true;
}

nfs_fh3 Fh3(const NfsHandle& h) {
  nfs_fh3 fh{};
  fh.data.data_len = static_cast<u_int>(h.size());
  fh.data.data_val = const_cast<char*>(h.data());
  return fh;
}

// Sends `args` with `send` (one of libnfs's rpc_nfs3_*_async), waits, and
// returns what `copy` made of the reply; an empty Out if the call failed or
// never completed (its state then left allocated, see Pending).
template <class Out, class Args, class Copy>
Out Call(NfsClient& client, int (*send)(rpc_context*, rpc_cb, Args*, void*), Args* args,
         Copy copy) {
  rpc_context* rpc = nfs_get_rpc_context(client.get());
  auto pending = std::make_unique<Pending<Out>>();
  struct Thunk {
    static void Done(rpc_context*, int status, void* data, void* private_data) {
      auto* p = static_cast<std::pair<Pending<Out>*, Copy>*>(private_data);
      p->first->rpc_status = status;
      if (status == RPC_STATUS_SUCCESS && data != nullptr) p->second(data, p->first->out);
      p->first->done = true;
      delete p;
    }
  };
  auto* ctx = new std::pair<Pending<Out>*, Copy>(pending.get(), copy);
  if (send(rpc, &Thunk::Done, args, ctx) != 0) {
    delete ctx;
    return Out{};
  }
  if (!WaitDone(rpc, pending->done)) {
    pending.release();  // the callback may still write to it
    return Out{};
  }
  if (pending->rpc_status != RPC_STATUS_SUCCESS) return Out{};
  return pending->out;
}

}  // namespace

NfsAttr Getattr3(NfsClient& client, const NfsHandle& handle) {
  GETATTR3args args{};
  args.object = Fh3(handle);
  auto copy = [](void* data, NfsAttr& out) {
    const auto* res = static_cast<GETATTR3res*>(data);
    out.status = res->status;
    if (res->status != NFS3_OK) return;
    const fattr3& a = res->GETATTR3res_u.resok.obj_attributes;
    out.fileid = a.fileid;
    out.size = a.size;
    out.nlink = a.nlink;
    out.type = a.type;
  };
  return Call<NfsAttr>(client, rpc_nfs3_getattr_async, &args, copy);
}

NfsRead Read3(NfsClient& client, const NfsHandle& handle, uint64_t offset, uint32_t count) {
  READ3args args{};
  args.file = Fh3(handle);
  args.offset = offset;
  args.count = count;
  auto copy = [](void* data, NfsRead& out) {
    const auto* res = static_cast<READ3res*>(data);
    out.status = res->status;
    if (res->status != NFS3_OK) return;
    const READ3resok& ok = res->READ3res_u.resok;
    out.data.assign(ok.data.data_val, ok.data.data_len);
  };
  return Call<NfsRead>(client, rpc_nfs3_read_async, &args, copy);
}

NfsLookup Lookup3(NfsClient& client, const NfsHandle& dir, const std::string& name) {
  LOOKUP3args args{};
  args.what.dir = Fh3(dir);
  args.what.name = const_cast<char*>(name.c_str());
  auto copy = [](void* data, NfsLookup& out) {
    const auto* res = static_cast<LOOKUP3res*>(data);
    out.status = res->status;
    if (res->status != NFS3_OK) return;
    const nfs_fh3& fh = res->LOOKUP3res_u.resok.object;
    out.handle.assign(fh.data.data_val, fh.data.data_val + fh.data.data_len);
  };
  return Call<NfsLookup>(client, rpc_nfs3_lookup_async, &args, copy);
}

}  // namespace nvfs::test
