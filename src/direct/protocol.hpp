// The direct protocol between the daemon (src/daemon/direct_server.cpp) and
// libnvfs-direct (src/direct/session.cpp, write.cpp). One unix stream
// socket per mount, at SocketPath(st_dev of the mount) (nvfs/paths.hpp);
// requests are answered in order, one at a time; every message has a fixed
// size.
//
// A session:
//   1. kOpHello (no descriptor): the reply is a header and nothing else
//      (no error: this daemon speaks this version). Nothing about the
//      namespace is said before the proof. By the time it is answered the
//      daemon has decided whether this connection may pass descriptors:
//      only one whose peer could open the namespace for reading (root, its
//      owner, its group or others as its mode says) may; any other's
//      sendmsg with a descriptor fails with EPERM (SO_PASSRIGHTS), and so
//      no descriptor another user chose ever reaches the daemon.
//   2. kOpProve with one descriptor: the namespace, opened for reading by
//      the client itself (it finds its path as the mount's source in
//      /proc/self/mountinfo). The daemon checks it is the very file or
//      device it serves (st_dev and st_ino, or st_rdev for a device) and
//      readable; the reply carries the namespace's size now, the slot
//      table's descriptor (a sealed memfd: the client can map it read-only
//      only) and the namespace's identity at this mount (mount_count and
//      uuid, which the client reads again from its own mapping after every
//      copy). The client maps the namespace read-only itself: it is given
//      nothing it could not read already.
//   3. kOpMap with one descriptor: a regular file opened for reading on this
//      mount (the kernel checked the permissions at that open). The reply:
//      the file's slot, the seq and size the runs are valid for, runs from
//      `start` (<= the offset asked, block-aligned) on, and the namespace's
//      size now (after a grow, the client maps the part it lacks). The daemon
//      keeps no per-file state for the client: it closes the descriptor
//      before it answers, and a client asks again, with the descriptor
//      again, when the slot's seq has moved or it needs runs past those it
//      has.
//   4. kOpWriteProve with one descriptor: the namespace, opened for reading
//      and writing by the client itself. The daemon checks it as for
//      kOpProve and that it is open for writing, that the mount is
//      read-write and serves direct writes, and gives the process a page
//      of the writers' file (direct_abi.hpp): the reply carries the file's
//      descriptor, the page's offset in it and how stores are made durable
//      (DirectFlush). The client maps the namespace shared and writable
//      itself, over its read-only mapping: it is given nothing it could
//      not write already.
//   5. kOpMap with kMapForWrite: as kOpMap, for a file the client stores
//      into. The descriptor must be open for reading and writing (not
//      O_APPEND); the reply's flags say kMapWritable when the file may be
//      written directly at this state (a regular file, not immutable nor
//      append-only, no set-user-ID, set-group-ID with group execution or
//      security.capability, which a write must drop first).
//   6. kOpAllocate (a descriptor, as 5): blocks for [offset, offset +
//      length): every hole gets one, and past the end up to `limit` (kept
//      past the size, for the appends that follow). The reply is a MapReply
//      from `offset`, reaching past the size over the file's blocks there.
//   7. kOpCommit (a descriptor, as 5): the client made [offset, length)
//      durable in runs it had at slot seq `seq`; the daemon checks the seq
//      still holds, exposes the bytes (size at least `length`, the gap
//      before `offset` zeroed), sets mtime and ctime, in one transaction,
//      and replies with the runs from `length` up to `limit` (EAGAIN: the
//      file changed; store again). offset == length: the times only.
//   8. kOpTrim (a descriptor, as 5): the blocks kept past the end go.
//   9. kOpMmap (a descriptor, as 3, or as 5 with kMapForWrite, then
//      opened for reading and writing; or `ino` of a file this connection
//      maps already): the client maps [offset, offset + length) of the
//      file's blocks into its own address space (direct maps, doc/
//      integrity.md section 13). The daemon keeps the descriptor (the file
//      stays open, as the kernel's mmap keeps it) until kOpMunmap or the
//      connection's end, and records that this connection maps the file at
//      the reply's seq. With kMapForWrite the file is registered as mapped
//      for writing (the checks of 5); with kMapAllocate too, the holes of
//      [offset, offset + length) inside the size, at most
//      kMaxMapAllocateBytes of it, get blocks first, committed before the
//      reply (MAP_SYNC: the mapped blocks' metadata is durable before the
//      client stores): the client asks so at the first store into a hole
//      (lazy.hpp). The reply is kOpMap's. A connection that maps files reads every message the
//      daemon sends, for the daemon also sends, unasked, kOpNotify (a
//      header alone): a file it maps changed. The client then looks at the
//      slots of its files, maps again (kOpMmap by `ino`) those whose seq
//      moved, sends kOpMapAck (`ino`, `seq`: every page of that file it maps
//      is now from runs given at `seq`) for each of them and kOpMapDone;
//      blocks a file gave up go to no other file until then.
//  10. kOpMunmap (`ino`), kOpMapAck, kOpMapDone: no reply.
//   6 to 8 may name the file by `ino` instead of a descriptor, on a
//   connection proven for writing: its process may change every byte of the
//   namespace already, and a descriptor passed costs the daemon a receive,
//   a statx and a close on every append. A write request is not counted
//   against the user's rate either (kRequestsPerSecond): the same process
//   could store anything anywhere instead.
// Anything before a successful kOpProve but kOpHello, a malformed message, a
// wrong magic or version: one reply with an error, then the daemon closes
// the connection. A connection not proven within kUnprovenSeconds is closed.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "nvfs/direct_abi.hpp"
#include "nvfs/paths.hpp"
#include "util/fd_passing.hpp"

