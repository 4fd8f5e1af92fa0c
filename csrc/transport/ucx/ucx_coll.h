// The collective half of NetComm: isend/irecv of the current op over the
// collective UCX worker, and wait(), the only place that worker progresses.
//
// A collective receive is a small state machine: first the header message
// (which may carry the payload inline), then, once the header agreed with
// this rank's op, the separate payload (ucx_wire.h explains the split). A
// header that disagrees is a mismatch; the payload it announces is still
// consumed (a zero-byte receive, which UCX completes as truncated without
// moving the data), so the sender's send completes and the group stays usable.
// A timeout, a dead peer or abort() instead cancels and closes everything and
// leaves the group unusable.
//
// [Note: the notice across nodes]
// A member that finds the group broken posts the failure on its node's notice
// (core/notice.h) and, if it was the first there to see it first-hand, sends
// it to every member on another node (ucx_wire.h's notice tag) before it
// closes its endpoints. Every member keeps one receive posted for such a
// message, so wait() sees it between two progress calls, posts it on its own
// node and raises it; wait() polls its node's notice as well, for members of
// this node that gave up. A peer whose endpoint fails gets a moment's grace
// for its notice to arrive, which says why (it exited, or gave up).
//
// Endpoints are made on first use: the first isend or irecv of an op to or
// from a peer reads its address (UcxAddressBook, waiting up to the op's
// deadline for a late peer) and connects; a receive needs no endpoint to
// match, but the endpoint makes the peer's death visible (its error
// handler). A rank so holds endpoints to the peers its collectives actually
// reach (a ring's two neighbours, a rail's, the leaders'), not to every rank.
// The notice, though, must reach every member on another node, so a rank that
// reports a failure connects to those it has no endpoint to yet, reading
// only addresses already published and within a bound (tell_others): a
// relay through connected peers would have to trust and forward every
// peer's notices, while a few endpoints made once, on the way out, cost only
// time the failure already took.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"
#include "core/group.h"
#include "core/notice.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/traffic.h"
#include "transport/ucx/ucx_address_book.h"
#include "transport/ucx/ucx_worker.h"

namespace rsdp {

class UcxCollectives {
 public:
  // `group`, `worker` and `notice` (null: none; this node's members are
  // then not told) must outlive this object.
  UcxCollectives(const Group& group, UcxWorker& worker, UcxAddressBook& book,
                 std::vector<int> node_of, const Options& opts, Traffic* traffic,
                 Notice* notice);
  ~UcxCollectives();  // gives back every request, closes the endpoints
  UcxCollectives(const UcxCollectives&) = delete;
  UcxCollectives& operator=(const UcxCollectives&) = delete;

  // Endpoints open now (any thread).
  int endpoints() const { return endpoints_.load(); }

  void begin(const OpDesc& desc, Deadline deadline);
  void isend(int peer, const void* buf, size_t bytes, uint32_t step);
  void irecv(int peer, void* buf, size_t bytes, uint32_t step);
  void wait();
  // Any thread.
  void abort(const std::string& why);
  // After a failure outside this engine (on the node's shared memory, or an
  // abort): if the node's notice holds a failure this rank reported, send it
  // to the other nodes; either way the engine is broken from now on.
  void spread();

  struct Op;
  struct Slot;
  struct Peer;
  struct NoticeWire;

 private:
  Op& new_op(bool is_send, int peer, const void* buf, size_t bytes, uint32_t step);
  // Endpoint to group rank `peer`'s collective worker.
  void connect(int peer, const std::string& address);
  // Connects to `peer` if this rank has no endpoint to it yet (first use).
  void reach(int peer);
  void post_send(Slot& s, int peer, const void* buf, size_t count, uint64_t tag,
                 ucp_datatype_t dt);
  void post_recv(Slot& s, void* buf, size_t bytes, uint64_t tag);
  void handle(Slot& s);
  void on_header(Op& op);
  void finish(Op& op, ErrorKind kind = ErrorKind::kPeer, std::string err = {});
  std::string outstanding(bool only_failed_peers) const;
  void release_requests();
  void check_usable(const char* what) const;
  void listen();
  // A notice that arrived, or this node's: raises it (as fail()).
  void check_notice();
  // Sends `f` to every member on another node, and waits (bounded) until sent.
  void tell_others(const Failure& f);
  int me() const { return group_.global(group_.rank); }
  // msg by value: callers pass members (peer_error_, mismatch_) that fail() clears.
  [[noreturn]] void fail(ErrorKind kind, std::string msg);

  const Group& group_;
  UcxWorker& worker_;
  UcxAddressBook& book_;
  std::vector<int> node_of_;
  Options opts_;
  Traffic* traffic_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::atomic<int> endpoints_{0};

  OpDesc desc_;
  Deadline deadline_;
  bool begun_ = false;
  std::vector<std::unique_ptr<Op>> pool_;  // the first nops_ belong to this op
  size_t nops_ = 0, open_ = 0;
  std::vector<Slot*> completed_;  // finished by UCX, not yet handled
  bool peer_failed_ = false;      // set by an endpoint's error handler
  std::string peer_error_;        // first op that failed because of a peer
  std::string mismatch_;          // first mismatch of this wait()
  std::string broken_;

  Notice* notice_;
  std::unique_ptr<NoticeWire> notice_in_, notice_out_;
  void* notice_req_ = nullptr;  // the posted notice receive
  bool heard_remote_ = false;   // the failure being raised came in a notice
  bool told_ = false;           // this rank's notice went out

  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_why_;  // guarded by abort_mu_
};

}  // namespace rsdp
