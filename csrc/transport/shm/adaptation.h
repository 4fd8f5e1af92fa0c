// Shared memory's adaptation to where the ranks of a node run: the one place
// that measures the machine and changes how the transport copies.
//
// [Note: adapting to the placement]
// Whether two ranks' CPUs share a cache decides how a staged collective
// should write what its peer reads next. Sharing one, a written line moves to
// the peer's core within the cache, and plain (cached) stores are best; not
// sharing one (another chiplet or socket, or a virtual machine whose host
// placed its vCPUs apart), every line crosses the chip's fabric on the
// peer's read, and streaming stores, which send the lines to memory without
// fetching them first, do the same work with half the traffic. Neither the
// kernel nor the process can see the placement on a virtual machine, and its
// host may change it while a group lives, so the group times it:
//   * the probe, collective over the node's group: the fastest round trip of
//     one step (reported), then ranks 0 and 1 hand each other a block of one
//     private cache's size, the pattern every staged collective has, with
//     either kind of store, alternately; rank 0 picks the stores and
//     publishes the verdict, so every rank copies alike;
//   * the re-probe: in `continuous` mode group rank 0 asks for the probe again
//     every kReprobeInterval ([Note: re-probing on rank 0's clock]).
// The mode (RSDP_SHM_ADAPT: off, once, continuous) is group rank 0's: it
// writes it into its control block before any peer attaches, and every rank
// follows it, so the probe's steps line up on every rank.
//
// [Note: re-probing on rank 0's clock]
// Every rank must probe before the same collective, and clocks differ between
// processes, so one rank decides: at the start of collective #n, when its
// interval has passed, group rank 0 writes n + 1 into its control block
// (RankCtl::probe_at) before its first step of #n. Every collective waits for
// every rank's step (a collective after ring steps waits for all peers
// first), so no rank finishes #n without having seen the write, and each one,
// starting #n + 1, finds its number there and probes first.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/options.h"  // AdaptMode

namespace rsdp {

class Staging;

// What a hand-off between the ranks of a node costs, as the latest probe found.
struct Handoff {
  bool measured = false;  // false: one rank, more ranks than CPUs, or adaptation off
  uint64_t probes = 0;    // how many times the group has probed
  double step_ns = 0;     // fastest round trip of one step
  double pull_gbps = 0;   // GB/s of copying a half another core just wrote
  double cached_gbps = 0;    // GB/s of a hand-off (write, step, read) with cached stores
  double streamed_gbps = 0;  // the same with streaming stores
  bool far = false;     // the step is slower than one within a shared cache
  bool stream = false;  // streaming stores measured clearly faster: the group uses them
  std::string mode() const { return !measured ? "unmeasured" : far ? "far" : "near"; }
};

class Adaptation {
 public:
  // Copies smaller than this stay cached: a few lines, latency-bound, and the
  // next reader may well be this core.
  static constexpr size_t kStreamMinBytes = 4096;
  // A probe costs about a millisecond: once a second is 0.1% of the time,
  // and soon enough after the host moves a vCPU.
  static constexpr std::chrono::milliseconds kReprobeInterval{1000};

  // `mode`: group rank 0's; `probe_at`: group rank 0's RankCtl::probe_at;
  // `forced_stores`: a test's "cached" or "streaming" (else empty).
  Adaptation(AdaptMode mode, int rank, int size, std::atomic<uint64_t>* probe_at,
             std::string forced_stores);

  // The probe, over the group's steps: every rank calls it, at group creation
  // and whenever before_op() says so. Does nothing in mode off.
  void probe(Staging& steps, std::chrono::milliseconds timeout);
  // Before user collective number `seq` (ring steps excluded: their
  // neighbours may still be a step behind): whether every rank probes first.
  bool due(uint64_t seq);

  // Whether copies into the staging halves stream (any thread).
  bool streaming() const { return streaming_.load(std::memory_order_relaxed); }
  Handoff handoff() const {
    std::lock_guard<std::mutex> g(mu_);
    return handoff_;
  }
  AdaptMode mode() const { return mode_; }

 private:
  const AdaptMode mode_;
  const int rank_;
  const int size_;
  std::atomic<uint64_t>* probe_at_;
  const std::string forced_stores_;
  bool probing_ = false;  // the probe's own steps are no user collective
  bool measured_ = false;  // the last probe measured (alike on every rank)
  std::chrono::steady_clock::time_point probed_time_;
  mutable std::mutex mu_;  // handoff_ is read by other threads (topology())
  Handoff handoff_;
  std::atomic<bool> streaming_{false};
};

}  // namespace rsdp
