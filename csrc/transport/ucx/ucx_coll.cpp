// See ucx_coll.h.
#include "transport/ucx/ucx_coll.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <iostream>

#include <dirent.h>
#include <sys/resource.h>

#include "transport/ucx/ucx_wire.h"
#include "transport/ucx/wire_lie.h"

namespace rsdp {

using ucx_wire::WireHeader;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kHdr = sizeof(WireHeader);
constexpr int kSleepSliceMs = 20;
// After a mismatch, how long the other messages of the op get to complete
// before the group is given up.
constexpr auto kMismatchGrace = std::chrono::seconds(2);
// After a peer's endpoint failed, how long its notice (or its node's) gets
// to arrive and say why, before this rank reports the failure itself.
constexpr auto kNoticeGrace = std::chrono::milliseconds(150);
// How long a rank that found the group broken waits for its notices to leave.
constexpr auto kTellBound = std::chrono::milliseconds(300);

}  // namespace

// One UCX request. Its completion (callback or immediate) is queued on
// `sink` and handled by the wait loop, never inside UCX's callback.
struct UcxCollectives::Slot {
  Op* op = nullptr;
  std::vector<Slot*>* sink = nullptr;
  void* req = nullptr;
  bool used = false, done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
};

struct UcxCollectives::Op {
  bool is_send = false;
  int peer = 0;
  uint32_t step = 0;
  char* buf = nullptr;
  size_t bytes = 0;
  OpDesc desc;
  WireHeader hdr{};          // send: ours; recv: the sender's
  ucp_dt_iov_t iov[2]{};     // send: header + inline payload
  std::vector<char> bounce;  // recv: header + inline payload
  Slot head, body;
  bool finished = false;
  ErrorKind kind = ErrorKind::kPeer;
  std::string error;
};

// A notice on the wire (ucx_wire.h's notice tag), and the receive's state.
struct UcxCollectives::NoticeWire {
  ucx_wire::NoticeMsg msg{};
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  uint64_t sender_tag = 0;  // names the sender's group rank
};

struct UcxCollectives::Peer {
  UcxCollectives* self;
  ucp_ep_h ep = nullptr;
  bool sent = false;   // carried a message (worth flushing at the end)
  std::string failed;  // UCX's reason, set by the error handler

  // Runs inside ucp_worker_progress: only note it; wait() acts on it.
  void note_failure(ucs_status_t s) {
    if (failed.empty()) failed = ucx_status_text(s);
    self->peer_failed_ = true;
  }
};

namespace {

void send_cb(void*, ucs_status_t s, void* user) {
  auto* slot = static_cast<UcxCollectives::Slot*>(user);
  slot->done = true;
  slot->status = s;
  slot->sink->push_back(slot);
}

void recv_cb(void*, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user) {
  auto* slot = static_cast<UcxCollectives::Slot*>(user);
  slot->done = true;
  slot->status = s;
  if (s == UCS_OK) slot->length = info->length;
  slot->sink->push_back(slot);
}

void notice_cb(void*, ucs_status_t s, const ucp_tag_recv_info_t* info, void* user) {
  auto* w = static_cast<UcxCollectives::NoticeWire*>(user);
  w->done = true;
  w->status = s;
  if (s == UCS_OK) {
    w->length = info->length;
    w->sender_tag = info->sender_tag;
  }
}

void ep_error(void* arg, ucp_ep_h, ucs_status_t s) {
  static_cast<UcxCollectives::Peer*>(arg)->note_failure(s);
}

}  // namespace

UcxCollectives::UcxCollectives(const Group& group, UcxWorker& worker, UcxAddressBook& book,
                               std::vector<int> node_of, const Options& opts, Traffic* traffic,
                               Notice* notice)
    : group_(group), worker_(worker), book_(book), node_of_(std::move(node_of)), opts_(opts),
      traffic_(traffic), notice_(notice) {
  for (int r = 0; r < group_.size; ++r) peers_.push_back(std::unique_ptr<Peer>(new Peer{this}));
  listen();
}

