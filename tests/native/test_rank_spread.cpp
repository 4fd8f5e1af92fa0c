// Standalone test of csrc/transport/shm/rank_spread.cpp: which rank of a node
// moves to which CPU when the kernel has stacked more of them on one CPU than
// an even spread puts there ([Note: ranks the kernel stacks]).
//   g++ -O1 -std=c++17 -I csrc tests/native/test_rank_spread.cpp csrc/transport/shm/rank_spread.cpp
//   ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include <random>
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

// Groups over overlapping ranks of one node, each spreading its own members by
// what they published: every `round`, each group in turn looks (as its ranks
// do every few milliseconds) and its movers move. Returns the moves made until
// a whole round moved nobody, or -1 when `max_rounds` rounds never settled.
int settle(V& cpus, const std::vector<V>& groups, const V& allowed, int max_rounds) {
  int moves = 0;
  for (int round = 0; round < max_rounds; ++round) {
    int moved = 0;
    for (const V& g : groups) {
      V view;
      for (int r : g) view.push_back(cpus[r]);
      const V t = targets(view, allowed);
      for (size_t i = 0; i < g.size(); ++i)
        if (t[i] >= 0) cpus[g[i]] = t[i], ++moved;
    }
    moves += moved;
    if (moved == 0) return moves;
  }
  return -1;
}

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
  // Six ranks on two CPUs in the world group, two halves and two interleaved
  // thirds: a move one group makes can unbalance another, and the rule must
  // settle rather than trade ranks back and forth. From every stacking of the
  // six (2^6 of them) and from random ones on four CPUs with eight ranks.
  {
    const std::vector<V> six{{0, 1, 2, 3, 4, 5}, {0, 1, 2}, {3, 4, 5}, {0, 2, 4}, {1, 3, 5}};
    int worst = 0, unsettled = 0;
    for (int bits = 0; bits < 64; ++bits) {
      V cpus;
      for (int r = 0; r < 6; ++r) cpus.push_back((bits >> r) & 1);
      const int m = settle(cpus, six, two, 20);
      if (m < 0) ++unsettled;
      worst = m > worst ? m : worst;
      // Settled: every group as even as it gets.
      for (const V& g : six) {
        int on0 = 0;
        for (int r : g) on0 += cpus[r] == 0;
        const int n = static_cast<int>(g.size());
        CHECK(on0 <= (n + 1) / 2 && n - on0 <= (n + 1) / 2, "stacking %d: a group left uneven",
              bits);
      }
    }
    CHECK(unsettled == 0, "%d of 64 stackings of six ranks never settled", unsettled);
    CHECK(worst <= 6, "six ranks took %d moves to settle", worst);
    const std::vector<V> eight{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3}, {4, 5, 6, 7},
                               {0, 2, 4, 6}, {1, 3, 5, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}};
    const V four{0, 1, 2, 3};
    std::mt19937 rng(8);
    unsettled = 0;
    for (int k = 0; k < 500; ++k) {
      V cpus;
      for (int r = 0; r < 8; ++r) cpus.push_back(static_cast<int>(rng() % 4));
      if (settle(cpus, eight, four, 20) < 0) ++unsettled;
    }
    CHECK(unsettled == 0, "%d of 500 stackings of eight ranks never settled", unsettled);
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
