// The entry points of every row of algorithms.def, by Algo.
#include "algorithms/algorithm_table.h"

#include <string_view>

namespace rsdp {
namespace {

constexpr AlgoEntry kEntries[] = {
#define RSDP_ALGORITHM(id, name, where, memory, ops, forceable, applies, run) \
  {coll::applies, coll::run},
#include "algorithms/algorithms.def"
#undef RSDP_ALGORITHM
};
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kNumAlgos);

constexpr bool rows_well_formed() {
  for (int i = 0; i < kNumAlgos; ++i) {
    if (kAlgos[i].ops == 0) return false;
    for (int j = i + 1; j < kNumAlgos; ++j)
      if (std::string_view(kAlgos[i].name) == kAlgos[j].name) return false;
  }
  return true;
}
static_assert(rows_well_formed(), "algorithms.def: every row serves some op, under its own name");

}  // namespace

const AlgoEntry& algo_entry(Algo a) { return kEntries[static_cast<int>(a)]; }

}  // namespace rsdp