void UcxCollectives::listen() {
  notice_in_ = std::make_unique<NoticeWire>();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = notice_cb;
  p.user_data = notice_in_.get();
  ucs_status_ptr_t r =
      ucp_tag_recv_nbx(worker_.get(), &notice_in_->msg, sizeof(notice_in_->msg),
                       ucx_wire::notice_tag(0), ~ucx_wire::kNoticeSrcMask, &p);
  // Without it, a broken group is still found by each rank's own waits.
  if (UCS_PTR_IS_PTR(r)) notice_req_ = r;
}

UcxCollectives::~UcxCollectives() {
  try {
    release_requests();
  } catch (...) {
    // Nothing sensible to do in a destructor; UCX reclaims the rest with the worker.
  }
}

void UcxCollectives::connect(int peer, const std::string& address) {
  try {
    peers_[peer]->ep = worker_.connect(address, ep_error, peers_[peer].get());
  } catch (const Error& e) {
    RSDP_FAIL(e.kind(), e.what(), " (connecting the nodes of group '", group_.name,
              "': UCX refused the collective address that ", group_.who(peer), " published)");
  }
  ++endpoints_;
  if (opts_.debug)
    std::cerr << group_.me() << ": ucx: group '" << group_.name << "': collective endpoint to "
              << group_.who(peer) << " (node "
              << node_of_[peer]
              << (node_of_[peer] == node_of_[group_.rank] ? ", same node)" : ", other node)")
              << std::endl;
}

void UcxCollectives::reach(int peer) {
  if (peers_[peer]->ep) return;
  std::string err;
  ErrorKind kind = ErrorKind::kPeer;
  try {
    // While a late peer publishes, the worker still progresses what this op
    // posted already, and a failure notice or an abort ends the wait.
    const UcxAddressBook::Pair a = book_.get(peer, deadline_, [&] {
      worker_.progress();
      check_notice();
      if (aborted_.load()) {
        std::string why;
        {
          std::lock_guard<std::mutex> g(abort_mu_);
          why = abort_why_;
        }
        fail(ErrorKind::kPeer, why);
      }
    });
    connect(peer, a.coll);
    return;
  } catch (const Error& e) {
    if (!broken_.empty()) throw;  // fail() ran inside: already the group's error
    kind = e.kind();
    err = detail::cat(e.what(), " (", desc_.describe(), ")");
  }
  fail(kind, err);
}

void UcxCollectives::check_usable(const char* what) const {
  if (!broken_.empty())
    RSDP_FAIL(ErrorKind::kPeer, group_.me(), ": ", what,
              " refused: the group is unusable after an earlier failure (", broken_,
              "); destroy it and create a new one");
}

void UcxCollectives::begin(const OpDesc& desc, Deadline deadline) {
  if (aborted_.load() && broken_.empty()) {
    std::lock_guard<std::mutex> g(abort_mu_);
    broken_ = abort_why_;
  }
  check_usable(op_name(desc.kind));
  desc_ = desc;
  deadline_ = deadline;
  begun_ = true;
  check_notice();  // heard of already: this op fails at once
}

