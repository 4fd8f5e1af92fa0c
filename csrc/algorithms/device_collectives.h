// Collectives over device (GPU) memory.
//
// The entries in algorithms/collectives.h hand an op to the group's
// DeviceCollectives when the op's buffers live on the group's device
// (GroupComm::device_op). Signatures mirror coll:: minus the GroupComm; all
// pointers are device pointers, and arrays are indexed by group rank.
// Every call only queues work on the stream set with set_stream() and returns;
// the host blocks at most until its peers have queued the same op.
//
// This header is free of torch and of CUDA, so CPU-only builds compile the
// dispatch; the CUDA implementation lives in algorithms/cuda/.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/reduce_op.h"

namespace rsdp {

class DeviceCollectives {
 public:
  using Millis = std::chrono::milliseconds;
  virtual ~DeviceCollectives() = default;

  virtual int device() const = 0;
  // The stream (a cudaStream_t) the next ops queue on.
  virtual void set_stream(void* stream) = 0;
  // Which paths serve this group, e.g. "intra-node: cuda-ipc (4 ranks on 1 GPU)".
  virtual std::string describe() const = 0;

  virtual void broadcast(void* buf, size_t count, DType dt, int root, Millis timeout) = 0;
  virtual void allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout) = 0;
  virtual void reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) = 0;
  virtual void allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                         Millis timeout) = 0;
  virtual void gather(const void* in, void* const* outs, size_t count, DType dt, int root,
                      Millis timeout) = 0;
  virtual void scatter(const void* const* ins, void* out, size_t count, DType dt, int root,
                       Millis timeout) = 0;
  virtual void reduce_scatter(const void* const* ins, void* out, const uint64_t* counts,
                              DType dt, RedOp op, Millis timeout) = 0;
  virtual void alltoall(const void* const* sends, const uint64_t* send_bytes,
                        void* const* recvs, const uint64_t* recv_bytes, DType dt,
                        Millis timeout) = 0;
  virtual void ring_shift(const std::vector<int>& order, const void* send, void* recv,
                          size_t count, DType dt, int direction, const void* add,
                          Millis timeout) = 0;

  // Makes every later op fail with `why` (communicators are aborted, not
  // destroyed, so a wedged peer cannot hang the caller).
  virtual void abort(const std::string& why) = 0;
};

}  // namespace rsdp
