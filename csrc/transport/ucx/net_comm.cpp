// NetComm: owns the UCX context and the two workers, publishes this rank's
// worker addresses through the store (UcxAddressBook), and hands the work to
// the collective engine (ucx_coll.cpp) and the point-to-point engine
// (ucx_p2p.cpp).
#include "transport/ucx/net_comm.h"

#include "core/error.h"
#include "transport/ucx/ucx_address_book.h"
#include "transport/ucx/ucx_coll.h"
#include "transport/ucx/ucx_p2p.h"
#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/ucx_worker.h"

namespace rsdp {

struct NetComm::Impl {
  // Declaration order is teardown order, reversed: the engines (thread,
  // endpoints, requests) go before their workers, the workers before the
  // context.
  Group group;
  UcxContext ctx;
  UcxWorker coll_worker, p2p_worker;
  UcxAddressBook book;
  std::unique_ptr<UcxCollectives> coll;
  std::unique_ptr<UcxP2P> p2p;

  // Publishes this rank's addresses (one store request) and reads none:
  // each engine connects to a peer when it first reaches it (ucx_coll.h,
  // ucx_p2p.h), so set-up costs O(1) store requests and no endpoints.
  Impl(const Group& g, std::vector<int> node_of, Bootstrap& store, const Options& opts,
       Traffic* traffic, Notice* notice)
      : group(g),
        ctx(g.me(), g.size),
        coll_worker(ctx, g.me()),
        p2p_worker(ctx, g.me()),
        book(group, store, coll_worker.address(), p2p_worker.address()) {
    RSDP_CHECK(static_cast<int>(node_of.size()) == group.size, group.me(), ": node_of has ",
               node_of.size(), " entries for a group of size ", group.size);
    RSDP_CHECK(group.size <= (1 << ucx_wire::kRankBits), group.me(), ": groups of more than ",
               1 << ucx_wire::kRankBits, " ranks are not supported by the UCX transport");
    coll = std::make_unique<UcxCollectives>(group, coll_worker, book, node_of, opts, traffic,
                                            notice);
    p2p = std::make_unique<UcxP2P>(group, p2p_worker, book, std::move(node_of), traffic,
                                   opts.debug, notice);
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

int NetComm::endpoints() const { return impl_->coll->endpoints() + impl_->p2p->endpoints(); }

}  // namespace rsdp
