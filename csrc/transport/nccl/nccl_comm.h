// One NCCL communicator over a subset of a group's ranks (a node's ranks on
// distinct GPUs, a rail across nodes, or the whole group).
//
// The unique id travels through the group's store. Calls only queue work on
// the given stream. NCCL has no bool or complex types and no MIN/MAX on
// complex; the mapping (nccl_comm.cpp) covers what can be mapped (bool as
// uint8 with MAX for SUM/BOR/MAX and MIN for PRODUCT/BAND/MIN; complex as twice
// as many floats for SUM and AVG) and nccl_supports() says which (dtype, op)
// pairs work at all. A one-rank communicator never gets ncclAvg: AVG goes to
// NCCL as SUM there (nccl_redop_rule.h says why).
//
// The communicator is non-blocking (see nccl_comm.cpp), so no call waits on
// the host past `timeout`. Any NCCL failure aborts the communicator: it is
// unusable afterwards and every later call raises.
//
// Threading: calls come from one thread at a time, except abort() and
// check_async(), which a watchdog may call from another thread at any time.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/group.h"
#include "core/reduce_op.h"

namespace rsdp {

bool nccl_supports(DType dt, RedOp op);
// "2.28.9"
std::string nccl_version();

class NcclComm {
 public:
  // ranks: group ranks in this communicator, in NCCL rank order; the caller
  // is among them. tag: distinguishes communicators of the same group (and
  // must not be reused within one incarnation of the group: it names the
  // store key of the unique id). timeout bounds the constructor and every
  // later host-side wait.
  NcclComm(const Group& g, Bootstrap& store, const std::vector<int>& ranks,
           const std::string& tag, int device, std::chrono::milliseconds timeout);
  // Finalizes and destroys the communicator; aborts it instead if that fails
  // or outlasts the timeout. Nothing is left to do after abort(). Never throws.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }  // NCCL rank
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }

  // root and peer are NCCL ranks (positions in ranks()); counts are elements
  // of dt. A (dtype, op) pair that nccl_supports() rejects raises kValue.
  void allreduce(const void* in, void* out, size_t count, DType dt, RedOp op, cudaStream_t s);
  void broadcast(const void* in, void* out, size_t count, DType dt, int root, cudaStream_t s);
  void reduce(const void* in, void* out, size_t count, DType dt, RedOp op, int root,
              cudaStream_t s);
  // out holds size() * count elements, rank-major.
  void allgather(const void* in, void* out, size_t count, DType dt, cudaStream_t s);
  // in holds size() * count elements, rank-major; out receives count.
  void reduce_scatter(const void* in, void* out, size_t count, DType dt, RedOp op,
                      cudaStream_t s);
  // Point-to-point in bytes; batch several between group_start()/group_end().
  // A group holds only this communicator's calls. A call that raises inside a
  // group closes it and aborts the communicator (the batch cannot be
  // completed); do not call group_end() after that.
  void send(const void* buf, size_t bytes, int peer, cudaStream_t s);
  void recv(void* buf, size_t bytes, int peer, cudaStream_t s);
  void group_start();
  void group_end();

  // Raises if NCCL reported an asynchronous error (a peer died, a network
  // failure; the communicator is then aborted), or if it was aborted before.
  void check_async();
  // Idempotent. Called from another thread while a group is open, it takes
  // effect when that group ends or its next call comes (NCCL would otherwise
  // free a communicator the open group still refers to).
  void abort();

 private:
  std::string who() const;
  // enter() takes mu_ and refuses calls on an aborted communicator; the other
  // helpers run with mu_ held. `result` is an ncclResult_t (nccl.h stays out
  // of this header).
  std::unique_lock<std::mutex> enter(const char* call);
  void settle(std::unique_lock<std::mutex>& lk, int result, const char* call);
  [[noreturn]] void fail(int result, const char* call);
  [[noreturn]] void reject(ErrorKind kind, const std::string& msg);
  std::string refused(const char* call) const;
  void close_group();
  void abort_locked(ErrorKind kind, const std::string& why);

  void* comm_ = nullptr;  // ncclComm_t
  std::vector<int> ranks_;
  int rank_ = -1;
  int device_;
  std::string group_me_;
  std::string tag_;
  std::string comm_name_;  // NCCL keeps a pointer to it (config.commName)
  std::chrono::milliseconds timeout_;
  std::mutex mu_;          // serializes every NCCL call on comm_
  int group_depth_ = 0;    // open group_start() calls
  std::thread::id group_thread_;  // the thread that opened them
  bool abort_requested_ = false;  // abort() came during an open group
  bool aborted_ = false;
  ErrorKind broken_kind_ = ErrorKind::kPeer;
  std::string broken_;     // why the communicator was aborted
};

}  // namespace rsdp