UcxCollectives::Op& UcxCollectives::new_op(bool is_send, int peer, const void* buf, size_t bytes,
                                           uint32_t step) {
  check_usable(op_name(desc_.kind));
  RSDP_CHECK(begun_, group_.me(), ": NetComm::", is_send ? "isend" : "irecv", " before begin()");
  RSDP_CHECK(peer >= 0 && peer < group_.size && peer != group_.rank, group_.me(), ": ",
             desc_.describe(), ": ", is_send ? "send to" : "recv from", " group rank ", peer,
             " is invalid (group size ", group_.size, "; never to itself through UCX)");
  RSDP_CHECK(step < (1u << ucx_wire::kStepBits), group_.me(), ": ", desc_.describe(), ": step ",
             step, " does not fit in the tag");
  reach(peer);
  if (nops_ == pool_.size()) pool_.push_back(std::make_unique<Op>());
  Op& op = *pool_[nops_++];
  op.is_send = is_send;
  op.peer = peer;
  op.step = step;
  op.buf = const_cast<char*>(static_cast<const char*>(buf));
  op.bytes = bytes;
  op.desc = desc_;
  op.finished = false;
  op.kind = ErrorKind::kPeer;
  op.error.clear();
  op.head = Slot{&op, &completed_};
  op.body = Slot{&op, &completed_};
  ++open_;
  return op;
}

void UcxCollectives::isend(int peer, const void* buf, size_t bytes, uint32_t step) {
  Op& op = new_op(true, peer, buf, bytes, step);
  op.hdr = ucx_wire::make_header(desc_, step, bytes);
  // Test hook for the hostile-peer test only (wire_lie.h); empty otherwise.
  if (!opts_.test.wire_lie.empty()) ucx_wire::apply_wire_lie(opts_.test.wire_lie, op.hdr);
  const uint64_t tag = ucx_wire::coll_tag(group_.rank, desc_.seq, step, false);
  if (bytes <= ucx_wire::kInlineMax) {
    op.iov[0] = {&op.hdr, kHdr};
    op.iov[1] = {op.buf, bytes};
    post_send(op.head, peer, op.iov, bytes ? 2 : 1, tag | ucx_wire::kHeaderBit,
              ucp_dt_make_iov());
  } else {
    post_send(op.head, peer, &op.hdr, kHdr, tag | ucx_wire::kHeaderBit, ucp_dt_make_contig(1));
    post_send(op.body, peer, buf, bytes, tag, ucp_dt_make_contig(1));
  }
  if (traffic_) traffic_->add(node_of_[peer] == node_of_[group_.rank], bytes);
}

void UcxCollectives::irecv(int peer, void* buf, size_t bytes, uint32_t step) {
  Op& op = new_op(false, peer, buf, bytes, step);
  op.bounce.resize(kHdr + ucx_wire::kInlineMax);
  post_recv(op.head, op.bounce.data(), op.bounce.size(),
            ucx_wire::coll_tag(peer, desc_.seq, step, true));
}

void UcxCollectives::post_send(Slot& s, int peer, const void* buf, size_t count, uint64_t tag,
                               ucp_datatype_t dt) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.send = send_cb;
  p.user_data = &s;
  p.datatype = dt;
  s.used = true;
  peers_[peer]->sent = true;
  ucs_status_ptr_t r = ucp_tag_send_nbx(peers_[peer]->ep, buf, count, tag, &p);
  if (UCS_PTR_IS_PTR(r)) {
    s.req = r;
    return;
  }
  s.done = true;  // completed (or failed) at once: no callback follows
  s.status = UCS_PTR_STATUS(r);
  completed_.push_back(&s);
}

void UcxCollectives::post_recv(Slot& s, void* buf, size_t bytes, uint64_t tag) {
  ucp_request_param_t p{};
  // UCX 1.13 leaves recv_info (the length) unset when a receive completes at
  // once, so always take the callback, which reports it.
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = recv_cb;
  p.user_data = &s;
  s.used = true;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_.get(), buf, bytes, tag, ~0ull, &p);
  if (UCS_PTR_IS_PTR(r)) {
    s.req = r;  // the callback may already have run
    return;
  }
  s.done = true;
  s.status = UCS_PTR_STATUS(r);
  completed_.push_back(&s);
}

void UcxCollectives::finish(Op& op, ErrorKind kind, std::string err) {
  if (op.finished) return;
  op.finished = true;
  op.kind = kind;
  op.error = std::move(err);
  --open_;
  if (op.error.empty()) return;
  if (kind == ErrorKind::kMismatch && mismatch_.empty()) mismatch_ = op.error;
  if (kind != ErrorKind::kMismatch && peer_error_.empty()) peer_error_ = op.error;
}

