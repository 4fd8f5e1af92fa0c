// Picks a collective's algorithm (a row of algorithm_table.h) from (op,
// bytes, topology) and the RSDP_ALGO_<OP> overrides. A forced name that
// does not apply to the group (a single-node algorithm on several nodes, a
// hierarchical one on nodes of unequal size; the row's `where` and
// `applies`) falls back to the automatic choice, as UCC does for
// unsupported algorithms.
#pragma once

#include <cstddef>

#include "algorithms/algorithm_table.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/topology.h"

namespace rsdp {

// `bytes` is the op's total payload (for allreduce: the buffer).
Algo select_algo(OpKind op, size_t bytes, const Topology& topo, const Options& opts,
                 size_t shm_half_bytes);

}  // namespace rsdp
