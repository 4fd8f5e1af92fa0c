#include "transport/shm/rank_spread.h"

#include <algorithm>
#include <map>

namespace rsdp {

// [Note: ranks the kernel stacks]
// With more ranks than cores the ranks cannot have a core each, and the
// kernel places them; now and then (after ranks slept, e.g. in set-up) it
// stacks them, 4 ranks on 2 cores as three and one, and leaves them so for
// hundreds of milliseconds: its balancer will not move a task that ran in the
// last 0.5 ms (cache-hot), and ranks in a collective all ran just now. Every
// step of a collective then waits for three ranks taking turns on one core:
// a 2-core guest, 64 KiB all-reduce, 41-55 us stacked against 21-32 spread
// (benchmarks/bench_collectives.py records `stacked`). The group knows what
// the kernel does not, that its ranks run in lock-step, so each rank
// publishes its CPU with every collective and, every RSDP_SPREAD_MS, a rank
// beyond its CPU's even share moves itself to a CPU below it: it sets its
// thread's affinity to that CPU (the kernel migrates it at once) and puts
// its mask back (nothing stays pinned). Every rank decides from the same
// published CPUs by the same rule, so two movers never pick the same slot;
// published CPUs a collective old are close enough, and a wrong move is
// undone by the next look.
int spread_target(const std::vector<int>& cpus, int me, const std::vector<int>& allowed) {
  const int n = static_cast<int>(cpus.size());
  const int c = static_cast<int>(allowed.size());
  if (c < 2 || me < 0 || me >= n) return -1;
  if (std::any_of(cpus.begin(), cpus.end(), [](int x) { return x < 0; })) return -1;
  const int even = (n + c - 1) / c;
  std::map<int, int> count;  // per allowed CPU
  for (int a : allowed) count[a] = 0;
  for (int x : cpus)
    if (count.count(x)) ++count[x];
  // Movers: per allowed CPU in ascending order, its ranks beyond the first
  // `even` in rank order. Slots: per CPU below `even`, one per missing rank.
  std::vector<int> movers, slots;
  for (const auto& [cpu, k] : count) {
    if (k > even) {
      int seen = 0;
      for (int r = 0; r < n; ++r)
        if (cpus[r] == cpu && ++seen > even) movers.push_back(r);
    }
    for (int s = k; s < even; ++s) slots.push_back(cpu);
  }
  for (size_t i = 0; i < movers.size() && i < slots.size(); ++i)
    if (movers[i] == me) return slots[i];
  return -1;
}

}  // namespace rsdp