void UcxCollectives::handle(Slot& s) {
  if (s.req) ucp_request_free(s.req);
  s.req = nullptr;
  Op& op = *s.op;
  if (op.finished) return;  // the other half of a send that already failed
  auto failed = [&] {
    const std::string& why = peers_[op.peer]->failed;
    return detail::cat(group_.me(), ": ", op.desc.describe(), ": ",
                       op.is_send ? "send to " : "recv from ", group_.who(op.peer), " (step ",
                       op.step, ") failed: ", why.empty() ? ucx_status_text(s.status) : why);
  };
  if (op.is_send) {
    if (s.status != UCS_OK) finish(op, ErrorKind::kPeer, failed());
    else if (op.head.done && (!op.body.used || op.body.done)) finish(op);
  } else if (&s == &op.head) {
    if (s.status == UCS_ERR_MESSAGE_TRUNCATED)
      finish(op, ErrorKind::kMismatch,
             detail::cat(group_.me(), ": ", op_name(op.desc.kind), ": ", group_.who(op.peer),
                         " sent a message of more than ", kHdr + ucx_wire::kInlineMax,
                         " bytes where a header was expected (step ", op.step,
                         "; is it running a different version of torch_rsdp?)"));
    else if (s.status != UCS_OK) finish(op, ErrorKind::kPeer, failed());
    else on_header(op);
  } else if (!op.error.empty()) {
    finish(op, op.kind, op.error);  // the drain after a mismatch
  } else if (s.status == UCS_OK && s.length == op.bytes) {
    finish(op);
  } else if (s.status == UCS_OK || s.status == UCS_ERR_MESSAGE_TRUNCATED) {
    finish(op, ErrorKind::kMismatch,
           detail::cat(group_.me(), ": ", op_name(op.desc.kind), ": the payload from ",
                       group_.who(op.peer), " has ",
                       s.status == UCS_OK ? std::to_string(s.length) : std::string("more"),
                       " bytes, though its header announced ", op.hdr.bytes, " (step ", op.step,
                       ")"));
  } else {
    finish(op, ErrorKind::kPeer, failed());
  }
}

void UcxCollectives::on_header(Op& op) {
  const std::string me_op = group_.me() + ": " + op_name(op.desc.kind) + ": ";
  ucx_wire::HeaderVerdict v =
      ucx_wire::check_header(op.bounce.data(), op.head.length, op.desc, op.step, op.bytes,
                             op.buf, me_op, group_.who(op.peer));
  op.hdr = v.hdr;
  const std::string& err = v.error;
  if (!v.payload_follows) return finish(op, ErrorKind::kMismatch, err);
  // The payload follows as its own message. After a mismatch it is drained
  // into nothing, so that the sender is not left waiting for it.
  if (!err.empty()) {
    op.kind = ErrorKind::kMismatch;
    op.error = err;
    if (mismatch_.empty()) mismatch_ = err;
  }
  post_recv(op.body, err.empty() ? op.buf : nullptr, err.empty() ? op.bytes : 0,
            ucx_wire::coll_tag(op.peer, op.desc.seq, op.step, false));
}

std::string UcxCollectives::outstanding(bool only_failed_peers) const {
  std::string out;
  int n = 0;
  for (size_t i = 0; i < nops_; ++i) {
    const Op& op = *pool_[i];
    const std::string& why = peers_[op.peer]->failed;
    if (op.finished || (only_failed_peers && why.empty())) continue;
    if (++n > 8) continue;
    out += detail::cat(n > 1 ? ", " : "", group_.who(op.peer), " (step ", op.step,
                       op.is_send ? ", send" : ", recv", ")");
    if (only_failed_peers) out += ": unreachable, " + why;
  }
  if (n > 8) out += detail::cat(" and ", n - 8, " more");
  return out;
}

