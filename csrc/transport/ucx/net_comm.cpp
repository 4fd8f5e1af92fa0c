// NetComm: owns the UCX context and the two workers, exchanges worker
// addresses through the store, and hands the work to the collective engine
// (ucx_coll.cpp) and the point-to-point engine (ucx_p2p.cpp).
#include "transport/ucx/net_comm.h"

#include "core/error.h"
#include "core/store_records.h"
#include "transport/ucx/ucx_coll.h"
#include "transport/ucx/ucx_p2p.h"
#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/ucx_worker.h"

namespace rsdp {
namespace {

// UCX reads a worker address with no length (ucp_ep_create follows the
// format as far as it leads) and aborts the process on an address version it
// does not know (an assertion in ucp_address_unpack). So a peer's address must
// carry the version this rank's UCX writes, the low 4 bits of its first byte
// (without this check most garbage addresses abort the process; the
// ucx-address-garbage case of tests/backend/test_hostile_peer.py), and goes
// to UCX followed by zeros, so that a malformed one is read inside this
// buffer until UCX refuses it. UCX parses the rest itself.
constexpr size_t kAddressPad = 4096;

std::string check_address(std::string peer, const std::string& mine, const char* which,
                          std::string& err) {
  const unsigned theirs = static_cast<unsigned char>(peer[0]) & 0xf;
  const unsigned ours = static_cast<unsigned char>(mine[0]) & 0xf;
  if (theirs != ours && err.empty())
    err = detail::cat("its ", which, " UCX address is of format version ", theirs,
                      ", this rank's UCX writes version ", ours,
                      " (a different UCX, or not a UCX address)");
  peer.append(kAddressPad, '\0');
  return peer;
}

}  // namespace

struct NetComm::Impl {
  // Declaration order is teardown order, reversed: the engines (thread,
  // endpoints, requests) go before their workers, the workers before the
  // context.
  Group group;
  UcxContext ctx;
  UcxWorker coll_worker, p2p_worker;
  std::unique_ptr<UcxCollectives> coll;
  std::unique_ptr<UcxP2P> p2p;

  Impl(const Group& g, std::vector<int> node_of, Bootstrap& store, const Options& opts,
       Traffic* traffic, Notice* notice)
      : group(g), ctx(g.me(), g.size), coll_worker(ctx, g.me()), p2p_worker(ctx, g.me()) {
    RSDP_CHECK(static_cast<int>(node_of.size()) == group.size, group.me(), ": node_of has ",
               node_of.size(), " entries for a group of size ", group.size);
    RSDP_CHECK(group.size <= (1 << ucx_wire::kRankBits), group.me(), ": groups of more than ",
               1 << ucx_wire::kRankBits, " ranks are not supported by the UCX transport");
    coll = std::make_unique<UcxCollectives>(group, coll_worker, node_of, opts, traffic, notice);
    std::vector<std::string> coll_addrs(group.size), p2p_addrs(group.size);
    if (group.size > 1) exchange_addresses(store, coll_addrs, p2p_addrs);
    for (int r = 0; r < group.size; ++r) {
      if (r == group.rank) continue;
      try {
        coll->connect(r, coll_addrs[r]);
      } catch (const Error& e) {
        RSDP_FAIL(e.kind(), e.what(), " (connecting the nodes of group '", group.name,
                  "': UCX refused the collective address that ", group.who(r), " published)");
      }
    }
    p2p = std::make_unique<UcxP2P>(group, p2p_worker, std::move(p2p_addrs), node_of, traffic,
                                   opts.debug, notice);
  }

  void exchange_addresses(Bootstrap& store, std::vector<std::string>& coll_addrs,
                          std::vector<std::string>& p2p_addrs) {
    auto key = [&](int r) { return group.key("ucx/addr/" + std::to_string(r)); };
    store.set(key(group.rank), records::encode_ucx(group.rank, coll_worker.address(),
                                                   p2p_worker.address()));
    std::vector<std::string> keys;
    for (int r = 0; r < group.size; ++r) keys.push_back(key(r));
    if (!store.wait(keys, group.timeout)) {
      std::string missing;
      int n = 0;
      for (int r = 0; r < group.size; ++r)
        if (!store.check(keys[r])) missing += (n++ ? ", " : "") + group.who(r);
      RSDP_FAIL(ErrorKind::kTimeout, group.me(), ": ", timed_out_waiting(group.timeout.count()),
                " for ", missing,
                " to publish the UCX address", n == 1 ? "" : "es", " of group '", group.name,
                "'");
    }
    for (int r = 0; r < group.size; ++r) {
      if (r == group.rank) continue;
      const std::string doing =
          detail::cat(group.me(), ": connecting the nodes of group '", group.name, "': ");
      records::UcxAddresses a;
      std::string err = records::decode_ucx(store.get(keys[r]), {keys[r], r, group.who(r)}, a);
      RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), doing, err);
      coll_addrs[r] = check_address(std::move(a.coll), coll_worker.address(), "collective", err);
      p2p_addrs[r] = check_address(std::move(a.p2p), p2p_worker.address(), "point-to-point", err);
      RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), doing, "the UCX address record of ",
                      group.who(r), " (store key '", keys[r], "'): ", err);
    }
  }
};

NetComm::NetComm(const Group& group, std::vector<int> node_of, Bootstrap& store,
                 const Options& opts, Traffic* traffic, Notice* notice)
    : impl_(std::make_unique<Impl>(group, std::move(node_of), store, opts, traffic, notice)) {}

NetComm::~NetComm() = default;

const Group& NetComm::group() const { return impl_->group; }
int NetComm::rank() const { return impl_->group.rank; }
int NetComm::size() const { return impl_->group.size; }

void NetComm::begin(const OpDesc& desc, Deadline deadline) { impl_->coll->begin(desc, deadline); }

void NetComm::isend(int peer, const void* buf, size_t bytes, uint32_t step) {
  impl_->coll->isend(peer, buf, bytes, step);
}

void NetComm::irecv(int peer, void* buf, size_t bytes, uint32_t step) {
  impl_->coll->irecv(peer, buf, bytes, step);
}

void NetComm::wait() { impl_->coll->wait(); }

void NetComm::p2p_send(const void* buf, size_t bytes, int dst, int tag,
                       std::chrono::milliseconds timeout, Done done) {
  impl_->p2p->send(buf, bytes, dst, tag, timeout, std::move(done));
}

void NetComm::p2p_recv(void* buf, size_t bytes, int src, int tag,
                       std::chrono::milliseconds timeout, Done done) {
  impl_->p2p->recv(buf, bytes, src, tag, timeout, std::move(done));
}

void NetComm::abort(const std::string& why) {
  impl_->coll->abort(why);
  impl_->p2p->abort(why);
}

void NetComm::spread() { impl_->coll->spread(); }

}  // namespace rsdp
