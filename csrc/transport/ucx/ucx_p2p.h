// Point-to-point send/recv of a NetComm over its own UCX worker.
//
// torch.distributed send/recv may be called from any thread and complete in
// any order, while a UCX worker wants one thread. So callers only queue the
// operation (under a mutex) and signal the worker; a progress thread, started
// by the first operation, posts it, drives the worker and runs the completion
// callbacks. The thread sleeps on the worker's event fd when idle.
//
// Each operation has its own deadline: an unmatched receive is cancelled and
// fails with kTimeout. A send that times out can only be taken back by closing
// the endpoint, so every later operation with that peer fails too (like a
// torn stream in the shared-memory engine). UCX's peer error handling fails
// the operations of a peer that died with kPeer. Once the node's notice holds
// a failure (core/notice.h), what is pending and what comes later fails with it.
//
// Endpoints are made on first use, by the progress thread, from the address
// the peer published (UcxAddressBook). An operation whose peer has not
// published yet waits, without holding up the others, and is retried on the
// progress thread's timer until its own deadline, which then names the peer.
// send()/recv() read the address on the caller's thread first, so that the
// progress thread asks the store only for a peer that is late: the store
// serialises its requests, and another thread of this process may be in a
// long wait on it (monitored_barrier, a device rendezvous).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/group.h"
#include "core/notice.h"
#include "core/traffic.h"
#include "transport/ucx/ucx_address_book.h"
#include "transport/ucx/ucx_worker.h"

namespace rsdp {

class UcxP2P {
 public:
  using Done = std::function<void(std::exception_ptr, int src)>;

  // `worker` and `book` must outlive this object.
  UcxP2P(const Group& group, UcxWorker& worker, UcxAddressBook& book, std::vector<int> node_of,
         Traffic* traffic, bool debug, Notice* notice = nullptr);
  ~UcxP2P();  // fails what is pending, joins the thread, closes endpoints

  void send(const void* buf, size_t bytes, int dst, int tag, std::chrono::milliseconds timeout,
            Done done);
  void recv(void* buf, size_t bytes, int src, int tag, std::chrono::milliseconds timeout,
            Done done);
  // Fails everything pending and everything submitted later with kPeer `why`.
  void abort(const std::string& why);
  // Endpoints open now (any thread).
  int endpoints() const { return endpoints_.load(); }

  struct Op;
  struct Peer;

 private:
  void submit(std::unique_ptr<Op> op);
  // Reads `peer`'s address on the caller's thread when it is not known yet.
  void look_up(int peer);
  void run();
  void post(std::unique_ptr<Op> op);
  // Posts the operations whose peer has published its address since.
  void retry_unaddressed();
  void reap();
  void check_deadlines();
  void fail_peer(int p, const std::string& why);
  void fail_all(const std::string& why, ErrorKind kind = ErrorKind::kPeer);
  void shutdown();
  void finish(Op& op, std::exception_ptr err, int src);
  ucp_ep_h endpoint(int p);

  const Group& group_;
  UcxWorker& worker_;
  UcxAddressBook& book_;
  std::vector<int> node_of_;
  Traffic* traffic_;
  bool debug_;
  Notice* notice_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Op>> submitted_;  // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  std::string aborted_;                         // guarded by mu_
  ErrorKind aborted_kind_ = ErrorKind::kPeer;   // guarded by mu_
  std::thread thread_;                          // started by the first submit

  // Progress-thread state.
  std::vector<std::unique_ptr<Peer>> peers_;
  // Posted operations, until UCX has released them; an operation already
  // reported (timed out, failed) stays here while UCX still owns its request.
  std::list<std::unique_ptr<Op>> active_;
  // Operations waiting for their peer's address (not yet given to UCX).
  std::list<std::unique_ptr<Op>> unaddressed_;
  std::atomic<int> endpoints_{0};
  std::vector<ucs_status_ptr_t> closing_;  // endpoint closes in progress
  bool peer_failed_ = false;               // set by the error handler
  bool abort_handled_ = false;
};

}  // namespace rsdp