void UcxCollectives::wait() {
  if (nops_ == 0) return;
  const auto spin_end = Clock::now() + std::chrono::microseconds(opts_.spin_us);
  Clock::time_point mismatch_at{}, peer_gone_at{};
  for (;;) {
    bool busy = worker_.progress();
    while (!completed_.empty()) {
      Slot* s = completed_.back();
      completed_.pop_back();
      handle(*s);  // may post (and complete at once) a payload receive
    }
    check_notice();
    std::string gone = peer_error_;
    if (gone.empty() && peer_failed_) {
      std::string who = outstanding(true);
      if (!who.empty())
        gone = detail::cat(group_.me(), ": ", desc_.describe(), " failed while waiting for ", who,
                           " (the peer exited, or gave up after an error of its own)");
    }
    if (!gone.empty()) {
      // A peer that gave up has sent its notice before closing: a moment
      // for it (or its node's) to arrive and say why.
      auto now = Clock::now();
      if (peer_gone_at == Clock::time_point{}) peer_gone_at = now;
      else if (now - peer_gone_at >= kNoticeGrace) fail(ErrorKind::kPeer, gone);
    } else if (open_ == 0) {
      break;
    }
    if (aborted_.load()) {
      std::string why;
      {
        std::lock_guard<std::mutex> g(abort_mu_);
        why = abort_why_;
      }
      fail(ErrorKind::kPeer, why);
    }
    if (deadline_.expired())
      fail(ErrorKind::kTimeout,
           detail::cat(group_.me(), ": ", desc_.describe(), ": ",
                       timed_out_waiting(deadline_.budget().count()), " for ",
                       outstanding(false)));
    if (!mismatch_.empty()) {
      // The peer that disagrees may never send the rest of this op.
      auto now = Clock::now();
      if (mismatch_at == Clock::time_point{}) mismatch_at = now;
      else if (now - mismatch_at > kMismatchGrace) fail(ErrorKind::kMismatch, mismatch_);
    }
    if (!busy && Clock::now() >= spin_end)
      worker_.sleep(peer_gone_at == Clock::time_point{} ? kSleepSliceMs : 5);
  }
  nops_ = 0;
  if (!mismatch_.empty()) {
    std::string msg;
    msg.swap(mismatch_);
    RSDP_FAIL(ErrorKind::kMismatch, msg);
  }
}

void UcxCollectives::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(abort_mu_);
    if (abort_why_.empty()) abort_why_ = why.empty() ? group_.me() + ": aborted" : why;
  }
  aborted_.store(true);
  worker_.signal();
}

void UcxCollectives::check_notice() {
  if (!heard_remote_ && notice_in_ && notice_in_->done && notice_in_->status == UCS_OK) {
    heard_remote_ = true;
    const int src = static_cast<int>(notice_in_->sender_tag & ucx_wire::kNoticeSrcMask);
    const bool known = src < group_.size;
    Failure f = ucx_wire::decode_notice(&notice_in_->msg, notice_in_->length,
                                        group_.global_ranks, known ? group_.global(src) : -1,
                                        known ? group_.who(src) : "an unknown rank");
    if (notice_) notice_->post(f);  // this node's members learn it too
    fail(f.kind, Notice::heard(group_.me(), desc_.describe(), f));
  }
  if (notice_ && notice_->posted()) fail(ErrorKind::kPeer, "");
}

