#include "algorithms/group_comm.h"

#include <iostream>

namespace rsdp {

Group node_group(const Group& g, const Topology& t) {
  Group n;
  n.rank = t.local_rank();
  n.name = g.name + "/node" + std::to_string(t.node());
  n.timeout = g.timeout;
  n.generation = g.generation;
  n.scope = g.scope + "node" + std::to_string(t.node()) + "/";
  for (int r : t.nodes[t.node()]) {
    n.global_ranks.push_back(g.global(r));
    n.peers.push_back(g.peers[r]);
  }
  n.size = static_cast<int>(n.peers.size());
  return n;
}

GroupComm::GroupComm(const Group& g, Bootstrap& store, const Options& o)
    : group(g), opts(o) {
  std::vector<std::string> ids;
  for (const auto& p : group.peers) ids.push_back(p.node);
  topo = Topology::from_node_ids(ids, group.rank);
  if (opts.debug)
    std::cerr << group.me() << ": group '" << group.name << "' topology: " << topo.describe()
              << "; this rank is node " << topo.node() << " local rank " << topo.local_rank()
              << "/" << topo.local_size() << std::endl;
  if (topo.num_nodes() == 1) {
    shm = std::make_unique<ShmComm>(group, store, opts, &traffic);
  } else {
    // The one-copy paths over the pool serve single-node groups only.
    Options node_opts = opts;
    node_opts.pool_bytes = 0;
    shm = std::make_unique<ShmComm>(node_group(group, topo), store, node_opts, &traffic);
    net = std::make_unique<NetComm>(group, topo.node_of, store, opts, &traffic, &shm->notice());
  }
}

GroupComm::~GroupComm() = default;

void GroupComm::begin_net(OpDesc desc, std::chrono::milliseconds timeout) {
  desc.seq = ++net_seq_;
  net->begin(desc, Deadline(timeout));
}

void GroupComm::abort(const std::string& why) {
  if (device) device->abort(why);
  shm->abort(why);
  if (net) net->abort(why);
}

void GroupComm::spread() noexcept {
  if (!net || !shm->notice().posted()) return;
  try {
    net->spread();
  } catch (...) {
    // The failure is already raised to the caller; the others still have
    // their own waits and deadlines.
  }
}

}  // namespace rsdp
