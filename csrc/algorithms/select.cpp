#include "algorithms/select.h"

#include <string>

namespace rsdp {

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kShm: return "shm";
    case Algo::kOneshot: return "oneshot";
    case Algo::kRsAg: return "rs_ag";
    case Algo::kHier: return "hier";
    case Algo::kLeaders: return "hier (leaders)";
    case Algo::kRd: return "rd";
    case Algo::kRing: return "ring";
    case Algo::kTree: return "tree";
    case Algo::kFlat: return "flat";
  }
  return "?";
}

namespace {

const std::string& forced(OpKind op, const Options& o) {
  static const std::string kAuto = "auto";
  switch (op) {
    case OpKind::kAllreduce: return o.algo_allreduce;
    case OpKind::kAllgather: return o.algo_allgather;
    case OpKind::kReduceScatter: return o.algo_reduce_scatter;
    case OpKind::kBroadcast: return o.algo_broadcast;
    case OpKind::kReduce: return o.algo_reduce;
    case OpKind::kBarrier: return o.algo_barrier;
    default: return kAuto;
  }
}

}  // namespace

Algo select_algo(OpKind op, size_t bytes, const Topology& topo, const Options& opts,
                 size_t shm_half_bytes) {
  const std::string& want = forced(op, opts);
  if (topo.num_nodes() == 1) {
    if (op != OpKind::kAllreduce) return Algo::kShm;
    if (want == "oneshot" && bytes <= shm_half_bytes) return Algo::kOneshot;
    if (want == "rs_ag") return Algo::kRsAg;
    return bytes <= opts.oneshot_bytes && bytes <= shm_half_bytes ? Algo::kOneshot : Algo::kRsAg;
  }
  // Several nodes.
  switch (op) {
    case OpKind::kAllreduce: {
      if (want == "ring") return Algo::kRing;
      if (want == "rd") return Algo::kRd;
      // Small messages: rounds cost more than bytes, so only the leaders talk,
      // in log2(nodes) rounds; any node sizes work.
      if (bytes <= opts.oneshot_bytes) return Algo::kLeaders;
      if (!topo.uniform()) return Algo::kRing;  // rails pair equal nodes only
      if (want == "hier") return Algo::kHier;
      return topo.local_size() > 1 ? Algo::kHier : Algo::kRing;
    }
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      // Pairing local ranks across nodes needs nodes of equal size.
      if (want == "ring" || !topo.uniform()) return Algo::kRing;
      if (want == "hier") return Algo::kHier;
      // One rank per node: the rails are the whole group, hier == ring.
      return topo.local_size() > 1 ? Algo::kHier : Algo::kRing;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return want == "tree" ? Algo::kTree : Algo::kHier;
    case OpKind::kBarrier:
      return want == "flat" ? Algo::kFlat : Algo::kHier;
    default:
      return Algo::kFlat;
  }
}

}  // namespace rsdp
