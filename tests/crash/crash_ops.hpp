// Filesystem operations by path for crash workloads: each one is a single
// operation of the core (so a crash inside it must show the tree before or
// after it), failing the step on an unexpected error.
#pragma once

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "crash_harness.hpp"
#include "nvfs/direct_abi.hpp"
#include "nvfs/epoch.hpp"
#include "nvfs/format.hpp"

namespace nvfs::test::ops {

inline const Cred kUser{1000, 1000};

inline std::string Bytes(size_t len, char seed) {
  std::string out(len, '\0');
  for (size_t i = 0; i < len; ++i) out[i] = static_cast<char>('A' + (seed + i * 7 + i / 13) % 26);
  return out;
}

inline void Create(StepContext& c, const std::string& path, uint32_t mode = 0644) {
  auto [dir, name] = c.Parent(path);
  Attr attr;
  FileHandle file = c.Expect(c.fs().Create(dir, name, mode, O_RDWR, kUser, &attr), "create " + path);
  c.fs().Release(file);
  c.fs().Forget(attr.ino, 1);
}

inline void Mkdir(StepContext& c, const std::string& path, uint32_t mode = 0755) {
  auto [dir, name] = c.Parent(path);
  c.fs().Forget(c.Expect(c.fs().Mkdir(dir, name, mode, kUser), "mkdir " + path).ino, 1);
}

inline void Mknod(StepContext& c, const std::string& path, uint32_t mode, uint64_t rdev) {
  auto [dir, name] = c.Parent(path);
  c.fs().Forget(c.Expect(c.fs().Mknod(dir, name, mode, rdev, kUser), "mknod " + path).ino, 1);
}

inline void Symlink(StepContext& c, const std::string& path, const std::string& target) {
  auto [dir, name] = c.Parent(path);
  c.fs().Forget(c.Expect(c.fs().Symlink(dir, name, target, kUser), "symlink " + path).ino, 1);
}

inline void Link(StepContext& c, const std::string& from, const std::string& to) {
  const uint64_t ino = c.Ino(from);
  auto [dir, name] = c.Parent(to);
  c.fs().Forget(c.Expect(c.fs().Link(ino, dir, name), "link " + to).ino, 1);
}

inline void Unlink(StepContext& c, const std::string& path) {
  auto [dir, name] = c.Parent(path);
  c.Expect(c.fs().Unlink(dir, name), "unlink " + path);
}

inline void Rmdir(StepContext& c, const std::string& path) {
  auto [dir, name] = c.Parent(path);
  c.Expect(c.fs().Rmdir(dir, name), "rmdir " + path);
}

inline void Rename(StepContext& c, const std::string& from, const std::string& to,
                   unsigned flags = 0) {
  auto [from_dir, from_name] = c.Parent(from);
  auto [to_dir, to_name] = c.Parent(to);
  c.Expect(c.fs().Rename(from_dir, from_name, to_dir, to_name, flags),
           "rename " + from + " " + to);
}

inline void SetAttr(StepContext& c, const std::string& path, const SetAttrRequest& request) {
  (void)c.Expect(c.fs().SetAttr(c.Ino(path), request), "setattr " + path);
}

inline void Truncate(StepContext& c, const std::string& path, uint64_t size) {
  SetAttrRequest r;
  r.valid = kSetSize;
  r.size = size;
  SetAttr(c, path, r);
}

inline void SetXattr(StepContext& c, const std::string& path, const std::string& name,
                     const std::string& value, int flags = 0) {
  c.Expect(c.fs().SetXattr(c.Ino(path), name, value.data(), value.size(), flags),
           "setxattr " + path + " " + name);
}

inline void RemoveXattr(StepContext& c, const std::string& path, const std::string& name) {
  c.Expect(c.fs().RemoveXattr(c.Ino(path), name), "removexattr " + path + " " + name);
}

// Opens, writes, releases: the write is the one operation that changes the media.
inline void Write(StepContext& c, const std::string& path, uint64_t offset, const std::string& data,
                  int flags = O_RDWR) {
  FileHandle file = c.Expect(c.fs().Open(c.Ino(path), flags), "open " + path);
  Result<size_t> n = c.fs().Write(file, offset, data.data(), data.size());
  c.fs().Release(file);
  if (c.Expect(std::move(n), "write " + path) != data.size()) c.Fail("short write " + path);
}

// An overwrite of existing bytes: durable, not atomic.
inline void Overwrite(StepContext& c, const std::string& path, uint64_t offset,
                      const std::string& data) {
  c.AllowMixed(path, offset, data.size());
  Write(c, path, offset, data);
}

// A punch zeroes the bytes of its partial edge blocks, and a zero range all
// its mapped bytes, like a write of zeros: they may mix after a crash.
inline void Fallocate(StepContext& c, const std::string& path, int mode, uint64_t offset,
                      uint64_t len) {
  if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) c.AllowMixed(path, offset, len);
  FileHandle file = c.Expect(c.fs().Open(c.Ino(path), O_RDWR), "open " + path);
  Status st = c.fs().Fallocate(file, mode, offset, len);
  c.fs().Release(file);
  c.Expect(st, "fallocate " + path);
}

// Allocates every free block to /fill but the reserve, which only what
// must not fail may take (ENOSPC workloads; after a grow, what is written
// next lands in the blocks the grow added).
inline void FillUp(StepContext& c) {
  Create(c, "/fill");
  FileHandle f = c.Expect(c.fs().Open(c.Ino("/fill"), O_RDWR), "open /fill");
  uint64_t offset = 0;
  for (uint64_t chunk : {uint64_t{1} << 20, uint64_t{4096}}) {
    while (c.fs().Fallocate(f, 0, offset, chunk).ok()) offset += chunk;
    offset = c.fs().GetAttr(c.Ino("/fill"))->blocks * 512;
  }
  c.fs().Release(f);
  const StatFs st = *c.fs().GetStatFs();
  if (st.blocks_free != st.blocks_reserved || st.blocks_avail != 0) {
    c.Fail("could not fill the namespace");
  }
}

