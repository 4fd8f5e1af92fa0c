// Picks a collective's algorithm (a row of algorithm_table.h) from (op,
// bytes, where it runs, host or device memory) and the RSDP_ALGO_<OP>
// overrides, for host and device buffers alike. A forced name that does not
// apply (a single-node algorithm on several nodes, a hierarchical one on
// nodes of unequal size, a host-only row for device buffers; the row's
// `where`, `memory` and `applies`) falls back to the automatic choice, as UCC
// does for unsupported algorithms.
#pragma once

#include <cstddef>

#include "algorithms/algorithm_table.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/topology.h"

namespace rsdp {

Algo select_algo(const Choice& c);

// Checks the forced names of `opts` (RSDP_ALGO_<OP>) against the table when the backend
// starts: a name the op does not take raises, naming the variable and the choices; an op
// with no choice of algorithm ignores its variable (the entry is cleared).
void check_forced_algorithms(Options& opts);

// The one-shot bounds: the largest messages for which one exchange in which every rank reduces
// every copy is chosen over two exchanges in which each reduces its share (select.cpp,
// [Note: one-shot bound]). They follow from what each costs, not from the user's job, so they
// are constants of the selection; RSDP_ALGO_ALLREDUCE forces either all-reduce algorithm.
//   kOneshotBytes: reduce on host memory; across nodes the all-reduce's leaders' path (and
//     its node stage).
//   kNodeAllreduceOneshotBytes: a single-node all-reduce on host memory.
//   kDeviceOneshotBytes: reduce and all-reduce on device buffers (CUDA IPC, the emulated
//     device): reading every peer's copy costs a GPU less than a second exchange.
constexpr size_t kOneshotBytes = 32u << 10;
constexpr size_t kNodeAllreduceOneshotBytes = 8u << 10;
constexpr size_t kDeviceOneshotBytes = 256u << 10;

// The one-shot bound of reduce for host or device buffers.
constexpr size_t oneshot_bytes(bool device) {
  return device ? kDeviceOneshotBytes : kOneshotBytes;
}

// The largest single-node all-reduce that runs one-shot rather than reduce-scatter +
// all-gather, for host or device buffers.
constexpr size_t allreduce_oneshot_bytes(bool device) {
  return device ? kDeviceOneshotBytes : kNodeAllreduceOneshotBytes;
}

}  // namespace rsdp
