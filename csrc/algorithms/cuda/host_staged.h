// The fallback for CUDA ops without a device algorithm: copy the device
// buffers to host memory, run the CPU algorithm of algorithms/collectives.h
// (shared memory and UCX), copy the results back. The worker thread waits
// for the stream here (the caller does not); slower, but every op and every
// topology works.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "algorithms/group_comm.h"

namespace rsdp {

class HostStaged {
 public:
  using Millis = std::chrono::milliseconds;
  HostStaged(GroupComm& g, cudaStream_t s) : g_(g), s_(s) {}

  void broadcast(void* buf, size_t count, DType dt, int root, Millis timeout);
  void allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout);
  void reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout);
  void allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                 Millis timeout);
  void gather(const void* in, void* const* outs, size_t count, DType dt, int root,
              Millis timeout);
  void scatter(const void* const* ins, void* out, size_t count, DType dt, int root,
               Millis timeout);
  void reduce_scatter(const void* const* ins, void* out, const uint64_t* counts, DType dt,
                      RedOp op, Millis timeout);
  void alltoall(const void* const* sends, const uint64_t* send_bytes, void* const* recvs,
                const uint64_t* recv_bytes, DType dt, Millis timeout);
  void ring_shift(const std::vector<int>& order, const void* send, void* recv, size_t count,
                  DType dt, int direction, const void* add, Millis timeout);

 private:
  using Bytes = std::vector<char>;
  Bytes down(const void* dev, size_t bytes);       // device -> host, waits
  void up(void* dev, const Bytes& host);           // host -> device, waits
  void sync();

  GroupComm& g_;
  cudaStream_t s_;
};

}  // namespace rsdp
