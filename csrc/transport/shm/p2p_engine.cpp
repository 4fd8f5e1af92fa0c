#include "transport/shm/p2p_engine.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/futex.h"
#include "transport/shm/p2p_wire.h"

namespace rsdp {
namespace {

using Clock = std::chrono::steady_clock;

using p2p_wire::kHdr;
using p2p_wire::MsgHeader;
using p2p_wire::ring_read;
using p2p_wire::ring_write;

}  // namespace

struct P2PEngine::Request {
  bool is_send;
  int peer;  // -1: any source
  int64_t tag;
  char* data;
  size_t bytes;
  Deadline deadline;
  Done done;
  size_t moved = 0;
  bool header_done = false;

  std::string what(const Group& g) const {
    return detail::cat(is_send ? "send to " : "recv from ",
                       peer < 0 ? std::string("any rank") : g.who(peer), " (tag ", tag, ", ",
                       bytes, " bytes)");
  }
};

struct P2PEngine::Stashed {
  int src;
  int64_t tag;
  std::vector<char> data;
  bool complete = false;
};

struct P2PEngine::Incoming {
  bool active = false;
  uint64_t bytes = 0, moved = 0;
  std::unique_ptr<Request> req;  // matched recv, or
  Stashed* stash = nullptr;      // early arrival, or neither: discard
};

P2PEngine::P2PEngine(ShmComm& comm) : comm_(comm) {
  sends_.resize(comm.size());
  send_seq_.assign(comm.size(), 0);
  recv_seq_.assign(comm.size(), 0);
  broken_dst_.assign(comm.size(), false);
  broken_src_.assign(comm.size(), false);
  for (int i = 0; i < comm.size(); ++i) incoming_.push_back(std::make_unique<Incoming>());
  thread_ = std::thread([this] { run(); });
}

P2PEngine::~P2PEngine() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  comm_.ring_doorbell(comm_.rank());
  thread_.join();
}

void P2PEngine::send(const void* data, size_t bytes, int dst, int64_t tag,
                     std::chrono::milliseconds timeout, Done done) {
  submit(std::unique_ptr<Request>(new Request{true, dst, tag,
                                              const_cast<char*>(static_cast<const char*>(data)),
                                              bytes, Deadline(timeout), std::move(done)}));
}

void P2PEngine::recv(void* data, size_t bytes, int src, int64_t tag,
                     std::chrono::milliseconds timeout, Done done) {
  submit(std::unique_ptr<Request>(new Request{false, src, tag, static_cast<char*>(data), bytes,
                                              Deadline(timeout), std::move(done)}));
}

void P2PEngine::submit(std::unique_ptr<Request> r) {
  {
    std::lock_guard<std::mutex> g(mu_);
    submitted_.push_back(std::move(r));
  }
  comm_.ring_doorbell(comm_.rank());
}

void P2PEngine::finish(std::unique_ptr<Request>& r, std::exception_ptr err, int src) {
  std::unique_ptr<Request> mine = std::move(r);
  try {
    mine->done(err, src);
  } catch (...) {
    // A completion callback must not take the engine down.
  }
}

void P2PEngine::run() {
  const int me = comm_.rank();
  auto& bell = comm_.doorbell(me);
  auto& sleepers = comm_.doorbell_sleepers(me);
  auto last_check = Clock::now();
  for (;;) {
    uint32_t seen = bell.load(std::memory_order_seq_cst);
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) break;
      for (auto& r : submitted_) {
        if (r->is_send) sends_[r->peer].push_back(std::move(r));
        else recvs_.push_back(std::move(r));
      }
      submitted_.clear();
    }
    bool moved;
    try {
      moved = progress();
      // On a timer, even under steady traffic, so a stuck peer cannot hide
      // behind a busy one.
      auto now = Clock::now();
      if (now - last_check > std::chrono::milliseconds(20)) {
        check_deadlines();
        last_check = now;
      }
    } catch (...) {
      // E.g. out of memory for a stashed message: fail what is pending
      // instead of taking the process down.
      fail_all(std::current_exception());
      moved = true;
    }
    if (moved) continue;
    auto now = Clock::now();
    // Briefly poll for the doorbell, then sleep on it.
    auto spin_end = now + std::chrono::microseconds(20);
    while (bell.load(std::memory_order_acquire) == seen && Clock::now() < spin_end) cpu_relax();
    if (bell.load(std::memory_order_acquire) != seen) continue;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (bell.load(std::memory_order_seq_cst) == seen) futex_wait(&bell, seen, 20000);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  // Shutting down: whatever is still pending fails instead of hanging.
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& r : submitted_) {
      if (r->is_send) sends_[r->peer].push_back(std::move(r));
      else recvs_.push_back(std::move(r));
    }
    submitted_.clear();
  }
  fail_all(std::make_exception_ptr(Error(
      ErrorKind::kPeer, comm_.group().me() + ": the process group was destroyed while this "
                                             "send/recv was pending")));
}

