// See ucx_p2p.h. Everything below run() executes on the progress thread only.
#include "transport/ucx/ucx_p2p.h"

#include <algorithm>
#include <iostream>

#include "core/deadline.h"
#include "core/error.h"
#include "transport/ucx/ucx_wire.h"

namespace rsdp {

using Clock = std::chrono::steady_clock;

struct UcxP2P::Op {
  bool is_send;
  int peer;  // -1: any source
  int tag;
  char* buf;
  size_t bytes;
  Deadline deadline;
  Done done;
  void* req = nullptr;     // UCX request while UCX owns it
  bool completed = false;  // UCX finished with the request
  bool reported = false;   // done() ran
  ucs_status_t status = UCS_OK;
  ucp_tag_recv_info_t info{};

  std::string what(const Group& g) const {
    return detail::cat(is_send ? "send to " : "recv from ",
                       peer < 0 ? std::string("any rank") : g.who(peer), " (tag ", tag, ", ",
                       bytes, " bytes)");
  }
};

struct UcxP2P::Peer {
  UcxP2P* self;
  int rank;
  ucp_ep_h ep = nullptr;
  bool sent = false;   // carried a message (worth flushing at the end)
  std::string failed;  // UCX's reason, set by the error handler
  std::string broken;  // why every operation with this peer now fails

  // Runs inside ucp_worker_progress: only note it; reap() acts on it.
  void note_failure(ucs_status_t s) {
    if (failed.empty()) failed = ucx_status_text(s);
    self->peer_failed_ = true;
  }
};

namespace {

void send_cb(void*, ucs_status_t s, void* user) {
  auto* op = static_cast<UcxP2P::Op*>(user);
  op->completed = true;
  op->status = s;
}

void recv_cb(void*, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<UcxP2P::Op*>(user);
  op->completed = true;
  op->status = s;
  if (s == UCS_OK) op->info = *info;
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t s) {
  static_cast<UcxP2P::Peer*>(arg)->note_failure(s);
}

std::exception_ptr make_err(ErrorKind kind, const std::string& msg) {
  return std::make_exception_ptr(Error(kind, msg));
}

}  // namespace

UcxP2P::UcxP2P(const Group& group, UcxWorker& worker, UcxAddressBook& book,
               std::vector<int> node_of, Traffic* traffic, bool debug, Notice* notice)
    : group_(group),
      worker_(worker),
      book_(book),
      node_of_(std::move(node_of)),
      traffic_(traffic),
      debug_(debug),
      notice_(notice) {
  for (int r = 0; r < group_.size; ++r) peers_.push_back(std::unique_ptr<Peer>(new Peer{this, r}));
}

UcxP2P::~UcxP2P() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  worker_.signal();
  if (thread_.joinable()) thread_.join();
}

void UcxP2P::send(const void* buf, size_t bytes, int dst, int tag,
                  std::chrono::milliseconds timeout, Done done) {
  RSDP_CHECK(dst >= 0 && dst < group_.size && dst != group_.rank, group_.me(),
             ": send to group rank ", dst, " is invalid in a group of size ", group_.size,
             " (and a rank cannot send to itself)");
  look_up(dst);
  submit(std::unique_ptr<Op>(new Op{true, dst, tag,
                                    const_cast<char*>(static_cast<const char*>(buf)), bytes,
                                    Deadline(timeout), std::move(done)}));
}

void UcxP2P::recv(void* buf, size_t bytes, int src, int tag, std::chrono::milliseconds timeout,
                  Done done) {
  RSDP_CHECK(src >= -1 && src < group_.size && src != group_.rank, group_.me(),
             ": recv from group rank ", src, " is invalid in a group of size ", group_.size,
             " (and a rank cannot receive from itself)");
  look_up(src);
  submit(std::unique_ptr<Op>(new Op{false, src, tag, static_cast<char*>(buf), bytes,
                                    Deadline(timeout), std::move(done)}));
}

void UcxP2P::look_up(int peer) {
  if (peer < 0 || book_.known(peer)) return;
  try {
    UcxAddressBook::Pair a;
    book_.try_get(peer, a);
  } catch (...) {
    // A malformed record: the progress thread reports it to the operation.
  }
}

