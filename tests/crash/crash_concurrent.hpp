// Crash states with operations in flight on several threads (issue 21; the
// model is doc/integrity.md, "Concurrent operations").
//
// A concurrent workload is a setup (one thread, not a crash point) and two or
// three threads, each a short list of operations of the core run on its own
// std::thread. The media writes of all threads go through one RecordingMedia
// whose gate (RecordingMedia::set_gate) parks the calling thread before every
// store, flush, fence and operation mark. A scheduler lets exactly one parked
// thread through at a time, chosen by a seeded generator (the thread that ran
// goes on with probability 15/16, else any parked one: bursts, so a switch
// can land anywhere inside another thread's stretch), so the global order
// of the media writes is the seed's and a failure replays from its id. A
// thread that blocks on a lock of the filesystem (a directory, an inode, the
// orphan list) is seen blocked by its kernel state (/proc/self/task/TID/stat
// says S while it sleeps on the futex); the scheduler then chooses among the
// others. A thread woken by another's unlock runs to its next gate before the
// scheduler chooses again, so the interleaving depends on the seed alone.
//
// Every fence and every transaction end of the run is a crash point; the
// crash states are enumerated there as for the one-thread workloads
// (crash_enumerator.hpp). Each state is checked as StateChecker does: it
// mounts, its recovery may crash again, fsck finds nothing, everything can be
// deleted back to an empty namespace's counts; and its tree must equal the
// tree of some *linearization* of the operations: a sequence holding every
// operation that had returned before the crash point and any subset of those
// in flight there (each whole or not at all), in an order that keeps each
// thread's program order and puts an operation after every one that returned
// before it began, in which every operation that had returned gives the
// result it gave. The trees of the sequences come from running them on one
// thread on a fresh mount (SequenceModel): the one-thread crash suite checks
// that model. Inode numbers the threads allocate depend on the order, so
// trees are compared with new inodes renumbered in path order. After the run
// (no crash) the tree must be that of a linearization of all operations.
//
// Environment (besides crash_harness.hpp's):
//   NVFS_CRASH_INTERLEAVINGS=N  seeds per workload (default 3): seed,
//                               seed+1, ...; each a replay id's seed
//   NVFS_CRASH_ALL=1            no cap: every crash state of every point
//   NVFS_CRASH_TRACE=hex        with NVFS_CRASH_REPLAY: rerun the seed until
//                               its trace hash is this one (a failure prints
//                               it)
//
// What the seed does not fix: a thread woken by another's unlock races that
// thread (running on, maybe to take the lock again) for the lock; the
// scheduler waits for the woken thread to park or sleep again before it
// chooses, but who won is the kernel's. So a seed names one interleaving up
// to those races, and the trace hash names it whole.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "crash_harness.hpp"

namespace nvfs::test {

// One operation of a thread: the errno the core returned (0: success).
// Operations use only what the setup named (StepContext::Known, Handle):
// paths move under other threads.
struct ThreadOp {
  std::string name;
  std::function<int(StepContext&)> run;
  std::string releases;  // the handle the operation releases, if any
};

struct ConcurrentWorkload {
  std::string name;  // no ':'
  ImageSpec image;
  std::function<void(StepContext&)> setup;
  std::vector<std::vector<ThreadOp>> threads;  // 2 or 3
};

struct ConcurrentResult : WorkloadResult {
  uint64_t interleavings = 0;
  uint64_t switches = 0;       // thread switches over all interleavings
  uint64_t events = 0;         // media events scheduled
  uint64_t blocked = 0;        // times the running thread blocked on a lock
  uint64_t sequences = 0;      // distinct linearizations run on the model
  std::vector<std::string> traces;  // one line per interleaving
};

// The workloads of issue 21, item 1.
std::vector<ConcurrentWorkload> ConcurrentWorkloads();

// Runs each workload under NVFS_CRASH_INTERLEAVINGS seeds, prints one line per
// interleaving (its seed, switches, crash points, states) and per workload,
// and a total.
std::vector<ConcurrentResult> RunConcurrentWorkloads(const std::vector<ConcurrentWorkload>& workloads);

}  // namespace nvfs::test
