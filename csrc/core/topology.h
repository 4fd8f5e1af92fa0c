// Where the ranks of a process group live: which node each one is on, its
// local rank there, the rails and the leaders. Derived from the node identity
// every rank published at join time (core/group.h), so every rank computes the
// same answer without further communication.
//
// Words (docs/architecture.md, Layers; the rules in Node topology): a *node*
// is a set of ranks sharing memory; *local rank* is the position on the node
// (by group rank); a *rail* is the set of ranks with one local rank across
// all nodes; a *leader* is local rank 0. Nodes are numbered in the order of
// their lowest group rank.
#pragma once

#include <string>
#include <vector>

namespace rsdp {

struct Topology {
  int rank = 0;                         // this rank (group rank)
  std::vector<int> node_of;             // group rank -> node index
  std::vector<int> local_rank_of;       // group rank -> local rank
  std::vector<std::vector<int>> nodes;  // node index -> its group ranks, ascending

  static Topology from_node_ids(const std::vector<std::string>& node_ids, int rank);

  int size() const { return static_cast<int>(node_of.size()); }
  int num_nodes() const { return static_cast<int>(nodes.size()); }
  int node() const { return node_of[rank]; }
  int local_rank() const { return local_rank_of[rank]; }
  int local_size() const { return static_cast<int>(nodes[node()].size()); }
  bool same_node(int a, int b) const { return node_of[a] == node_of[b]; }
  // Every node holds the same number of ranks (hierarchical algorithms that
  // pair local ranks across nodes need this).
  bool uniform() const;
  // Group ranks with local rank `l`, one per node that has one, by node.
  std::vector<int> rail(int local_rank) const;
  std::vector<int> leaders() const;
  // Group ranks, ranks of one node adjacent, nodes in order (the ring order).
  std::vector<int> node_major_order() const;
  // "2 nodes x 2 ranks: node 0 = {0,1}, node 1 = {2,3}"
  std::string describe() const;
};

}  // namespace rsdp