void P2PEngine::fail_all(std::exception_ptr err) {
  for (int p = 0; p < comm_.size(); ++p) {
    // Streams with a message half-way cannot be resumed.
    if (!sends_[p].empty() && sends_[p].front()->header_done) broken_dst_[p] = true;
    if (incoming_[p]->active) broken_src_[p] = true;
  }
  for (auto& q : sends_) {
    for (auto& r : q) finish(r, err, -1);
    q.clear();
  }
  for (auto& r : recvs_) finish(r, err, -1);
  recvs_.clear();
  for (auto& in : incoming_)
    if (in->req) finish(in->req, err, -1);
}

void P2PEngine::fail_recvs_from(int src, const std::string& msg) {
  auto err = std::make_exception_ptr(Error(ErrorKind::kPeer, msg));
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if ((*it)->peer == src) {
      finish(*it, err, -1);
      it = recvs_.erase(it);
    } else {
      ++it;
    }
  }
  if (incoming_[src]->req) finish(incoming_[src]->req, err, -1);
}

bool P2PEngine::progress() {
  bool any = false;
  for (int p = 0; p < comm_.size(); ++p) {
    if (p == comm_.rank()) continue;
    any |= progress_incoming(p);
    any |= progress_send(p);
  }
  any |= deliver_stashed();
  return any;
}

bool P2PEngine::progress_send(int dst) {
  auto& q = sends_[dst];
  if (q.empty()) return false;
  if (broken_dst_[dst]) {
    auto err = std::make_exception_ptr(Error(
        ErrorKind::kPeer, detail::cat(comm_.group().me(), ": send to ", comm_.group().who(dst),
                                      " refused: an earlier send to it was abandoned half-way")));
    for (auto& r : q) finish(r, err, -1);
    q.clear();
    return true;
  }
  Request& r = *q.front();
  RingView v = comm_.ring(comm_.rank(), dst);
  uint64_t head = v.ctl->head.load(std::memory_order_relaxed);
  uint64_t tail = v.ctl->tail.load(std::memory_order_acquire);
  size_t fill = 0;
  if (!p2p_wire::ring_fill(head, tail, v.cap, &fill)) {
    // The receiver's counter (or ours, in shared memory) was overwritten:
    // writing by it would run past the ring.
    broken_dst_[dst] = true;
    auto err = std::make_exception_ptr(Error(
        ErrorKind::kPeer,
        detail::cat(comm_.group().me(), ": ", r.what(comm_.group()), " failed: the ring to ",
                    comm_.group().who(dst), " is corrupt (written up to byte ", head,
                    ", read up to byte ", tail, " of a ", v.cap, "-byte ring)")));
    for (auto& qr : q) finish(qr, err, -1);
    q.clear();
    return true;
  }
  size_t room = v.cap - fill;
  bool moved = false;
  if (!r.header_done) {
    if (room < kHdr) return false;
    MsgHeader h{p2p_wire::kMsgMagic, send_seq_[dst]++, r.tag, r.bytes};
    ring_write(v, head, &h, kHdr);
    head += kHdr;
    room -= kHdr;
    r.header_done = moved = true;
  }
  size_t n = std::min(room, r.bytes - r.moved);
  if (n > 0) {
    ring_write(v, head, r.data + r.moved, n);
    head += n;
    r.moved += n;
    moved = true;
  }
  if (moved) {
    v.ctl->head.store(head, std::memory_order_release);
    comm_.ring_doorbell(dst);
  }
  if (r.moved == r.bytes) {
    finish(q.front(), nullptr, dst);
    q.pop_front();
  }
  return moved;
}