void UcxCollectives::fail(ErrorKind kind, std::string msg) {
  // The first failure posted on the node's notice is the group's (an empty
  // msg: only heard of); a rank that failed on its own account after that
  // raises that one too, naming its reporter. The rank that reported it
  // first-hand tells the other nodes before it closes its endpoints.
  Failure own{me(), kind, msg};
  if (notice_ && !heard_remote_ && !msg.empty()) notice_->post(own);
  Failure f = notice_ ? notice_->read() : own;
  if (f.origin >= 0 && f.origin != me()) {
    kind = f.kind;
    msg = Notice::heard(group_.me(), desc_.describe(), f);
  } else if (msg.empty()) {
    msg = f.origin == me() ? group_.me() + ": " + f.text
                           : group_.me() + ": " + desc_.describe() +
                                 ": another member gave up (its report could not be read)";
  }
  if (!heard_remote_ && f.origin == me()) tell_others(f);
  broken_ = msg;
  begun_ = false;
  release_requests();
  mismatch_.clear();
  peer_error_.clear();
  RSDP_FAIL(kind, msg, "; the group is unusable from now on");
}

void UcxCollectives::spread() {
  if (!broken_.empty() || !notice_ || !notice_->posted()) return;
  Failure f = notice_->read();
  if (f.origin == me()) tell_others(f);
  broken_ = f.origin == me() ? group_.me() + ": " + f.text : Notice::heard(group_.me(), "", f);
  begun_ = false;
  release_requests();
  mismatch_.clear();
  peer_error_.clear();
}

namespace {
// File descriptors this process may still open below its soft limit, less a
// reserve for everything else it does.
long fd_headroom() {
  constexpr long kReserve = 64;
  struct rlimit lim {};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 1L << 30;
  long open = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++open;
    closedir(d);
  }
  return static_cast<long>(lim.rlim_cur) - open - kReserve;
}
}  // namespace

