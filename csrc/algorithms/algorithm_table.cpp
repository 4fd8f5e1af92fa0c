// The entry points of every row of algorithms.def, by Algo.
#include "algorithms/algorithm_table.h"

namespace rsdp {
namespace {

constexpr AlgoEntry kEntries[] = {
#define RSDP_ALGORITHM(id, name, where, ops, forceable, applies, run) {coll::applies, coll::run},
#include "algorithms/algorithms.def"
#undef RSDP_ALGORITHM
};
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kNumAlgos);

}  // namespace

const AlgoEntry& algo_entry(Algo a) { return kEntries[static_cast<int>(a)]; }

}  // namespace rsdp