void UcxP2P::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? group_.me() + ": aborted" : why;
  }
  worker_.signal();
}

void UcxP2P::submit(std::unique_ptr<Op> op) {
  {
    std::lock_guard<std::mutex> g(mu_);
    RSDP_CHECK_KIND(ErrorKind::kPeer, !stop_, group_.me(), ": ", op->what(group_),
                    " after the process group was destroyed");
    submitted_.push_back(std::move(op));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  worker_.signal();
}

void UcxP2P::finish(Op& op, std::exception_ptr err, int src) {
  if (op.reported) return;
  op.reported = true;
  try {
    op.done(err, src);
  } catch (...) {
    // A completion callback must not take the progress thread down.
  }
  op.done = nullptr;  // drop what the callback captured (tensors) now
}

ucp_ep_h UcxP2P::endpoint(int p) {
  Peer& peer = *peers_[p];
  if (!peer.ep) {
    UcxAddressBook::Pair a;
    // post() made sure the address is known: this reads the book's copy.
    RSDP_CHECK_KIND(ErrorKind::kPeer, book_.try_get(p, a), group_.me(), ": ", group_.who(p),
                    " has not published its UCX address");
    try {
      peer.ep = worker_.connect(a.p2p, ep_error, &peer);
    } catch (const Error& e) {
      RSDP_FAIL(e.kind(), e.what(), " (UCX refused the point-to-point address that ",
                group_.who(p), " published)");
    }
    ++endpoints_;
    if (debug_)
      std::cerr << group_.me() << ": ucx: group '" << group_.name << "': point-to-point endpoint to "
                << group_.who(p)
                << (node_of_[p] == node_of_[group_.rank] ? " (same node)" : " (other node)")
                << std::endl;
  }
  return peer.ep;
}

void UcxP2P::run() {
  auto last_check = Clock::now();
  for (;;) {
    std::vector<std::unique_ptr<Op>> fresh;
    std::string aborted;
    ErrorKind aborted_kind;
    bool stop;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (aborted_.empty() && notice_ && notice_->posted()) {
        // The group broke: the failure that broke it ends this engine too.
        Failure f = notice_->read();
        aborted_ = Notice::heard(group_.me(), "send/recv", f);
        aborted_kind_ = f.kind;
      }
      fresh.swap(submitted_);
      aborted = aborted_;
      aborted_kind = aborted_kind_;
      stop = stop_;
    }
    if (!aborted.empty() && !abort_handled_) {
      abort_handled_ = true;
      fail_all(aborted, aborted_kind);
    }
    for (auto& op : fresh) {
      if (!aborted.empty() || stop) {
        finish(*op, make_err(stop ? ErrorKind::kPeer : aborted_kind,
                             stop ? group_.me() + ": " + op->what(group_) +
                                        ": the process group was destroyed while it was pending"
                                  : aborted),
               -1);
        continue;
      }
      post(std::move(op));
    }
    if (stop) break;
    bool busy = true;
    try {
      busy = worker_.progress();
      reap();
      // On a timer, even under steady traffic, so a stuck operation cannot
      // hide behind busy ones.
      auto now = Clock::now();
      if (now - last_check >= std::chrono::milliseconds(20)) {
        check_deadlines();
        retry_unaddressed();
        reap();
        last_check = now;
      }
    } catch (const std::exception& e) {
      // E.g. out of memory: fail what is pending instead of the process.
      fail_all(group_.me() + ": point-to-point engine failed: " + e.what());
    }
    if (!busy && fresh.empty()) worker_.sleep(20);
  }
  shutdown();
}

