#include "algorithms/select.h"

namespace rsdp {
namespace {

// Whether `a` can run the op on this group.
bool can_run(const AlgoInfo& a, const Choice& c) {
  const Where here = c.topo.num_nodes() == 1 ? Where::kOneNode : Where::kSeveralNodes;
  return a.where == here && a.serves(c.op) && algo_entry(a.id).applies(c);
}

// The policy without RSDP_ALGO_<OP>.
Algo automatic(const Choice& c) {
  const Topology& topo = c.topo;
  if (topo.num_nodes() == 1) {
    if (c.op != OpKind::kAllreduce) return Algo::kShm;
    return c.bytes <= c.opts.oneshot_bytes && c.bytes <= c.shm_half_bytes ? Algo::kOneshot
                                                                          : Algo::kRsAg;
  }
  // Several nodes.
  switch (c.op) {
    case OpKind::kAllreduce:
      // Small messages: rounds cost more than bytes, so only the leaders talk,
      // in log2(nodes) rounds; any node sizes work.
      if (c.bytes <= c.opts.oneshot_bytes) return Algo::kLeaders;
      if (!topo.uniform()) return Algo::kRing;  // rails pair equal nodes only
      return topo.local_size() > 1 ? Algo::kHier : Algo::kRing;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      // Pairing local ranks across nodes needs nodes of equal size.
      if (!topo.uniform()) return Algo::kRing;
      // One rank per node: the rails are the whole group, hier == ring.
      return topo.local_size() > 1 ? Algo::kHier : Algo::kRing;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
    case OpKind::kBarrier:
      return Algo::kHier;
    default:
      return Algo::kFlat;
  }
}

}  // namespace

Algo select_algo(OpKind op, size_t bytes, const Topology& topo, const Options& opts,
                 size_t shm_half_bytes) {
  const Choice c{op, bytes, topo, opts, shm_half_bytes};
  const AlgoInfo* forced = find_algo(op, opts.forced_algo(op));
  if (forced && can_run(*forced, c)) return forced->id;
  return automatic(c);
}

}  // namespace rsdp
