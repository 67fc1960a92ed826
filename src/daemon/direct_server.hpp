// The daemon's side of direct reads (protocol.hpp): the slot table shared
// read-only with clients, and a unix socket served on a thread of its own,
// so that nothing a client does (a flood, a stall, a malformed message) can
// slow or stop the mount. Talks to the core through its public face only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "nvfs/fs.hpp"

namespace nvfs::direct {

struct ServerOptions {
  // Direct writes (doc/integrity.md section 11): a read-write mount whose
  // kernel keeps no page cache of its files (cache=none).
  bool writes = false;
  // A direct writer made `ino` `size` bytes long, its last byte
  // `last_byte`: the kernel's size of it is moved up. Must not wait for
  // anything.
  std::function<void(uint64_t ino, uint64_t size, uint8_t last_byte)> size_changed;
  // The times (and the size) of `ino` changed: the kernel's cached
  // attributes of it are dropped. Called at once after a request that set
  // only the times (fsync, close: the writer's stat must see them), and
  // within kTimesMilliseconds after a commit.
  std::function<void(uint64_t ino)> attrs_changed;
};

class Server {
 public:
  // Makes the table, gives it to `fs` (Filesystem::SetDirectTable) and
  // binds SocketPath(mount_dev), listening: clients that connect from now
  // on wait in the backlog until Serve(). `namespace_path` is the namespace
  // `fs` serves. On failure returns nullptr and says why in *why (one
  // line); the mount goes on without direct reads.
  // The table must outlive `fs`: destroy the Server after the filesystem.
  // With options.writes, also the writers' file (direct_writers.hpp), whose
  // grace the filesystem then waits out (Filesystem::SetExternalGrace); if it
  // cannot be made the mount serves direct reads only, and *writes_why says
  // why.
  static std::unique_ptr<Server> Create(Filesystem& fs, dev_t mount_dev,
                                        const std::string& namespace_path,
                                        const ServerOptions& options, std::string* why,
                                        std::string* writes_why);
  // Whether direct writes are served.
  bool writes() const;
  ~Server();  // Stop(), then the table goes
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Starts the serving thread (after the daemon has forked: threads do not
  // survive fuse_daemonize). False if it cannot.
  bool Serve();
  // Ends the thread, closes every connection and removes the socket.
  // Idempotent. Never waits for a client. After it the table stays, and the
  // filesystem keeps it current, until the Server is destroyed.
  void Stop();
  const std::string& socket_path() const;

  // Slots in the table, the header included (65536: 4 MiB).
  static constexpr uint32_t kSlots = 1u << 16;

  struct State;

 private:
  explicit Server(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace nvfs::direct
