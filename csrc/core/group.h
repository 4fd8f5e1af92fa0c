// Who is in a process group, and the handshake that establishes it.
//
// join_group() is the first thing a new group does: every rank publishes its
// pid and node identity through the store; group rank 0 waits (with the
// group's timeout) for all of them and posts them as one peer table, which
// the others read: O(1) store requests per rank, O(size) on rank 0. A rank
// that never shows up is named in rank 0's error, which the others raise too;
// a rank 0 that never posts is named by the others at their timeout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/options.h"

namespace rsdp {

struct PeerInfo {
  int pid = 0;
  std::string node;  // node identity: RSDP_NODE_ID, or host name + boot id
};

struct Group {
  int rank = 0;  // rank within the group
  int size = 1;
  std::vector<int> global_ranks;  // group rank -> rank in the default group
  std::string name;
  std::chrono::milliseconds timeout{0};
  // How many times a group of this name was created on this store before
  // (destroy_process_group + init_process_group reuses store prefixes); keys
  // carry it so a new incarnation never reads a stale key.
  long generation = 0;
  std::vector<PeerInfo> peers;
  // Extra store-key namespace of a subgroup built from this group (e.g. the
  // ranks of one node), so its keys never meet the parent's.
  std::string scope;

  int global(int group_rank) const { return global_ranks[group_rank]; }
  // "rank 3" or, inside a subgroup, "rank 3 (group rank 1)"; used in errors.
  std::string who(int group_rank) const;
  // Prefix for every error raised on this rank: "rsdp rank 3".
  std::string me() const;
  // Key namespaced by the group's incarnation.
  std::string key(const std::string& k) const;
};

Group join_group(Bootstrap& store, int rank, int size, std::vector<int> global_ranks,
                 std::string name, std::chrono::milliseconds timeout, const Options& opts);

// This machine's identity: opts.node_id if set, else host name + boot id.
std::string local_node_id(const Options& opts);

}  // namespace rsdp
