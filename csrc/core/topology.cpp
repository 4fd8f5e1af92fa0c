#include "core/topology.h"

#include <sstream>
#include <unordered_map>

namespace rsdp {

Topology Topology::from_node_ids(const std::vector<std::string>& node_ids, int rank) {
  Topology t;
  t.rank = rank;
  std::unordered_map<std::string, int> index;
  for (int r = 0; r < static_cast<int>(node_ids.size()); ++r) {
    auto [it, fresh] = index.emplace(node_ids[r], static_cast<int>(t.nodes.size()));
    if (fresh) t.nodes.emplace_back();
    t.node_of.push_back(it->second);
    t.local_rank_of.push_back(static_cast<int>(t.nodes[it->second].size()));
    t.nodes[it->second].push_back(r);
  }
  return t;
}

bool Topology::uniform() const {
  for (const auto& n : nodes)
    if (n.size() != nodes[0].size()) return false;
  return true;
}

std::vector<int> Topology::rail(int l) const {
  std::vector<int> out;
  for (const auto& n : nodes)
    if (l < static_cast<int>(n.size())) out.push_back(n[l]);
  return out;
}

std::vector<int> Topology::leaders() const { return rail(0); }

std::vector<int> Topology::node_major_order() const {
  std::vector<int> out;
  for (const auto& n : nodes) out.insert(out.end(), n.begin(), n.end());
  return out;
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << num_nodes() << (num_nodes() == 1 ? " node" : " nodes");
  if (uniform()) os << " x " << nodes[0].size() << (nodes[0].size() == 1 ? " rank" : " ranks");
  os << ":";
  for (int i = 0; i < num_nodes(); ++i) {
    os << (i ? ", " : " ") << "node " << i << " = {";
    for (size_t j = 0; j < nodes[i].size(); ++j) os << (j ? "," : "") << nodes[i][j];
    os << "}";
  }
  return os.str();
}

}  // namespace rsdp