namespace nvfs::direct {

inline constexpr uint32_t kMagic = 0x7264766eu;  // "nvdr"
inline constexpr uint32_t kVersion = 6;  // 6: kMapAllocate

enum Op : uint32_t {
  kOpHello = 1,
  kOpProve = 2,       // one descriptor: the namespace, opened for reading
  kOpMap = 3,         // one descriptor: a file on the mount, opened for reading
  kOpWriteProve = 4,  // one descriptor: the namespace, opened for writing
  kOpAllocate = 5,    // one descriptor: a file, opened for reading and writing
  kOpCommit = 6,      // the same
  kOpTrim = 7,        // the same
  kOpMmap = 8,        // a descriptor (as kOpMap or, for writing, kOpAllocate), or `ino`
  kOpMunmap = 9,      // `ino`; no reply
  kOpMapAck = 10,     // `ino`, `seq`; no reply
  kOpMapDone = 11,    // no reply
  kOpNotify = 12,     // the daemon's, unasked: a mapped file changed
};

// Request::flags
inline constexpr uint32_t kMapForWrite = 1;
// kOpWriteProve of a mapper's connection (kOpMmap): the proof alone, no
// page of the writers' file (its process has one from its session's
// proof, where it counts its writable maps).
inline constexpr uint32_t kProveNoPage = 2;
// kOpMmap with kMapForWrite: the range's holes get blocks (a store into
// one of them), for at most kMaxMapAllocateBytes from the offset: no
// request makes the daemon allocate and zero more than that.
inline constexpr uint32_t kMapAllocate = 4;
inline constexpr uint64_t kMaxMapAllocateBytes = uint64_t{2} << 20;
// Files one connection may map at once (the daemon holds a descriptor of
// each).
inline constexpr unsigned kMaxMappedFiles = 256;

struct Request {
  uint32_t magic;    // kMagic
  uint32_t version;  // kVersion
  uint32_t op;       // Op
  uint32_t flags;    // kOpMap: kMapForWrite; kOpMmap: also kMapAllocate
  uint64_t offset;   // kOpMap, kOpAllocate, kOpMmap: the file offset the runs must cover;
                     // kOpCommit: the first byte stored
  uint64_t length;   // kOpAllocate: bytes to store; kOpCommit: the end of what was stored;
                     // kOpMmap: bytes mapped
  uint64_t seq;      // kOpCommit: the slot's seq of the runs stored into; kOpMapAck
  uint64_t limit;    // kOpAllocate, kOpCommit: how far past the size runs may go
  uint64_t ino;      // kOpAllocate, kOpCommit, kOpTrim, kOpMmap without a descriptor,
                     // kOpMunmap, kOpMapAck: the file
  uint64_t reserved;
};
static_assert(sizeof(Request) == 64);

struct ReplyHeader {
  uint32_t magic;  // kMagic
  uint32_t op;     // the request's
  int32_t error;   // 0, or the errno that refuses the request
  uint32_t size;   // bytes of the whole reply
};

// Carries the table's descriptor (SCM_RIGHTS) when error == 0.
struct ProveReply {
  ReplyHeader h;
  uint64_t namespace_size;  // bytes the client maps: the namespace's size now
  uint64_t mount_count;  // format::SuperDynamic::mount_count at this mount
  uint8_t uuid[16];      // format::SuperStatic::uuid
  uint32_t slot_count;   // slots in the table, the header (slot 0) included
  uint32_t reserved;
  uint64_t table_bytes;  // slot_count * sizeof(DirectSlot)
};

inline constexpr uint32_t kMaxRuns = 128;

struct MapReply {
  ReplyHeader h;
  uint64_t ino;
  uint64_t seq;    // the slot's seq these runs and this size are valid for (even)
  uint64_t size;   // the file's size at `seq`
  uint64_t start;  // file offset of the first run
  uint64_t namespace_size;  // the namespace's size now (it grows while mounted)
  uint32_t slot;   // index into the table (>= 1)
  uint32_t run_count;
  uint32_t flags;  // kMapWritable
  uint32_t reserved;
  // The file's append word (format.hpp Inode::append_end): its namespace
  // offset, and its value at `seq` (0: closed). A writer whose write starts
  // at its end appends by moving it (write.cpp); a reader that reaches
  // `size` looks at it (a larger end: the runs are asked for again).
  uint64_t append_at;
  uint64_t append_word;
  DirectRun runs[kMaxRuns];  // consecutive in the file from `start`
};

// MapReply::flags: the file may be written directly at `seq`.
inline constexpr uint32_t kMapWritable = 1;

// Carries the writers' file's descriptor (SCM_RIGHTS) when error == 0.
struct WriteProveReply {
  ReplyHeader h;
  uint64_t page_offset;  // the process's page, in bytes from the file's start
  uint32_t flush;        // DirectFlush
  uint32_t reserved;
};

// SendWithFd: one message with a descriptor (src/util/fd_passing.hpp), what
// both sides send.
using nvfs::SendWithFd;

// Bounds the daemon keeps (src/daemon/direct_server.cpp).
inline constexpr unsigned kMaxConnections = 256;        // all clients
inline constexpr unsigned kRootReserve = 32;            // ... of which only root's may use these
inline constexpr unsigned kMaxConnectionsPerUid = 32;   // one user's
inline constexpr unsigned kRequestsPerSecond = 20000;   // one user's, on average
inline constexpr unsigned kRequestBurst = 2000;         // ... and at once
inline constexpr unsigned kUnprovenSeconds = 5;         // from connect to a proof
// Descriptors of one user whose close has not returned (daemon/reaper.hpp):
// past this, that user's connections are not heard until some return.
inline constexpr unsigned kMaxPendingCloses = 64;
// A direct writer's reserve: blocks past the end for the appends that
// follow, twice the write, between these.
inline constexpr uint64_t kMinReserve = uint64_t{64} << 10;
inline constexpr uint64_t kMaxReserve = uint64_t{8} << 20;
// How often the daemon sets the times of files written directly (the
// writers' pages' dirty lists), and the bound on how late a stat sees them.
inline constexpr unsigned kTimesMilliseconds = 1000;

}  // namespace nvfs::direct
