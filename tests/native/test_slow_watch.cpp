// Standalone test of csrc/transport/shm/slow_watch.cpp: when a group's
// collectives count as slowed ([Note: a placement that changes under a group]).
//   g++ -O1 -std=c++17 -I csrc tests/native/test_slow_watch.cpp csrc/transport/shm/slow_watch.cpp
//   ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include "check.h"
#include "transport/shm/slow_watch.h"

using rsdp::OpKind;
using rsdp::SlowWatch;

namespace {

constexpr uint64_t kMiB = 1u << 20;

// `n` 1 MiB all-reduces of `ns` each.
void feed(SlowWatch& w, int n, uint64_t ns, OpKind kind = OpKind::kAllreduce,
          uint64_t bytes = kMiB) {
  for (int i = 0; i < n; ++i) w.sample(kind, bytes, ns);
}

}  // namespace

int main() {
  {
    // The typical time is the median of the first kWarm samples: one fast outlier among
    // them does not make the usual time look slow.
    SlowWatch w;
    feed(w, 1, 10'000);
    feed(w, SlowWatch::kWarm - 1, 45'000);
    feed(w, 100, 60'000);  // 1.33x: noise, not a move
    CHECK(!w.slow(), "1.33x the typical time counted as slow");
    feed(w, SlowWatch::kSlow - 1, 100'000);
    CHECK(!w.slow(), "slow after %d samples, before kSlow", SlowWatch::kSlow - 1);
    feed(w, 1, 100'000);
    CHECK(w.slow(), "kSlow samples at 2.2x the typical time not slow");
    // A slowdown that dips below the factor now and then still counts: 3 of 4 slow.
    w.reset();
    feed(w, SlowWatch::kWarm, 45'000);
    for (int i = 0; i < SlowWatch::kWindow / 4 && !w.slow(); ++i) {
      feed(w, 3, 100'000);
      feed(w, 1, 50'000);
    }
    CHECK(w.slow(), "3 of every 4 samples at 2.2x not slow");
    // Ordinary samples push the slow ones out of the window.
    feed(w, SlowWatch::kWindow - SlowWatch::kSlow + 1, 45'000);
    CHECK(!w.slow(), "still slow after typical samples");
  }
  {
    // Judged only against the same kind and size: a 16 MiB all-reduce is not a slow 1 MiB one,
    // nor an all-gather a slow all-reduce.
    SlowWatch w;
    feed(w, SlowWatch::kWarm, 45'000);
    feed(w, SlowWatch::kWindow * 2, 900'000, OpKind::kAllreduce, 16 * kMiB);
    feed(w, SlowWatch::kWindow * 2, 200'000, OpKind::kAllgather, kMiB);
    CHECK(!w.slow(), "other kinds and sizes judged against the 1 MiB all-reduce");
    feed(w, SlowWatch::kSlow, 100'000);
    CHECK(w.slow(), "the 1 MiB all-reduce's slowdown missed among other ops");
  }
  {
    // After a reset (a probe) the slow time is the new typical one, not a reason to probe
    // at every collective.
    SlowWatch w;
    feed(w, SlowWatch::kWarm, 45'000);
    feed(w, SlowWatch::kSlow, 100'000);
    CHECK(w.slow(), "not slow before the reset");
    w.reset();
    CHECK(!w.slow(), "slow right after the reset");
    feed(w, SlowWatch::kWarm + SlowWatch::kWindow * 4, 100'000);
    CHECK(!w.slow(), "the new normal counted as slow");
  }
  {
    // Nothing is judged before kWarm samples, and empty ops are not samples.
    SlowWatch w;
    feed(w, SlowWatch::kWarm - 1, 45'000);
    w.sample(OpKind::kAllreduce, 0, 1'000'000'000);
    CHECK(!w.slow(), "judged before its baseline");
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
