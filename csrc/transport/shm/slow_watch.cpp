#include "transport/shm/slow_watch.h"

#include <algorithm>

namespace rsdp {

// [Note: a placement that changes under a group]
// The host moves the guest's vCPUs while a group lives (seconds to minutes
// apart), and the staging stores the probe chose go wrong with the move:
// cached stores after the vCPUs move apart, streaming stores after they move
// together. A 2-rank 1 MiB all-reduce, a rank pinned to each core, in windows
// of 1000 ops for 60 s (benchmarks/placement_watch.py): 45 us near with
// cached stores, 64 far with streaming ones; 117-120 us for the 520 ms until
// the periodic re-probe after a move apart, 101-117 for 600 ms after a move
// together. The collectives show such a move at once, so group rank 0 (which
// decides when the group probes) times each one from its start to its end
// less the wait at its first step (a late peer is not a slow placement), and
// asks for a probe when kSlow of its last kWindow collectives took kFactor
// times the typical one of their kind and size: the median of the first
// kWarm since the last probe (the fastest one instead made noise a slowdown:
// 56 early probes a minute, most in a steady placement; kSlow in a row
// missed moves whose collectives dipped below the factor now and then). The
// baseline restarts with every probe, so a slowdown the probe finds no cause
// for becomes the new normal rather than a probe every kWindow collectives,
// and an early probe comes at least 50 ms after the last one
// (ShmComm::kEarlyReprobeGap). Ring steps and ops under 256 KiB are not
// timed. The same watch after the change: docs/benchmarks.md, "A placement
// that changes under a group".
void SlowWatch::sample(OpKind kind, uint64_t bytes, uint64_t ns) {
  if (bytes == 0) return;
  int cls = 0;
  while (cls < kSizeClasses - 1 && (bytes >> (cls + 1)) != 0) ++cls;
  Baseline& b = base_[static_cast<int>(kind) * kSizeClasses + cls];
  const float per_byte = static_cast<float>(ns) / static_cast<float>(bytes);
  if (b.n < kWarm) {
    b.warm[b.n++] = per_byte;
    if (b.n == kWarm) {
      std::array<float, kWarm> w = b.warm;
      std::nth_element(w.begin(), w.begin() + kWarm / 2, w.end());
      b.typical = w[kWarm / 2];
    }
    return;
  }
  history_ = (history_ << 1) | (per_byte > kFactor * b.typical ? 1u : 0u);
}
void SlowWatch::reset() {
  base_.fill(Baseline{});
  history_ = 0;
}

}  // namespace rsdp