void UcxCollectives::tell_others(const Failure& f) {
  if (told_) return;
  told_ = true;
  notice_out_ = std::make_unique<NoticeWire>();
  auto& m = notice_out_->msg;
  const std::string text = without_rank_prefix(f.text);
  m.magic = ucx_wire::kNoticeMagic;
  m.origin = f.origin;
  m.kind = static_cast<uint32_t>(f.kind);
  m.len = static_cast<uint32_t>(std::min(text.size(), kNoticeTextBytes));
  std::memcpy(m.text, text.data(), m.len);
  // Members on this node read the node's notice; those on others get it here.
  // A member this rank has no endpoint to yet gets one now, if its address
  // is published already (no waiting) and while the bound lasts.
  Deadline connecting(std::chrono::duration_cast<std::chrono::milliseconds>(kTellBound));
  struct Sent {
    void* req;  // null: sent at once
    int node;
    bool fresh;  // on an endpoint made here
  };
  std::vector<Sent> sent;
  int nodes = 0;
  for (int n : node_of_) nodes = std::max(nodes, n + 1);
  // One member per node is enough (it posts the notice on its node), more make
  // it likelier that one of them is progressing UCX. So: members already
  // connected first, then one fresh member of each node still uncovered, then
  // the others; fresh endpoints only within the file descriptors this process
  // may still open (an endpoint over TCP is a socket), so that at thousands of
  // ranks every node is reached before the limit, not the first nodes only.
  std::vector<int> order;
  std::vector<char> covered(nodes, 0), queued(group_.size, 0);
  auto add = [&](int r) { order.push_back(r), queued[r] = 1, covered[node_of_[r]] = 1; };
  for (int r = 0; r < group_.size; ++r)
    if (r != group_.rank && node_of_[r] == node_of_[group_.rank]) queued[r] = 1;
  queued[group_.rank] = 1;
  for (int r = 0; r < group_.size; ++r)
    if (!queued[r] && peers_[r]->ep) add(r);
  for (int r = 0; r < group_.size; ++r)
    if (!queued[r] && !covered[node_of_[r]]) add(r);
  for (int r = 0; r < group_.size; ++r)
    if (!queued[r]) add(r);
  // An endpoint over TCP opens a socket and may open a second (UCX connects
  // from both sides when both send): two descriptors each.
  long fd_budget = fd_headroom() / 2;
  for (int r : order) {
    const bool fresh = !peers_[r]->ep;
    if (fresh && !connecting.expired() && fd_budget-- > 0) {
      try {
        UcxAddressBook::Pair a;
        if (book_.try_get(r, a)) connect(r, a.coll);
      } catch (const std::exception&) {
        // Unreachable or malformed: the member still has its own deadline.
      }
    }
    if (!peers_[r]->ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(1);
    ucs_status_ptr_t s = ucp_tag_send_nbx(peers_[r]->ep, &m, ucx_wire::kNoticeHead + m.len,
                                          ucx_wire::notice_tag(group_.rank), &p);
    if (!UCS_PTR_IS_ERR(s))
      sent.push_back({UCS_PTR_IS_PTR(s) ? s : nullptr, node_of_[r], fresh});
  }
  // Bounded: a peer that is gone cannot hold the failure up. Done when the
  // sends on endpoints that carried traffic left, and every node has one
  // member that took the notice: it posts the notice on its node. A fresh
  // endpoint completes only once its peer progresses UCX, which a member
  // waiting in shared memory does not do; its node mates that do suffice.
  Deadline dl(std::chrono::duration_cast<std::chrono::milliseconds>(kTellBound));
  for (;;) {
    bool pending = false;
    std::vector<char> reached(nodes, 0), waiting(nodes, 0);
    for (const Sent& s : sent) {
      const ucs_status_t st = s.req ? ucp_request_check_status(s.req) : UCS_OK;
      if (st == UCS_OK) reached[s.node] = 1;
      else if (st == UCS_INPROGRESS && s.fresh) waiting[s.node] = 1;
      else if (st == UCS_INPROGRESS) pending = true;
    }
    for (int n = 0; n < nodes; ++n) pending |= waiting[n] && !reached[n];
    if (!pending || dl.expired()) break;
    if (!worker_.progress()) worker_.sleep(1);
  }
  // One still in flight is released when UCX completes it (the endpoint
  // closes next); its buffer lives as long as this object.
  for (const Sent& s : sent)
    if (s.req) ucp_request_free(s.req);
}
// Cancels the receives, closes every endpoint (which fails the sends) and
// progresses until UCX gave back every request, so that no buffer is touched
// after this returns. Bounded: a request UCX still holds after that is
// released unfinished.
void UcxCollectives::release_requests() {
  auto each_pending = [&](auto fn) {
    for (size_t i = 0; i < nops_; ++i)
      for (Slot* s : {&pool_[i]->head, &pool_[i]->body})
        if (s->req && !s->done) fn(*pool_[i], *s);
  };
  each_pending([&](Op& op, Slot& s) {
    if (!op.is_send) ucp_request_cancel(worker_.get(), s.req);
  });
  // No notice is listened for after this: the group is broken, or going.
  if (notice_req_ && !notice_in_->done) ucp_request_cancel(worker_.get(), notice_req_);
  std::vector<UcxWorker::Closing> eps;
  for (auto& p : peers_) eps.push_back({&p->ep, broken_.empty() && p->sent});
  worker_.close_endpoints(eps, std::chrono::milliseconds(2000));
  endpoints_ = 0;
  Deadline dl(std::chrono::milliseconds(1000));
  for (;;) {
    bool pending = false;
    each_pending([&](Op&, Slot&) { pending = true; });
    if (notice_req_ && !notice_in_->done) pending = true;
    if (!pending || dl.expired()) break;
    if (!worker_.progress()) worker_.sleep(5);
  }
  for (size_t i = 0; i < nops_; ++i)
    for (Slot* s : {&pool_[i]->head, &pool_[i]->body}) {
      if (s->req) ucp_request_free(s->req);
      s->req = nullptr;
    }
  if (notice_req_) ucp_request_free(notice_req_);
  notice_req_ = nullptr;
  nops_ = open_ = 0;
  completed_.clear();
}

}  // namespace rsdp