void UcxP2P::post(std::unique_ptr<Op> op) {
  Op& o = *op;
  if (o.peer >= 0 && !peers_[o.peer]->broken.empty()) {
    finish(o, make_err(ErrorKind::kPeer, detail::cat(group_.me(), ": ", o.what(group_),
                                                     " refused: ", peers_[o.peer]->broken)),
           -1);
    return;
  }
  if (o.peer >= 0 && !peers_[o.peer]->ep) {
    // First use of this peer: its address, if published (else wait for it).
    UcxAddressBook::Pair a;
    bool known = false;
    try {
      known = book_.try_get(o.peer, a);
    } catch (...) {
      finish(o, std::current_exception(), -1);
      return;
    }
    if (!known) {
      unaddressed_.push_back(std::move(op));
      return;
    }
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = &o;
  ucs_status_ptr_t r;
  try {
    if (o.is_send) {
      p.cb.send = send_cb;
      peers_[o.peer]->sent = true;
      r = ucp_tag_send_nbx(endpoint(o.peer), o.buf, o.bytes,
                           ucx_wire::p2p_tag(group_.rank, o.tag), &p);
      if (traffic_) traffic_->add(node_of_[o.peer] == node_of_[group_.rank], o.bytes);
    } else {
      // An endpoint to a named source makes its death visible (error handler).
      if (o.peer >= 0) endpoint(o.peer);
      // UCX 1.13 leaves recv_info unset when a receive completes at once, so
      // always take the callback, which reports length and sender.
      p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = recv_cb;
      uint64_t mask = o.peer < 0 ? ~ucx_wire::kP2PSrcMask : ~0ull;
      r = ucp_tag_recv_nbx(worker_.get(), o.buf, o.bytes,
                           ucx_wire::p2p_tag(o.peer < 0 ? 0 : o.peer, o.tag), mask, &p);
    }
  } catch (...) {
    finish(o, std::current_exception(), -1);
    return;
  }
  if (UCS_PTR_IS_ERR(r)) {
    finish(o, make_err(ErrorKind::kPeer, detail::cat(group_.me(), ": ", o.what(group_),
                                                     " failed: ",
                                                     ucx_status_text(UCS_PTR_STATUS(r)))),
           -1);
    return;
  }
  if (UCS_PTR_IS_PTR(r)) o.req = r;  // the callback may already have run
  else o.completed = true;             // a send done at once
  active_.push_back(std::move(op));
}

void UcxP2P::reap() {
  if (peer_failed_) {
    peer_failed_ = false;
    for (auto& p : peers_)
      if (!p->failed.empty() && p->broken.empty())
        fail_peer(p->rank, detail::cat(group_.who(p->rank), " is unreachable (", p->failed, ")"));
  }
  for (auto it = active_.begin(); it != active_.end();) {
    Op& o = **it;
    if (!o.completed) {
      ++it;
      continue;
    }
    if (o.req) ucp_request_free(o.req);
    o.req = nullptr;
    const Group& g = group_;
    if (o.status == UCS_OK && o.is_send) {
      finish(o, nullptr, o.peer);
    } else if (o.status == UCS_OK && o.info.length == o.bytes) {
      finish(o, nullptr, ucx_wire::p2p_src(o.info.sender_tag));
    } else if (o.status == UCS_OK || o.status == UCS_ERR_MESSAGE_TRUNCATED) {
      int src = o.status == UCS_OK ? ucx_wire::p2p_src(o.info.sender_tag) : o.peer;
      std::string got = o.status == UCS_OK ? detail::cat("a message of ", o.info.length, " bytes")
                                           : std::string("a larger message");
      finish(o, make_err(ErrorKind::kValue,
                         detail::cat(g.me(), ": ", o.what(g), " got ", got,
                                     src >= 0 ? " from " + g.who(src) : std::string(),
                                     "; the receive tensor must have exactly the size that "
                                     "was sent")),
             src);
    } else {
      finish(o, make_err(ErrorKind::kPeer, detail::cat(g.me(), ": ", o.what(g), " failed: ",
                                                       ucx_status_text(o.status))),
             -1);
    }
    it = active_.erase(it);
  }
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
      ++it;
    } else {
      ucp_request_free(*it);
      it = closing_.erase(it);
    }
  }
}

