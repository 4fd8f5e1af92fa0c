#include "core/group.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/notice.h"
#include "core/store_records.h"

namespace rsdp {

std::string Group::who(int r) const {
  std::ostringstream os;
  os << "rank " << global(r);
  if (global(r) != r) os << " (group rank " << r << ")";
  return os.str();
}

std::string Group::me() const { return "rsdp rank " + std::to_string(global(rank)); }

std::string Group::key(const std::string& k) const {
  return "rsdp/" + std::to_string(size) + "/" + std::to_string(generation) + "/" + scope + k;
}

std::string local_node_id(const Options& opts) {
  if (!opts.node_id.empty()) return opts.node_id;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

Group join_group(Bootstrap& store, int rank, int size, std::vector<int> global_ranks,
                 std::string name, std::chrono::milliseconds timeout, const Options& opts) {
  Group g;
  g.rank = rank;
  g.size = size;
  g.name = std::move(name);
  g.timeout = timeout;
  if (global_ranks.empty())
    for (int r = 0; r < size; ++r) global_ranks.push_back(r);
  RSDP_CHECK(static_cast<int>(global_ranks.size()) == size, "rsdp: group '", g.name, "' has ",
             global_ranks.size(), " global ranks for size ", size);
  g.global_ranks = std::move(global_ranks);

  // Every rank of one incarnation draws a ticket in [gen*size+1, (gen+1)*size].
  // Keyed by size too, so an incarnation of another size under a reused
  // store prefix (e.g. a new subgroup that got an old group's name) counts apart.
  const std::string counter = "rsdp/joined/" + std::to_string(size);
  int64_t ticket = store.add(counter, 1);
  // Only ever incremented by one: anything below 1 was written by someone else.
  RSDP_CHECK_KIND(ErrorKind::kSystem, ticket >= 1, g.me(), ": joining group '", g.name,
                  "': the store's join counter '", counter, "' reads ", ticket,
                  " (not written by torch_rsdp)");
  g.generation = static_cast<long>((ticket - 1) / size);

  const std::string node = local_node_id(opts);
  const std::string bad_node = records::check_node_id(node);
  RSDP_CHECK(bad_node.empty(), g.me(), ": joining group '", g.name, "': ", bad_node,
             opts.node_id.empty() ? " (from the host name and boot id)" : " (RSDP_NODE_ID)");
  store.set(g.key("peer/" + std::to_string(rank)), records::encode_peer(rank, getpid(), node));

  // Group rank 0 reads every peer record and posts them as one table; the
  // others read only that: O(1) requests per rank and O(size) in all (rank
  // 0's wait and get_many are one request each, answered in O(size)), where
  // every rank reading every record made the store serve size^2.
  const std::string table_key = g.key("peers");
  const records::From table_from{table_key, 0, g.who(0)};
  const std::string joining = g.me() + ": joining group '" + g.name + "': ";
  records::PeerTable table;
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(g.key("peer/" + std::to_string(r)));
    std::string err;
    ErrorKind kind = ErrorKind::kSystem;
    // A little shorter than the others' wait, so that its verdict reaches
    // them before they give up on their own.
    const auto margin = std::min(timeout / 4, std::chrono::milliseconds(5000));
    if (!store.wait(keys, timeout - margin)) {
      // Rank 0 alone looks for who is missing (size requests, on failure only).
      std::ostringstream missing;
      int n = 0;
      for (int r = 0; r < size; ++r)
        if (!store.check(keys[r])) missing << (n++ ? ", " : "") << g.who(r);
      kind = ErrorKind::kTimeout;
      err = detail::cat(g.me(), ": ", timed_out_waiting((timeout - margin).count()), " for ",
                        missing.str(),
                        " to join process group '", g.name, "' of size ", size, " (",
                        n == 1 ? "it" : "they", " never reached init_process_group/new_group)");
    } else {
      const std::vector<std::string> values = store.get_many(keys);
      table.peers.resize(size);
      for (int r = 0; r < size && err.empty(); ++r) {
        records::Peer p;
        const std::string bad = records::decode_peer(values[r], {keys[r], r, g.who(r)}, p);
        if (!bad.empty()) err = joining + bad;
        table.peers[r] = std::move(p);
      }
    }
    // Posted either way: on failure the others raise rank 0's error at once
    // rather than at their own timeout.
    store.set(table_key, err.empty() ? records::encode_peer_table(table.peers)
                                     : records::encode_peer_table_failure(
                                           kind == ErrorKind::kTimeout, without_rank_prefix(err)));
    if (!err.empty()) RSDP_FAIL(kind, err);
  } else {
    // This rank waits no longer than its own timeout, so that it never
    // outlives the group's deadline when rank 0 is dead or stuck; rank 0
    // posts its verdict a little earlier. It may land just as this rank
    // gives up: one last look.
    if (!store.wait({table_key}, timeout) && !store.check(table_key)) {
      const bool zero_joined = store.check(g.key("peer/0"));
      RSDP_FAIL(ErrorKind::kTimeout, g.me(), ": ", timed_out_waiting(timeout.count()), " for ",
                g.who(0), " to post the peer table of process group '", g.name, "' of size ",
                size, " (",
                zero_joined ? "it joined, and is still waiting for other ranks to join or died; "
                              "its own error names the ranks that never came"
                            : "it never reached init_process_group/new_group",
                ")");
    }
    const std::string err =
        records::decode_peer_table(store.get(table_key), table_from, size, table);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), joining, err);
    RSDP_CHECK_KIND(table.timeout ? ErrorKind::kTimeout : ErrorKind::kPeer, table.ok, g.me(),
                    ": process group '", g.name,
                    "' could not be set up: ", g.who(0), " reported: ", table.text);
    // This rank's own entry says whether the table is of this incarnation.
    const records::Peer& mine = table.peers[rank];
    RSDP_CHECK_KIND(ErrorKind::kSystem, mine.pid == getpid() && mine.node == node, joining,
                    "the peer table that ", g.who(0), " posted (store key '", table_key,
                    "') says this rank is pid ", mine.pid, " on node '",
                    records::excerpt(mine.node), "', not pid ", getpid(), " on '",
                    records::excerpt(node), "' (a stale or copied table?)");
  }
  g.peers.resize(size);
  for (int r = 0; r < size; ++r) {
    g.peers[r].pid = table.peers[r].pid;
    g.peers[r].node = std::move(table.peers[r].node);
  }
  return g;
}

}  // namespace rsdp
