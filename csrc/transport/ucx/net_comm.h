// The network transport of a process group that spans nodes: UCX's UCP tag
// API between every pair of group ranks (UCX picks the wire: TCP here,
// InfiniBand or shared memory where UCX_TLS allows).
//
// Two UCX workers per group, so the two users never share one:
//  * the collective worker, driven only by the thread running collectives
//    (one at a time, like ShmComm): post isend/irecv for the current op,
//    then wait() for all of them;
//  * the point-to-point worker, driven by its own progress thread (started
//    by the first send/recv) for torch.distributed send/recv/recv-any-source.
// Each rank publishes its worker addresses through the store at construction
// and reads a peer's when it first sends to or receives from it: endpoints
// are made on first use, so a rank holds one per peer it actually reaches.
//
// Every collective message carries the sender's OpDesc and step; a receiver
// whose own descriptor differs raises a mismatch naming both sides, never
// reads a wrong-sized message. Endpoints use UCX peer error handling, so a
// dead peer fails the waits that involve it; every wait also has the op's
// deadline. Messages to ranks on the same node count as intra-node traffic,
// others as inter-node. A rank that finds the group broken tells the members
// on other nodes (ucx_coll.h, [Note: the notice across nodes]), and learns
// of it from them and from its node's notice (core/notice.h).
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/deadline.h"
#include "core/group.h"
#include "core/notice.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/traffic.h"

namespace rsdp {

class NetComm {
 public:
  // Collective over the group: every rank constructs one. node_of[r] is
  // group rank r's node index (for traffic accounting and error messages).
  // `notice`: this node's (ShmComm::notice()), which must outlive this
  // object; null: the members of this node are not told of a failure here.
  // `store` must outlive this object too (peers' addresses are read from it
  // when they are first reached).
  NetComm(const Group& group, std::vector<int> node_of, Bootstrap& store, const Options& opts,
          Traffic* traffic, Notice* notice = nullptr);
  ~NetComm();
  NetComm(const NetComm&) = delete;
  NetComm& operator=(const NetComm&) = delete;

  const Group& group() const;
  int rank() const;
  int size() const;

  // --- collectives (one thread at a time) ---
  // Sets the op that the next messages belong to: desc.seq must already be
  // assigned by the caller (identical on all ranks), and tags use it. Can be
  // called several times for one op (each stage of a hierarchical op).
  void begin(const OpDesc& desc, Deadline deadline);
  // Post a message of the current op to / from group rank `peer`. `step`
  // (< 2^20) tells messages of one op apart; buffers must stay valid until
  // wait() returns. A zero-byte message is still sent (it synchronises).
  void isend(int peer, const void* buf, size_t bytes, uint32_t step);
  void irecv(int peer, void* buf, size_t bytes, uint32_t step);
  // Completes everything posted since the last wait(). Throws rsdp::Error:
  // kMismatch when a peer's descriptor or size differs, kTimeout at the
  // deadline (naming the peers still outstanding), kPeer when UCX reports
  // the peer unreachable. After a timeout or peer failure the comm is
  // unusable (every later begin() throws).
  void wait();

  // --- point to point (any thread) ---
  // done(err, src) runs exactly once, on the progress thread, when the
  // transfer finished or failed; src is the sender (useful for src == -1, any
  // source), -1 for most failures. Errors: kTimeout when `timeout` passes
  // before the transfer completed, kValue when the message has a different
  // size than the receive buffer (the message is consumed), kPeer when the
  // peer is unreachable, after abort() or destruction. A send that timed out
  // cannot be taken back, so every later operation with that peer fails. An
  // invalid peer (or the comm's own rank) throws kValue here instead, and
  // done is not called.
  using Done = std::function<void(std::exception_ptr, int src)>;
  void p2p_send(const void* buf, size_t bytes, int dst, int tag, std::chrono::milliseconds timeout,
                Done done);
  void p2p_recv(void* buf, size_t bytes, int src, int tag, std::chrono::milliseconds timeout,
                Done done);

  // Makes every current and future wait fail with `why`.
  void abort(const std::string& why);
  // After a failure found elsewhere (shared memory, abort), on the thread
  // that runs collectives: tells the other nodes if this rank reported it,
  // and leaves the collectives broken. Does nothing while no failure is posted.
  void spread();

  // UCX endpoints this rank holds now, collective and point-to-point (any thread).
  int endpoints() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rsdp
