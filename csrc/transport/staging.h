// The staging interface: what a single-node collective algorithm needs of the
// memory its ranks share. The algorithms of algorithms/algorithms.h are
// written once over it; three transports implement it:
//   ShmComm  (transport/shm)       host shared memory, memcpy and the CPU kernels,
//                                  run on the calling thread;
//   IpcComm  (transport/cuda_ipc)  device buffers mapped through CUDA IPC,
//                                  copies and kernels queued on the op's stream;
//   EmuComm  (transport/emu)       the emulated device CI runs: host buffers, a
//                                  stream thread, events as flags.
//
// Collectives run as *steps*. In a step every rank fills its staging half
// (stage()) with copy()/reduce(), exchange() publishes it and synchronises
// with every peer, and after that the peers' halves of the step are readable
// (peer(p)). Two halves are used alternately; each transport explains why
// two are enough under its own ordering (shm_comm.h, ipc_comm.h, emu_comm.h).
//
// On a device transport copy() and reduce() only queue work and return; the
// algorithm never reads staged bytes on the host. What the host must see (the
// size matrix of an all-to-all) goes through host_stage()/host_peer(), a host
// side channel that travels with the next exchange().
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/group.h"
#include "core/op_desc.h"
#include "core/reduce_op.h"

namespace rsdp {

class ShmComm;

class Staging {
 public:
  virtual ~Staging() = default;

  virtual const Group& group() const = 0;
  int rank() const { return group().rank; }
  int size() const { return group().size; }
  // Bytes of one staging half.
  virtual size_t half_bytes() const = 0;

  // Starts a collective: numbers it, arms its deadline.
  virtual void begin(OpDesc desc, std::chrono::milliseconds timeout) = 0;
  // The running op's descriptor (for error messages).
  virtual const OpDesc& desc() const = 0;
  virtual char* stage() = 0;
  // Publishes the step and waits for every peer; `staged` is how many bytes
  // of the half this rank filled for its peers (traffic counters).
  virtual void exchange(size_t staged = 0) = 0;
  virtual const char* peer(int p) const = 0;

  // Ring steps, read by one neighbour only. The default is a collective step
  // (correct everywhere); shared memory waits for the two neighbours only.
  virtual char* ring_stage() { return stage(); }
  virtual void ring_post(size_t staged, int /*reader*/) { ring_staged_ = staged; }
  virtual void ring_wait(int /*src*/) { exchange(ring_staged_); }

  // Host side channel of the next exchange (at least 64 bytes per rank).
  virtual char* host_stage() = 0;
  virtual const char* host_peer(int p) const = 0;
  virtual size_t host_half_bytes() const = 0;

  // `bytes` from src to dst, in this transport's order (empty copies and
  // dst == src do nothing). Either side may be a peer's half.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;

  // dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], left to
  // right, so every rank reducing the same inputs gets bit-identical
  // results; AVG divides by `divisor` at the end. A transport whose kernel
  // takes fewer sources (max_reduce_srcs()) reduces in rounds, dst carrying
  // the partial result:
  //   dst = op(srcs[0..k)); dst = op(dst, srcs[k..2k-1)); ...
  // (AVG sums in all rounds but the last). dst may alias any source; when it
  // aliases one that a later round reads, the rounds run in `scratch` (count
  // elements, aliasing no source) and the result is copied to dst. Without a
  // scratch that case is an internal error.
  void reduce(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt, RedOp op,
              int divisor, void* scratch);

  // The reduction of srcs (as reduce(), no scratch) into both `own`, this
  // rank's result, and `staged`, its staging half for the peers to read next:
  // the same bits in both. The transport picks the order (shared memory may
  // reduce into `own` and stream the result to the half).
  virtual void reduce_and_stage(void* own, void* staged, const void* const* srcs, int nsrc,
                                size_t count, DType dt, RedOp op, int divisor) {
    reduce(staged, srcs, nsrc, count, dt, op, divisor, nullptr);
    copy(own, staged, count * dtype_size(dt));
  }

  // Whether every rank has a core of its own (no more ranks than the
  // machine's CPUs): a waiter then finds its peer running, and an extra
  // exchange costs a hand-off, not a switch of the scheduler.
  virtual bool rank_per_core() const { return false; }

  // The host shared-memory comm behind this transport when its staging is
  // host shared memory with a pool (the one-copy paths of direct.cpp), else
  // null.
  virtual ShmComm* shared_memory() { return nullptr; }

 protected:
  // One kernel: nsrc <= max_reduce_srcs().
  virtual void reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                           RedOp op, int divisor) = 0;
  virtual int max_reduce_srcs() const { return INT_MAX; }

 private:
  size_t ring_staged_ = 0;
};

}  // namespace rsdp
