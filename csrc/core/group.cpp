#include "core/group.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
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

  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(g.key("peer/" + std::to_string(r)));
  if (!store.wait(keys, timeout)) {
    std::ostringstream missing;
    int n = 0;
    for (int r = 0; r < size; ++r)
      if (!store.check(keys[r])) missing << (n++ ? ", " : "") << g.who(r);
    RSDP_FAIL(ErrorKind::kTimeout, g.me(), ": ", timed_out_waiting(timeout.count()), " for ",
              missing.str(), " to join process group '", g.name, "' of size ",
              size, " (", n == 1 ? "it" : "they", " never reached init_process_group/new_group)");
  }
  g.peers.resize(size);
  for (int r = 0; r < size; ++r) {
    records::Peer p;
    const std::string err = records::decode_peer(store.get(keys[r]), {keys[r], r, g.who(r)}, p);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), g.me(), ": joining group '", g.name,
                    "': ", err);
    g.peers[r].pid = p.pid;
    g.peers[r].node = std::move(p.node);
  }
  return g;
}

}  // namespace rsdp