void UcxP2P::retry_unaddressed() {
  std::list<std::unique_ptr<Op>> waiting;
  waiting.swap(unaddressed_);
  std::vector<int> absent;  // peers found unpublished in this round: asked once
  for (auto& op : waiting) {
    Op& o = *op;
    if (o.reported) continue;
    UcxAddressBook::Pair a;
    bool known = false;
    if (std::find(absent.begin(), absent.end(), o.peer) == absent.end()) {
      try {
        known = book_.try_get(o.peer, a);
      } catch (...) {
        finish(o, std::current_exception(), -1);
        continue;
      }
      if (!known) absent.push_back(o.peer);
    }
    if (known) {
      post(std::move(op));
    } else if (o.deadline.expired()) {
      finish(o, make_err(ErrorKind::kTimeout,
                         detail::cat(group_.me(), ": ", o.what(group_), ": ",
                                     timed_out_waiting(o.deadline.budget().count()), " for ",
                                     group_.who(o.peer), " to publish its UCX address in group '",
                                     group_.name, "' (it never finished setting up the group, "
                                     "or died before)")),
             -1);
    } else {
      unaddressed_.push_back(std::move(op));
    }
  }
}

void UcxP2P::check_deadlines() {
  const Group& g = group_;
  for (auto& op : active_) {
    Op& o = *op;
    if (o.reported || o.completed || !o.deadline.expired()) continue;
    std::string msg = detail::cat(g.me(), ": ", o.what(g), ": ",
                                  timed_out_waiting(o.deadline.budget().count()));
    if (!o.is_send) {
      // Cancelling an unmatched receive completes it (CANCELED) at once; a
      // receive already matched to a message in flight runs to its end, so
      // stays with UCX, though reported.
      ucp_request_cancel(worker_.get(), o.req);
      if (o.completed && o.status == UCS_OK) continue;  // it made it after all
      finish(o, make_err(ErrorKind::kTimeout, msg), -1);
    } else {
      // UCX cannot take back a send: only closing the endpoint releases the
      // buffer, and that ends this pair's stream.
      finish(o, make_err(ErrorKind::kTimeout, msg), -1);
      fail_peer(o.peer, detail::cat("an earlier send to ", g.who(o.peer), " timed out"));
    }
  }
}

void UcxP2P::fail_peer(int p, const std::string& why) {
  Peer& peer = *peers_[p];
  if (peer.broken.empty()) peer.broken = why;
  for (auto& op : unaddressed_)
    if (op->peer == p)
      finish(*op, make_err(ErrorKind::kPeer, detail::cat(group_.me(), ": ", op->what(group_),
                                                          " failed: ", why)),
             -1);
  for (auto& op : active_) {
    Op& o = *op;
    if (o.peer != p || o.reported) continue;
    if (!o.is_send && !o.completed) ucp_request_cancel(worker_.get(), o.req);
    if (o.completed && o.status == UCS_OK) continue;
    finish(o, make_err(ErrorKind::kPeer, detail::cat(group_.me(), ": ", o.what(group_),
                                                     " failed: ", why)),
           -1);
  }
  if (peer.ep) {
    // Releases the sends still queued on it (they complete with an error).
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer.ep, &cp);
    peer.ep = nullptr;
    --endpoints_;
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  }
}

void UcxP2P::fail_all(const std::string& why, ErrorKind kind) {
  for (auto& op : unaddressed_) finish(*op, make_err(kind, why), -1);
  unaddressed_.clear();
  for (auto& op : active_) {
    Op& o = *op;
    if (o.reported) continue;
    if (!o.is_send && !o.completed) ucp_request_cancel(worker_.get(), o.req);
    if (o.completed && o.status == UCS_OK) continue;
    finish(o, make_err(kind, why), -1);
  }
}

void UcxP2P::shutdown() {
  fail_all(group_.me() + ": the process group was destroyed while this send/recv was pending");
  std::vector<UcxWorker::Closing> eps;
  for (auto& p : peers_) eps.push_back({&p->ep, p->sent && p->broken.empty()});
  worker_.close_endpoints(eps, std::chrono::milliseconds(1000));
  endpoints_ = 0;
  Deadline dl(std::chrono::milliseconds(1000));
  while ((!active_.empty() || !closing_.empty()) && !dl.expired()) {
    if (!worker_.progress()) worker_.sleep(5);
    reap();
  }
  // Whatever UCX still holds after that is released unfinished.
  for (auto& op : active_)
    if (op->req) ucp_request_free(op->req);
  active_.clear();
  for (auto r : closing_) ucp_request_free(r);
  closing_.clear();
}

}  // namespace rsdp
