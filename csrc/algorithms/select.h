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

// The one-shot threshold of reduce for host or device buffers
// (RSDP_ONESHOT_BYTES, RSDP_CUDA_ONESHOT_BYTES).
inline size_t oneshot_bytes(const Options& opts, bool device) {
  return device ? opts.cuda_oneshot_bytes : opts.oneshot_bytes;
}

// The largest single-node all-reduce that runs one-shot rather than reduce-scatter +
// all-gather: RSDP_CUDA_ONESHOT_BYTES for device buffers, RSDP_ONESHOT_BYTES where it is
// set, else kNodeAllreduceOneshotBytes (select.cpp, [Note: one-shot bound]).
constexpr size_t kNodeAllreduceOneshotBytes = 8u << 10;
inline size_t allreduce_oneshot_bytes(const Options& opts, bool device) {
  if (device) return opts.cuda_oneshot_bytes;
  return opts.oneshot_set ? opts.oneshot_bytes : kNodeAllreduceOneshotBytes;
}

}  // namespace rsdp
