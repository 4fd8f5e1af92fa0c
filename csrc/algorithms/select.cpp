#include "algorithms/select.h"

#include <string>

#include "core/error.h"

namespace rsdp {
namespace {

// Whether `a` can run the op here.
bool can_run(const AlgoInfo& a, const Choice& c) {
  const bool memory_ok = !c.device || a.memory == Memory::kHostOrDevice;
  return a.where == c.where && memory_ok && a.serves(c.op) && algo_entry(a.id).applies(c);
}

// The policy without RSDP_ALGO_<OP>.
Algo automatic(const Choice& c) {
  const Topology& topo = c.topo;
  if (c.where == Where::kOneNode) {
    if (c.op != OpKind::kAllreduce) return Algo::kShm;
    // [Note: one-shot bound]
    // One-shot is one exchange, but every rank reads and reduces all n
    // copies; reduce-scatter + all-gather is two exchanges and each rank
    // reduces 1/n. The saved exchange pays only while a step's fixed cost
    // outweighs the n-fold reduction, i.e. for small messages; the two are
    // about even at kNodeAllreduceOneshotBytes (select.h), and beyond it the
    // redundant reduction loses, the more so with more ranks than cores.
    // Reduce keeps its own, larger bound (kOneshotBytes): its one-shot
    // form has the root alone reduce, repeating no rank's work, so it stays
    // ahead to a larger size.
    const size_t oneshot = allreduce_oneshot_bytes(c.device);
    return c.bytes <= oneshot && c.bytes <= c.half_bytes ? Algo::kOneshot : Algo::kRsAg;
  }
  // Several nodes.
  switch (c.op) {
    case OpKind::kAllreduce:
      // Small messages: rounds cost more than bytes, so only the leaders talk,
      // in log2(nodes) rounds; any node sizes work.
      if (c.bytes <= kOneshotBytes) return Algo::kLeaders;
      if (!topo.uniform()) return Algo::kRing;  // rails pair equal nodes only
      // The rails: a ring, or rhd where its rounds cost less than the
      // ring's ([Note: rails' all-reduce model], select.h).
      if (net_allreduce_prefers_rhd(c.bytes, topo.num_nodes()))
        return topo.local_size() > 1 ? Algo::kHierRhd : Algo::kRhd;
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

Algo select_algo(const Choice& c) {
  const AlgoInfo* forced = find_algo(c.op, c.opts.forced_algo(c.op));
  if (forced && can_run(*forced, c)) return forced->id;
  return automatic(c);
}

void check_forced_algorithms(Options& opts) {
  for (int k = 0; k < kNumOpKinds; ++k) {
    std::string& v = opts.algo[k];
    if (v.empty()) continue;
    const OpKind op = static_cast<OpKind>(k);
    const std::string names = algo_choices(op);
    if (names.empty()) {
      v.clear();
      continue;
    }
    RSDP_CHECK((" " + names + " ").find(" " + v + " ") != std::string::npos,
               "environment variable ", algo_env_var(op), "='", v,
               "' names no algorithm; choose one of: auto ", names);
  }
}

}  // namespace rsdp
