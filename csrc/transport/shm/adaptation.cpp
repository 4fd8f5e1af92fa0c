#include "transport/shm/adaptation.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/op_desc.h"
#include "core/stream_copy.h"
#include "transport/staging.h"

namespace rsdp {
namespace {

using Clock = std::chrono::steady_clock;

// Round trips timed; the fastest is the hardware's cost (preemption and a busy
// machine only add to a round).
constexpr int kRounds = 64;
// Hand-offs of the block per kind of store, alternating, so that a change of
// the machine's load during the probe weighs on both alike.
constexpr int kTrials = 4;
// A step within a shared cache takes well under this; one across caches well
// over it. It only names the placement (Handoff::far): the stores are chosen
// by timing both.
constexpr double kFarStepNs = 120.0;
// Streaming is chosen only when clearly faster: where the caches are shared it
// loses to cached stores, so a tie goes to them.
constexpr double kStreamGain = 0.85;

// The block the probe hands off: one private (L2) cache's worth, so that with
// its source it spills out of the writer's private cache as a collective's
// staging traffic does; a smaller block stays in the private caches and times
// both kinds of store alike whatever the placement.
size_t probe_block_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::clamp<size_t>(l2 > 0 ? static_cast<size_t>(l2) : 1u << 20, 256u << 10, 2u << 20);
}

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// The verdict, in rank 0's half of the probe's last step.
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

// The probe's steps ([Note: adapting to the placement]).
Published measure(Staging& c, std::chrono::milliseconds timeout) {
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
  // Two exchanges per round, so each writes the same half every round and
  // takes its lines back from the peer's cache, as a collective does two
  // steps later.
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
    const int streamed = i % 2;
    const auto t0 = Clock::now();
    if (pair) {
      if (streamed) stream_copy(c.stage(), src.data(), pull);
      else std::memcpy(c.stage(), src.data(), pull);
    }
    c.exchange();
    const auto t1 = Clock::now();
    if (pair) std::memcpy(dst.data(), c.peer(1 - c.rank()), pull);
    const double read = ns_since(t1);
    c.exchange();  // the round ends when both have read
    if (c.rank() == 0) {
      const double round = ns_since(t0);
      best[streamed] = i < 2 ? round : std::min(best[streamed], round);
      if (!streamed) read_ns = i == 0 ? read : std::min(read_ns, read);
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
  return p;
}

}  // namespace

Adaptation::Adaptation(AdaptMode mode, int rank, int size, std::atomic<uint64_t>* probe_at,
                       std::string forced_stores)
    : mode_(mode), rank_(rank), size_(size), probe_at_(probe_at),
      forced_stores_(std::move(forced_stores)) {
  streaming_.store(forced_stores_ == "streaming", std::memory_order_relaxed);
}

void Adaptation::probe(Staging& steps, std::chrono::milliseconds timeout) {
  // Time-sliced ranks would measure the scheduler, not the caches; every rank
  // sees the same size and CPU count (and rank 0's mode), so all skip alike.
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (mode_ == AdaptMode::kOff || size_ < 2 || (cpus > 0 && size_ > cpus)) return;
  probing_ = true;
  probed_time_ = Clock::now();
  Published p;
  try {
    p = measure(steps, timeout);
  } catch (...) {
    probing_ = false;
    throw;
  }
  probing_ = false;
  Handoff h;
  h.measured = p.measured != 0;
  h.step_ns = p.step_ns;
  h.pull_gbps = p.pull_gbps;
  h.cached_gbps = p.cached_gbps;
  h.streamed_gbps = p.streamed_gbps;
  h.far = p.far != 0;
  h.stream = p.stream != 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    h.probes = handoff_.probes + 1;
    handoff_ = h;
  }
  measured_ = h.measured;
  if (forced_stores_.empty()) streaming_.store(h.stream, std::memory_order_relaxed);
}

bool Adaptation::due(uint64_t seq) {
  if (probing_ || mode_ != AdaptMode::kContinuous || !measured_) return false;
  if (rank_ == 0 && Clock::now() - probed_time_ >= kReprobeInterval &&
      probe_at_->load(std::memory_order_relaxed) < seq)
    probe_at_->store(seq + 1, std::memory_order_release);
  return probe_at_->load(std::memory_order_acquire) == seq;
}

}  // namespace rsdp
