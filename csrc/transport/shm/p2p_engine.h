// Point-to-point send/recv over the per-pair shared-memory rings.
//
// Each ordered pair (src, dst) has a single-producer/single-consumer byte ring.
// A message is a header (p2p_wire.h) followed by its payload; payloads larger
// than the ring stream through it. One progress thread per group moves
// every pending send and receive a little at a time, so a rank can have sends
// and receives to many peers outstanding at once without deadlocking on a full
// ring. Messages that arrive before a matching recv is posted are drained into
// a private stash (eager semantics), which keeps each (src, tag) stream in
// order: a recv always takes the oldest matching message. Once the group's
// notice holds a failure (core/notice.h), what is pending fails with it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "transport/shm/shm_comm.h"

namespace rsdp {

class P2PEngine {
 public:
  // Called once, on the engine thread: error (or null) and the source rank.
  using Done = std::function<void(std::exception_ptr, int)>;

  explicit P2PEngine(ShmComm& comm);
  ~P2PEngine();  // fails what is still pending, then joins the thread

  void send(const void* data, size_t bytes, int dst, int64_t tag,
            std::chrono::milliseconds timeout, Done done);
  // src == -1 receives from any source.
  void recv(void* data, size_t bytes, int src, int64_t tag, std::chrono::milliseconds timeout,
            Done done);

 private:
  struct Request;
  struct Stashed;
  struct Incoming;

  void run();
  bool progress();
  bool progress_send(int dst);
  bool progress_incoming(int src);
  bool deliver_stashed();
  void check_deadlines();
  void finish(std::unique_ptr<Request>& r, std::exception_ptr err, int src);
  void fail_all(std::exception_ptr err);
  void fail_recvs_from(int src, const std::string& msg);
  void submit(std::unique_ptr<Request> r);

  ShmComm& comm_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Request>> submitted_;  // guarded by mu_
  bool stop_ = false;                                // guarded by mu_

  // Engine-thread state.
  std::vector<std::deque<std::unique_ptr<Request>>> sends_;  // per dst, FIFO
  std::list<std::unique_ptr<Request>> recvs_;                // posted, in order
  std::list<std::unique_ptr<Stashed>> stash_;                // arrived early, in order
  std::vector<std::unique_ptr<Incoming>> incoming_;          // per src
  std::vector<uint32_t> send_seq_, recv_seq_;                // message numbers per channel
  std::vector<bool> broken_dst_, broken_src_;                // streams torn half-way
  std::thread thread_;
};

}  // namespace rsdp
