#include "transport/shm/handoff_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/op_desc.h"
#include "core/stream_copy.h"
#include "transport/shm/shm_comm.h"

namespace rsdp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRounds = 64;
constexpr int kTrials = 4;  // hand-offs of a block per store mode, alternating

// The block the probe hands off: one private (L2) cache's worth, between 256 KiB and
// 2 MiB, so that with its source it spills out of the writer's private cache as a
// collective's staging traffic does ([Note: stores chosen by timing both]).
size_t probe_block_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::clamp<size_t>(l2 > 0 ? static_cast<size_t>(l2) : 1u << 20, 256u << 10, 2u << 20);
}

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// The published result, in rank 0's half of the last probe step.
struct Published {
  double step_ns;
  double pull_gbps;
  double cached_gbps;
  double streamed_gbps;
  uint32_t measured;
  uint32_t far;
  uint32_t stream;
  uint32_t pad;
};

// [Note: the far threshold]
// Measured on 2-vCPU KVM guests of an AMD EPYC host (docs/benchmarks.md, "Launch
// modes"): the fastest step between ranks whose CPUs share a cache takes
// 50-80 ns; in the launches where a 1 MiB all-reduce ran 2.5x slower it took
// 180 ns. The fastest of the rounds is the hardware's cost (preemption and a
// busy machine only add). It names the placement (`mode`); the stores are
// chosen by timing both ([Note: stores chosen by timing both]).
constexpr double kFarStepNs = 120.0;

// [Note: stores chosen by timing both]
// Streaming stores pay off when a line crossing between the two caches costs
// more than two trips to memory. The step time stood for that at first (far:
// stream), but on this kind of host it misleads both ways: a hyperthread
// sibling busy with another guest stretches the step while the caches are
// still shared, and in some far launches cached copies were still the faster
// (bench_shm_stores: step 200 ns, 1 MiB cached 192 us / streaming 291). So the
// probe times the pattern itself: ranks 0 and 1 each copy a block into their
// staging half at once, then each copies the other's out, and the next round
// they write the same lines again (taking them back from the peer's cache, as
// a collective does two steps later), in either mode, alternating; the best
// round of each is compared. The block is one L2's worth: on a Zen 5 host (1
// MiB L2) a 256 or 512 KiB block, with its source, stayed in the private
// caches and timed both modes alike in far launches (cached 12-16 GB/s,
// streaming 12-18) while the collectives there ran 1.7-1.9x faster streaming
// from 1 MiB; with 1 MiB blocks far launches timed cached 5-6 GB/s against
// streaming 17, near ones cached 16-27 against 11-12, and the choice was the
// faster setting at 64 KiB, 1 MiB and 16 MiB in every launch.
// Streaming is chosen only when clearly faster, since a near launch loses
// 20-50% with it.
constexpr double kStreamGain = 0.85;

}  // namespace

Handoff probe_handoff(ShmComm& c, std::chrono::milliseconds timeout) {
  Handoff h;
  const int n = c.size();
  if (n < 2) return h;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  // Time-sliced ranks measure the scheduler, not the caches; every rank sees
  // the same n and CPU count, so all skip the probe alike.
  if (cpus > 0 && n > cpus) return h;
  const size_t pull = std::min(probe_block_bytes(), c.half_bytes()) / 64 * 64;
  c.begin(
      OpDesc::make(OpKind::kBarrier, DType::kUInt8, kRounds, RedOp::kSum, -1, kHandoffProbeTag),
      timeout);
  std::vector<double> steps;
  steps.reserve(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    const auto t0 = Clock::now();
    c.exchange();
    steps.push_back(ns_since(t0));
  }
  // Ranks 0 and 1 write their halves at once, then read each other's at
  // once: the traffic of a collective's step, both ways across the caches.
  // Two exchanges per round, so each writes the same half every round.
  const bool pair = c.rank() <= 1;
  // Kept by the thread between probes: fresh pages would add their faults to
  // every re-probe (a thread runs the collectives of one group at a time).
  thread_local std::vector<char> src, dst;
  if (pair && src.size() < pull) {
    src.assign(pull, 1);
    dst.assign(pull, 0);
  }
  double best[2] = {0, 0}, read_ns = 0;
  for (int i = 0; i < 2 * kTrials; ++i) {
    const int mode = i % 2;  // 0 cached, 1 streaming
    const auto t0 = Clock::now();
    if (pair) {
      if (mode) stream_copy(c.stage(), src.data(), pull);
      else std::memcpy(c.stage(), src.data(), pull);
    }
    c.exchange();
    const auto t1 = Clock::now();
    if (pair) std::memcpy(dst.data(), c.peer(1 - c.rank()), pull);
    const double read = ns_since(t1);
    c.exchange();  // the round ends when both have read
    if (c.rank() == 0) {
      const double round = ns_since(t0);
      best[mode] = i < 2 ? round : std::min(best[mode], round);
      if (!mode) read_ns = i == 0 ? read : std::min(read_ns, read);
    }
  }
  if (c.rank() == 0) {
    auto gbps = [&](double ns) { return pull / std::max(ns, 1.0); };
    Published p{*std::min_element(steps.begin(), steps.end()), gbps(read_ns), gbps(best[0]),
                gbps(best[1]), 1, 0, 0, 0};
    p.far = p.step_ns > kFarStepNs;
    p.stream = best[1] < kStreamGain * best[0];
    std::memcpy(c.stage(), &p, sizeof p);
  }
  c.exchange();  // not payload: the traffic counters leave it out
  Published p;
  std::memcpy(&p, c.peer(0), sizeof p);
  h.measured = p.measured != 0;
  h.step_ns = p.step_ns;
  h.pull_gbps = p.pull_gbps;
  h.cached_gbps = p.cached_gbps;
  h.streamed_gbps = p.streamed_gbps;
  h.far = p.far != 0;
  h.stream = p.stream != 0;
  return h;
}

}  // namespace rsdp
