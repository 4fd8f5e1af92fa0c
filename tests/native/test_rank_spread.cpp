// Standalone test of csrc/transport/shm/rank_spread.cpp: which rank of a node
// moves to which CPU when the kernel has stacked more of them on one CPU than
// an even spread puts there ([Note: ranks the kernel stacks]).
//   g++ -O1 -std=c++17 -I csrc tests/native/test_rank_spread.cpp csrc/transport/shm/rank_spread.cpp
//   ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include <vector>

#include "check.h"
#include "transport/shm/rank_spread.h"

using rsdp::spread_target;

namespace {

// Every rank's target from one snapshot.
std::vector<int> targets(const std::vector<int>& cpus, const std::vector<int>& allowed) {
  std::vector<int> t;
  for (int r = 0; r < static_cast<int>(cpus.size()); ++r)
    t.push_back(spread_target(cpus, r, allowed));
  return t;
}

using V = std::vector<int>;

}  // namespace

int main() {
  const V two{0, 1};
  // 4 ranks on 2 CPUs, three on CPU 0: the third of them (rank 2) moves to 1.
  CHECK(targets({0, 0, 0, 1}, two) == V({-1, -1, 1, -1}), "3+1");
  CHECK(targets({1, 0, 1, 1}, two) == V({-1, -1, -1, 0}), "3+1 on CPU 1: rank 3 moves");
  // All four on one CPU: the last two move, to the other CPU.
  CHECK(targets({0, 0, 0, 0}, two) == V({-1, -1, 1, 1}), "4+0");
  // Spread already (2+2), or as even as it gets (3 ranks: 2+1): nobody moves.
  CHECK(targets({0, 1, 1, 0}, two) == V({-1, -1, -1, -1}), "2+2");
  CHECK(targets({0, 0, 1}, two) == V({-1, -1, -1}), "2+1");
  CHECK(targets({1, 1, 1}, two) == V({-1, -1, 0}), "3+0 -> 2+1");
  // A rank whose CPU is not known yet: nobody moves on a partial picture.
  CHECK(targets({0, 0, 0, -1}, two) == V({-1, -1, -1, -1}), "unknown");
  // One CPU allowed (a pinned rank): never moves.
  CHECK(targets({0, 0, 0, 0}, V{0}) == V({-1, -1, -1, -1}), "pinned");
  // 8 ranks on 4 CPUs, stacked 4+3+1+0.
  {
    const V t = targets({0, 0, 0, 0, 1, 1, 1, 2}, V{0, 1, 2, 3});
    // even = 2: CPU 0 has two extra (ranks 2, 3), CPU 1 one (rank 6); slots: CPU 2 one, CPU 3 two.
    CHECK(t == V({-1, -1, 2, 3, -1, -1, 3, -1}), "4+3+1+0: %d %d %d", t[2], t[3], t[6]);
  }
  // Ranks on CPUs outside this rank's mask count on theirs and take no slot there.
  CHECK(targets({0, 0, 0, 5}, two) == V({-1, -1, 1, -1}), "a CPU outside the mask");
  // Out-of-range rank: no move.
  CHECK(spread_target({0, 0, 0, 1}, 7, two) == -1, "bad rank");
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
