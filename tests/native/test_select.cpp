// The automatic choice of the cross-node all-reduce (csrc/algorithms/select.cpp): the
// leaders' path up to kOneshotBytes, then the rails' ring or recursive halving + doubling
// (rhd) as the alpha-beta model of select.h says ([Note: rails' all-reduce model]).
// Builds select.cpp alone: the table's entry points are stubbed (every forced row applies).
#include <string>
#include <vector>

#include "algorithms/select.h"
#include "check.h"

namespace rsdp {
// Only a forced name consults a row's entry points; here every row applies.
const AlgoEntry& algo_entry(Algo) {
  static const AlgoEntry e{[](const Choice&) { return true; }, nullptr};
  return e;
}
}  // namespace rsdp

using namespace rsdp;

namespace {

// m nodes of l ranks each (or the sizes in `uneven`), seen from rank 0.
Topology nodes(int m, int l, std::vector<int> uneven = {}) {
  if (uneven.empty()) uneven.assign(m, l);
  std::vector<std::string> ids;
  for (size_t n = 0; n < uneven.size(); ++n)
    for (int r = 0; r < uneven[n]; ++r) ids.push_back("node" + std::to_string(n));
  return Topology::from_node_ids(ids, 0);
}

Algo pick(const Topology& t, size_t bytes, const Options& o = Options{}) {
  return select_algo({OpKind::kAllreduce, bytes, t, o, 1u << 20, Where::kSeveralNodes, false});
}

const char* name(Algo a) { return algo_name(a); }

}  // namespace

int main() {
  constexpr size_t KiB = 1u << 10, MiB = 1u << 20;
  // The model itself: the same messages at two nodes, rhd's fewer rounds at a power of two,
  // the fold's extra bytes at 3 nodes, a crossover that grows with M otherwise.
  static_assert(!net_allreduce_prefers_rhd(64 * KiB, 2));
  static_assert(!net_allreduce_prefers_rhd(64 * KiB, 3));
  static_assert(net_allreduce_prefers_rhd(1u << 30, 4) && net_allreduce_prefers_rhd(1u << 30, 64));
  static_assert(net_allreduce_prefers_rhd(64 * KiB, 5) && !net_allreduce_prefers_rhd(64 * MiB, 5));
  static_assert(net_allreduce_prefers_rhd(4 * MiB, 63) && !net_allreduce_prefers_rhd(64 * MiB, 63));

  struct Case { int m, l; size_t bytes; Algo want; };
  const Case cases[] = {
      {4, 2, 32 * KiB, Algo::kLeaders},         // small: the leaders' recursive doubling
      {2, 2, 1 * MiB, Algo::kHier},             // two nodes: ring == rhd, keep the ring
      {2, 1, 1 * MiB, Algo::kRing},
      {3, 2, 1 * MiB, Algo::kHier},             // three: the fold costs what rhd saves
      {3, 2, 33 * KiB, Algo::kHier},
      {4, 2, 33 * KiB, Algo::kHierRhd},         // powers of two: rhd at any size
      {4, 2, 256 * MiB, Algo::kHierRhd},
      {8, 8, 1 * MiB, Algo::kHierRhd},
      {64, 8, 1 * MiB, Algo::kHierRhd},
      {4, 1, 1 * MiB, Algo::kRhd},              // one rank per node: rhd over all ranks
      {5, 2, 64 * KiB, Algo::kHierRhd},         // other M: rhd below the crossover ...
      {5, 2, 64 * MiB, Algo::kHier},            // ... the ring above it
      {63, 4, 4 * MiB, Algo::kHierRhd},
      {63, 4, 64 * MiB, Algo::kHier},
      {63, 1, 64 * MiB, Algo::kRing},
  };
  for (const Case& c : cases) {
    const Algo got = pick(nodes(c.m, c.l), c.bytes);
    CHECK(got == c.want, "%d nodes x %d, %zu B: %s, expected %s", c.m, c.l, c.bytes, name(got),
          name(c.want));
  }
  // The automatic choice follows the model at every size and node count.
  for (int m = 3; m <= 40; ++m)
    for (size_t b = 64 * KiB; b <= 256 * MiB; b *= 2) {
      const Algo got = pick(nodes(m, 2), b);
      const Algo want = net_allreduce_prefers_rhd(b, m) ? Algo::kHierRhd : Algo::kHier;
      CHECK(got == want, "%d nodes x 2, %zu B: %s, expected %s", m, b, name(got), name(want));
    }
  // Nodes of unequal size have no rails: the flat ring, as before.
  CHECK(pick(nodes(0, 0, {1, 2, 2, 2}), 1 * MiB) == Algo::kRing, "uneven nodes");
  // Forced: hier_rhd and rhd are names of the all-reduce's variable.
  Options forced;
  forced.algo[static_cast<size_t>(OpKind::kAllreduce)] = "rhd";
  CHECK(pick(nodes(3, 2), 1 * MiB, forced) == Algo::kRhd, "forced rhd");
  forced.algo[static_cast<size_t>(OpKind::kAllreduce)] = "hier_rhd";
  CHECK(pick(nodes(3, 2), 1 * MiB, forced) == Algo::kHierRhd, "forced hier_rhd");
  const std::string names = " " + algo_choices(OpKind::kAllreduce) + " ";
  CHECK(names.find(" hier_rhd ") != std::string::npos && names.find(" rhd ") != std::string::npos,
        "choices: %s", names.c_str());
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
