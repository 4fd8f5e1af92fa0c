// What a hand-off between the ranks of a node costs, measured when a group's
// shared memory is set up.
//
// On a virtual machine the host decides where the guest's CPUs run. Two vCPUs
// that share a last-level cache hand a written cache line to each other in
// tens of nanoseconds; two that do not (other CCX/CCD or socket of the host)
// pay a trip across the chip's fabric for every line, and a collective whose
// staging lines bounce between the two caches runs several times slower for as
// long as the placement lasts (a whole launch, in practice). Neither the guest
// kernel nor the process can see the placement: only timing shows it.
//
// The probe (all ranks of the group, once, before the group is handed out):
//   1. kRounds exchange() steps: the round-trip cost of a step, measured by
//      rank 0 (the fastest round: preemption only adds);
//   2. ranks 0 and 1 each copy a block (one L2 cache's worth) into their
//      staging half, then each copies the other's out, the pattern every
//      staged collective has, alternately with cached and with streaming
//      stores (core/stream_copy.h), kTrials times each: the faster decides how
//      the group writes its staging memory.
// Rank 0 decides and publishes the result with one more step, so every rank
// of the group chooses the same way. About 1 ms on two cores (0.8-1.4 ms
// measured on a Zen 5 guest, the block being 1 MiB there).
// The placement can change while a group lives (seconds to minutes), so the
// group probes again while collectives run, once a second by default
// (RSDP_REPROBE_MS): about 1 ms a second, 0.1%.
//
// [Note: re-probing on rank 0's clock]
// Every rank must probe before the same collective, and clocks differ between
// processes, so one rank decides: at the start of collective #n, when its
// interval has passed, group rank 0 writes n + 1 into its control block
// (RankCtl::probe_at) before its first step of #n. Every collective waits for
// every rank's step (exchange(); a collective after ring steps waits for all
// peers first), so no rank finishes #n without having seen the write, and
// each one, starting #n + 1, finds its number there and probes first. Counting
// collectives instead (every 4096, as first built) made the interval depend on
// the message size: a benchmark's 1,300 collectives never met a second probe
// while the placement moved under them within seconds.
#pragma once

#include <chrono>
#include <string>

namespace rsdp {

class ShmComm;

struct Handoff {
  bool measured = false;  // false: one rank, or more ranks than CPUs (time-sliced)
  uint64_t probes = 0;    // how many times the group has probed (1 when made)
  // Of those, how many group rank 0 asked for early, its collectives' work
  // having slowed (transport/shm/slow_watch.h); counted on group rank 0 only.
  uint64_t early = 0;
  double step_ns = 0;     // fastest round trip of one exchange() step
  double pull_gbps = 0;   // GB/s of copying a half another core just wrote
  double cached_gbps = 0;    // GB/s of a hand-off (write, step, read) with cached stores
  double streamed_gbps = 0;  // the same with streaming stores
  bool far = false;     // the ranks do not share a cache: see handoff_probe.cpp
  bool stream = false;  // streaming stores measured clearly faster: the group uses them
  std::string mode() const { return !measured ? "unmeasured" : far ? "far" : "near"; }
};

// Runs the probe over `c` (collective: every rank of the group calls it).
Handoff probe_handoff(ShmComm& c, std::chrono::milliseconds timeout);

}  // namespace rsdp
