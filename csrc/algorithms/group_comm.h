// Everything a process group communicates through: its topology, the shared
// memory of its node, and (when it spans nodes) the network.
//
// On one node, `shm` covers the whole group and the network is never opened.
// Across nodes, `shm` covers only this node's ranks (a subgroup numbered by
// local rank) and `net` connects every pair of group ranks. Hierarchical
// algorithms compose flat ones on these two; see algorithms/collectives.h.
#pragma once

#include <cstdint>
#include <memory>

#include "algorithms/device_collectives.h"
#include "core/bootstrap.h"
#include "core/compression.h"
#include "core/group.h"
#include "core/options.h"
#include "core/topology.h"
#include "core/traffic.h"
#include "transport/shm/shm_comm.h"
#include "transport/ucx/net_comm.h"

namespace rsdp {

struct GroupComm {
  GroupComm(const Group& group, Bootstrap& store, const Options& opts);
  ~GroupComm();

  Group group;
  Topology topo;
  Options opts;
  Traffic traffic;
  // What crosses nodes block-quantised (off by default). Changed only on
  // the worker, between ops (BackendRSDP::set_compression).
  Compression compression;
  std::unique_ptr<ShmComm> shm;  // this node's ranks
  std::unique_ptr<NetComm> net;  // null on one node
  // GPU collectives of the group, made by the first op on device tensors;
  // declared last so it goes first (it uses shm and net).
  std::unique_ptr<DeviceCollectives> device;
  // Set by the backend while an op on device tensors runs: the entries in
  // collectives.h then hand the op to `device`.
  bool device_op = false;

  bool multi_node() const { return net != nullptr; }
  int rank() const { return group.rank; }
  int size() const { return group.size; }

  // Starts a collective that crosses nodes: numbers it (all ranks count the
  // same collectives, so the numbers agree) and hands it to the network.
  void begin_net(OpDesc desc, std::chrono::milliseconds timeout);

  // Makes every wait fail with `why` and tells the other members (the
  // notice, core/notice.h).
  void abort(const std::string& why);
  // After an op failed, on the thread that runs collectives: if the failure
  // broke the group, carry it to the other nodes (when this rank reported
  // it) and leave the network side broken too. Never throws.
  void spread() noexcept;

 private:
  uint64_t net_seq_ = 0;
};

// The subgroup of `g` on this rank's node, numbered by local rank; its store
// keys live apart from the parent's.
Group node_group(const Group& g, const Topology& t);

}  // namespace rsdp