bool P2PEngine::progress_incoming(int src) {
  if (broken_src_[src]) return false;
  Incoming& in = *incoming_[src];
  RingView v = comm_.ring(src, comm_.rank());
  uint64_t tail = v.ctl->tail.load(std::memory_order_relaxed);
  uint64_t head = v.ctl->head.load(std::memory_order_acquire);
  size_t avail = 0;
  if (!p2p_wire::ring_fill(head, tail, v.cap, &avail)) {
    // Counters no sender could have left: reading by them would run past the ring.
    broken_src_[src] = true;
    fail_recvs_from(src, detail::cat(comm_.group().me(), ": the ring from ",
                                     comm_.group().who(src), " is corrupt (written up to byte ",
                                     head, ", read up to byte ", tail, " of a ", v.cap,
                                     "-byte ring)"));
    return false;
  }
  bool moved = false;
  if (!in.active) {
    MsgHeader h;
    const p2p_wire::Next next = p2p_wire::read_header(v, tail, avail, recv_seq_[src], &h);
    if (next == p2p_wire::Next::kWait) return false;
    if (next == p2p_wire::Next::kCorrupt) {
      // Only a sender that died or gave up half-way leaves a torn stream.
      broken_src_[src] = true;
      fail_recvs_from(src, detail::cat(comm_.group().me(), ": the byte stream from ",
                                       comm_.group().who(src),
                                       " is corrupt (a send was abandoned half-way)"));
      return false;
    }
    ++recv_seq_[src];
    tail += kHdr;
    avail -= kHdr;
    moved = in.active = true;
    in.bytes = h.bytes;
    in.moved = 0;
    // The oldest posted recv that matches and has no older stashed message
    // of its own to take first.
    auto matches = [&](const Request& r, int s, int64_t t) {
      return (r.peer == s || r.peer == -1) && r.tag == t;
    };
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if (!matches(**it, src, h.tag)) continue;
      bool older = std::any_of(stash_.begin(), stash_.end(),
                               [&](const auto& s) { return matches(**it, s->src, s->tag); });
      if (older) continue;
      if ((*it)->bytes != h.bytes) {
        auto err = std::make_exception_ptr(Error(
            ErrorKind::kValue,
            detail::cat(comm_.group().me(), ": ", (*it)->what(comm_.group()), " got a message of ",
                        h.bytes, " bytes from ", comm_.group().who(src),
                        "; the receive tensor must have exactly the size that was sent")));
        finish(*it, err, src);
      } else {
        in.req = std::move(*it);
      }
      recvs_.erase(it);
      break;
    }
    if (!in.req) {
      // Nobody waits for it yet (or the waiting recv had the wrong size):
      // keep it for a later recv.
      // Its size is the sender's word: one no memory can hold fails the
      // receives from that sender, naming it, not every pending operation.
      std::unique_ptr<Stashed> kept;
      try {
        kept = std::make_unique<Stashed>(Stashed{src, h.tag, std::vector<char>(h.bytes)});
      } catch (const std::exception& e) {
        broken_src_[src] = true;
        in.active = false;
        fail_recvs_from(src, detail::cat(comm_.group().me(), ": a message of ", h.bytes,
                                         " bytes (tag ", h.tag, ") from ", comm_.group().who(src),
                                         " arrived before its receive and cannot be held (",
                                         e.what(), ")"));
        return true;
      }
      stash_.push_back(std::move(kept));
      in.stash = stash_.back().get();
    }
  }
  size_t n = std::min<size_t>(avail, in.bytes - in.moved);
  if (n > 0) {
    // Neither a recv nor a stash entry: its recv timed out; drop the rest.
    if (in.req) ring_read(v, tail, in.req->data + in.moved, n);
    else if (in.stash) ring_read(v, tail, in.stash->data.data() + in.moved, n);
    tail += n;
    in.moved += n;
    moved = true;
  }
  if (moved) {
    v.ctl->tail.store(tail, std::memory_order_release);
    comm_.ring_doorbell(src);
  }
  if (in.active && in.moved == in.bytes) {
    if (in.req) finish(in.req, nullptr, src);
    if (in.stash) in.stash->complete = true;
    in.active = false;
    in.stash = nullptr;
  }
  return moved;
}

