// The daemon's side of direct maps (protocol.hpp, doc/integrity.md section
// 13): which client maps which file, and the grace period that keeps a
// block a file gave up from going to another file while a client may still
// map it.
//
// A client (one connection: a "mapper") maps a file's blocks into its own
// address space from its mapping of the namespace. The daemon records, per
// mapper and file, the slot seq the client's maps of the file are known to
// be at (`validated`: the seq of the runs it was first given, then what its
// acknowledgements say). A block freed at ticket t may be reused once every
// mapper that maps a file whose seq has moved past its `validated` has
// acknowledged that it mapped that file again at the new seq: such a
// mapper holds back every ticket from the first one it may concern (a
// stopped or stuck client holds blocks, never corrupts: `df` shows them).
// Nothing here ever waits for a client: the server thread tells mappers
// (kOpNotify) and reads their acknowledgements; the allocator asks
// Completed() and reuses what it says.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "daemon/direct_writers.hpp"
#include "nvfs/direct_abi.hpp"
#include "nvfs/epoch.hpp"

namespace nvfs::direct {

class Maps final : public epoch::ExternalGrace {
 public:
  // `table` is the slot table the filesystem keeps current; `wake_fd` an
  // eventfd the server thread polls: written when mappers are to be told.
  Maps(DirectSlot* table, uint32_t slot_count, int wake_fd)
      : table_(table), slot_count_(slot_count), wake_fd_(wake_fd) {}

  // The direct writers' grace (direct_writers.hpp), once there is one: its
  // tickets go on from these, and Completed() is the older of both.
  void SetWriters(Writers* writers);

  // epoch::ExternalGrace. Never wait; Start and Completed run under the
  // allocator's lock, on any thread that frees or allocates.
  uint64_t Start() override;
  uint64_t Completed() override;

  // The server thread's calls.
  // Before the runs of a map are read: mapper `id` holds back every ticket
  // not yet looked at until EndRegister, so that no block its runs may
  // name goes to another file between the read and Register (a ticket
  // completed meanwhile would not have seen it). Paired with EndRegister.
  void BeginRegister(uint64_t id);
  // Mapper `id` maps file `ino` (slot `slot`), given runs at seq `seq`.
  // False if the slot is out of the table.
  bool Register(uint64_t id, uint64_t ino, uint32_t slot, uint64_t seq);
  // After Register (or its failure): what BeginRegister held back is let
  // go if every file of the mapper is still at the seq it was given.
  void EndRegister(uint64_t id);
  // Whether `id` maps `ino` (its maps of it were registered).
  bool Holds(uint64_t id, uint64_t ino) const;
  // Mapper `id` maps no part of `ino` any more.
  void Unregister(uint64_t id, uint64_t ino);
  // Mapper `id` mapped `ino` again at `seq` (an acknowledgement).
  void Acknowledged(uint64_t id, uint64_t ino, uint64_t seq);
  // Mapper `id` acknowledged everything it was told: if each of its files
  // is at the seq it acknowledged, it holds nothing back any more; else it
  // is to be told again.
  void Done(uint64_t id);
  // Mapper `id`'s connection closed while its process may still map:
  // everything freed from now on is held until Drop.
  void Orphan(uint64_t id);
  // Mapper `id` is gone (its process, or its last map): forgotten.
  void Drop(uint64_t id);
  // Mappers to tell now (a file of theirs changed and none was told since
  // their last Done): each is marked told. Called after the wake_fd fired.
  std::vector<uint64_t> TakeNotifications();

  // The filesystem's watch (Filesystem::SetDirectWatch): a watched file
  // changed; the server thread looks at the mappers.
  static void Changed(void* ctx, uint32_t slot);

 private:
  struct File {
    uint32_t slot;
    uint64_t validated;
  };
  struct Mapper {
    std::map<uint64_t, File> files;  // by inode
    uint64_t owe = 0;    // the first ticket it holds back; 0: none
    bool tell = false;   // to be told
    bool told = false;   // a kOpNotify not yet answered by kOpMapDone
    bool orphan = false;
    int registering = 0;  // BeginRegister calls not yet ended
    bool owe_for_register = false;  // `owe` was set by BeginRegister
  };
  // Whether some file of `m` is not at its validated seq. REQUIRES: mu_.
  bool Stale(const Mapper& m) const;
  void Wake() const;

  DirectSlot* const table_;
  const uint32_t slot_count_;
  const int wake_fd_;

  mutable std::mutex mu_;  // a leaf lock, taken under the allocator's
  Writers* writers_ = nullptr;  // protected by mu_
  uint64_t ticket_ = 0;    // protected by mu_: the last ticket given
  uint64_t scanned_ = 0;   // protected by mu_: tickets up to this were looked at
  std::map<uint64_t, Mapper> mappers_;  // protected by mu_
};

}  // namespace nvfs::direct