inline void OpenKeep(StepContext& c, const std::string& name, const std::string& path) {
  c.Keep(name, c.Expect(c.fs().Open(c.Ino(path), O_RDWR), "open " + path));
}

// --- A direct writer (src/direct/write.cpp), with the daemon's calls made
// here: the core's DirectAllocate and DirectCommit, and the client's store
// and flush into the runs between them, all on the recording media.

// A slot table for the mounted filesystem (what the daemon's direct server
// gives it); left to the end of the process, as it must outlive the mount.
// A setup step's: not a crash point.
inline void EnableDirect(StepContext& c) {
  auto* table = new DirectSlot[64]();
  c.fs().SetDirectTable(table, 64);
}

// The runs of a grant, as (file offset, namespace offset or kDirectHole, len),
// and the file's append word as the grant read it (namespace offset, value;
// 0: closed).
struct DirectGrant {
  uint64_t seq = 0;
  uint64_t start = 0;
  std::vector<DirectRun> runs;
  uint64_t append_at = 0;
  uint64_t append_word = 0;
};

inline DirectGrant ToGrant(const Filesystem::DirectMapping& m, const DirectRun* runs) {
  return DirectGrant{m.seq, m.start, std::vector<DirectRun>(runs, runs + m.run_count),
                     m.append_at, m.append_word};
}

// Appends by word (Filesystem::SetAppendWords): a grace whose every period
// is over at once (no direct writer runs outside the step), left to the end
// of the process as EnableDirect's table is. A setup step's: not a crash
// point. After EnableDirect.
inline void EnableAppendWords(StepContext& c) {
  struct Immediate final : epoch::ExternalGrace {
    uint64_t n = 0;
    uint64_t Start() override { return ++n; }
    uint64_t Completed() override { return n; }
  };
  c.fs().SetExternalGrace(new Immediate);
  c.fs().SetAppendWords(true);
}

// kOpAllocate: blocks for [offset, offset + len) and a reserve to
// `reserve_end`, through the open file `name` (OpenKeep).
inline DirectGrant DirectAllocate(StepContext& c, const std::string& name, uint64_t offset,
                                  uint64_t len, uint64_t reserve_end) {
  DirectRun runs[128];
  const uint64_t ino = c.fs().HandleIno(c.Handle(name));
  return ToGrant(c.Expect(c.fs().DirectAllocate(ino, offset, len, reserve_end, runs, 128),
                          "direct allocate"),
                 runs);
}

// The client's part: `data` stored at file offset `offset` into the
// grant's runs and flushed; fails the step if a byte has no block.
inline void DirectStore(StepContext& c, const DirectGrant& g, uint64_t offset,
                        const std::string& data) {
  Media& media = c.fs().media();
  uint64_t file_off = g.start;
  size_t done = 0;
  for (const DirectRun& r : g.runs) {
    const uint64_t end = file_off + r.len;
    while (done < data.size() && offset + done >= file_off && offset + done < end) {
      if (r.offset == kDirectHole) c.Fail("a direct store into a hole");
      const uint64_t within = offset + done - file_off;
      const size_t k = static_cast<size_t>(std::min<uint64_t>(r.len - within, data.size() - done));
      media.StoreFlush(r.offset + within, data.data() + done, k);
      done += k;
    }
    file_off = end;
  }
  if (done != data.size()) c.Fail("a direct store past the runs it was given");
  media.Drain();
}

// kOpCommit: the size that exposes [start, end), the times; the grant for
// the next store (runs from `end` to `map_end`).
inline DirectGrant DirectCommit(StepContext& c, const std::string& name, uint64_t start,
                                uint64_t end, uint64_t seq, uint64_t map_end) {
  DirectRun runs[128];
  const uint64_t ino = c.fs().HandleIno(c.Handle(name));
  return ToGrant(c.Expect(c.fs().DirectCommit(ino, start, end, seq, map_end, runs, 128),
                          "direct commit"),
                 runs);
}

// The client's append by word (src/direct/write.cpp StoreChunk): `data`
// stored at `offset`, the grant's word's end, into the blocks past the size
// and flushed; then the word moved to the new end with one aligned 8-byte
// store, flushed. The word must still be the grant's at `offset` (the
// client's compare-and-swap; no other writer runs here), else the step
// fails. Returns the grant with the new word, for the next append.
inline DirectGrant DirectAppendByWord(StepContext& c, DirectGrant g, uint64_t offset,
                                      const std::string& data) {
  Media& media = c.fs().media();
  const uint64_t tag = format::AppendTag(g.append_word);
  if (g.append_word == 0) c.Fail("an append by word with the word closed");
  DirectStore(c, g, offset, data);
  uint64_t on_media = 0;
  std::memcpy(&on_media, media.base() + g.append_at, sizeof on_media);
  if (on_media != format::AppendWord(tag, offset)) {
    c.Fail("the append word is " + std::to_string(on_media) + ", not the grant's at " +
           std::to_string(offset));
  }
  const uint64_t w = format::AppendWord(tag, offset + data.size());
  media.StoreFlush(g.append_at, &w, sizeof w);
  media.Drain();
  g.append_word = w;
  return g;
}

}  // namespace nvfs::test::ops