bool P2PEngine::deliver_stashed() {
  bool any = false;
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    Request& r = **it;
    auto s = std::find_if(stash_.begin(), stash_.end(), [&](const auto& e) {
      return (r.peer == e->src || r.peer == -1) && r.tag == e->tag;
    });
    if (s == stash_.end() || !(*s)->complete) {
      ++it;
      continue;
    }
    int src = (*s)->src;
    std::exception_ptr err;
    if ((*s)->data.size() != r.bytes) {
      // The recv fails; the message stays for a later recv of the right size
      // (the same rule as for a message matched on arrival).
      err = std::make_exception_ptr(Error(
          ErrorKind::kValue,
          detail::cat(comm_.group().me(), ": ", r.what(comm_.group()), " got a message of ",
                      (*s)->data.size(), " bytes from ", comm_.group().who(src),
                      "; the receive tensor must have exactly the size that was sent")));
    } else {
      if (r.bytes) std::memcpy(r.data, (*s)->data.data(), r.bytes);
      stash_.erase(s);
    }
    finish(*it, err, src);
    it = recvs_.erase(it);
    any = true;
  }
  return any;
}

void P2PEngine::check_deadlines() {
  const Group& g = comm_.group();
  if (comm_.notice().posted()) {
    // The group broke (core/notice.h): what is pending, and what comes
    // later, fails with the failure that broke it.
    Failure f = comm_.notice().read();
    fail_all(std::make_exception_ptr(Error(f.kind, Notice::heard(g.me(), "send/recv", f))));
    return;
  }
  auto fail_if_stuck = [&](std::unique_ptr<Request>& r) -> bool {
    bool dead = r->peer >= 0 && (!comm_.peer_alive(r->peer) ||
                                 (!r->is_send && broken_src_[r->peer]));
    if (!dead && !r->deadline.expired()) return false;
    std::string msg =
        dead ? detail::cat(g.me(), ": ", r->what(g), " failed: ", g.who(r->peer), " (pid ",
                           g.peers[r->peer].pid, ") exited")
             : detail::cat(g.me(), ": ", r->what(g), ": ",
                           timed_out_waiting(r->deadline.budget().count()));
    finish(r, std::make_exception_ptr(Error(dead ? ErrorKind::kPeer : ErrorKind::kTimeout, msg)),
           -1);
    return true;
  };
  for (int dst = 0; dst < static_cast<int>(sends_.size()); ++dst) {
    auto& q = sends_[dst];
    // A send stuck half-way leaves the byte stream to that peer unusable, so
    // everything queued behind it fails too, and so does every later send.
    if (q.empty()) continue;
    const bool started = q.front()->header_done;
    if (!fail_if_stuck(q.front())) continue;
    if (started) broken_dst_[dst] = true;
    auto err = std::make_exception_ptr(Error(
        ErrorKind::kPeer, detail::cat(g.me(), ": send to ", g.who(dst),
                                      " not attempted: an earlier send to it failed")));
    for (size_t i = 1; i < q.size(); ++i) finish(q[i], err, -1);
    q.clear();
  }
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    if (fail_if_stuck(*it)) it = recvs_.erase(it);
    else ++it;
  }
  for (auto& in : incoming_)
    if (in->req && fail_if_stuck(in->req)) in->req.reset();  // rest of payload is discarded
}

}  // namespace rsdp
