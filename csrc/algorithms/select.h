// The one table that picks a collective's algorithm from (op, bytes,
// topology), and the RSDP_ALGO_<OP> overrides. A forced name that does not
// apply to the group (a single-node algorithm on several nodes, a
// hierarchical one on nodes of unequal size) falls back to the automatic
// choice, as UCC does for unsupported algorithms.
#pragma once

#include <cstddef>

#include "core/op_desc.h"
#include "core/options.h"
#include "core/topology.h"

namespace rsdp {

enum class Algo : uint8_t {
  kShm,      // one node: the shared-memory algorithm (the only one there)
  kOneshot,  // one node, allreduce: every rank reduces every copy
  kRsAg,     // one node, allreduce: reduce-scatter + all-gather
  kHier,     // several nodes: node stage(s) over shared memory, rails/leaders over the network
  kLeaders,  // several nodes, small allreduce: node allreduce, leaders' recursive doubling, node broadcast
  kRd,       // several nodes, allreduce: recursive doubling over all ranks through the network
  kRing,     // several nodes: ring over all ranks through the network
  kTree,     // several nodes: binomial tree over all ranks through the network
  kFlat,     // several nodes, ops with one algorithm there (gather, scatter, alltoall, barrier)
};

const char* algo_name(Algo a);

// `bytes` is the op's total payload (for allreduce: the buffer).
Algo select_algo(OpKind op, size_t bytes, const Topology& topo, const Options& opts,
                 size_t shm_half_bytes);

}  // namespace rsdp
