// The CUDA-IPC communicator of one node's ranks: the staging interface
// (transport/staging.h) over device memory, so the single-node algorithms of
// algorithms/algorithms.h run on it unchanged.
//
// Every rank owns a staging buffer in device memory (two halves, used
// alternately), exported with cudaIpcGetMemHandle and mapped by every peer
// of the node, plus one interprocess event per half. Ranks may sit on
// different GPUs (peer access) or share one GPU.
//
// Steps work as in ShmComm, but the GPU runs behind the host: copy() and
// reduce() queue copies and kernels on the op's stream and return;
//   stage()    this rank's device half for the next step;
//   exchange() records the half's "ready" event on the stream, runs the host
//              exchange of the node's ShmComm (which checks the op descriptor
//              and waits until every peer has *queued* the same step), then
//              makes the stream wait for every peer's ready event;
//   peer(p)    p's half of the last exchanged step, readable by kernels queued
//              on the stream after exchange().
//
// [Note: why two halves are enough on the GPU]
// Rank r writes half s % 2 again at step s + 2. On r's stream that write comes
// after r's wait, at step s + 1, for every peer p's ready event of step s + 1,
// which p recorded on its stream after its own reads of step s. So the GPU
// never overwrites a half a peer still reads. The event of step s is recorded
// again only at step s + 2, after the host exchange of step s + 1, which no
// rank enters before it has queued its waits of step s: every wait sees the
// record it is meant to see.
//
// The argument needs every step's reads and writes on one stream. When an op
// runs on another stream than the op before it, begin() makes the new stream
// wait for everything queued on the old one, which keeps the chain intact.
//
// The host never waits for the GPU here: a call returns once its work is
// queued. Deadlines and dead peers surface through the ShmComm exchange.
//
// Ranks are told apart by PCI bus id, not by device ordinal: ordinals are
// per process (CUDA_VISIBLE_DEVICES), bus ids are not.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/group.h"
#include "core/op_desc.h"
#include "transport/shm/shm_comm.h"
#include "transport/staging.h"

namespace rsdp {

class IpcComm final : public Staging {
 public:
  // shm: the node's host comm over the same ranks (same numbering).
  // device: this rank's CUDA device. staging_bytes: both halves together
  // (each half is rounded down to a multiple of 256 bytes and must hold at
  // least 64 bytes per rank). `store` must outlive the comm: the destructor
  // uses it to learn when the peers have unmapped this rank's buffer.
  IpcComm(ShmComm& shm, Bootstrap& store, int device, size_t staging_bytes);
  ~IpcComm();
  IpcComm(const IpcComm&) = delete;
  IpcComm& operator=(const IpcComm&) = delete;

  const Group& group() const override { return shm_.group(); }
  // The running op's descriptor (for error messages).
  const OpDesc& desc() const override { return shm_.desc(); }
  int device() const { return device_; }
  size_t half_bytes() const override { return half_; }
  // Ranks of the node on this rank's GPU (they share its memory bandwidth).
  int ranks_on_my_gpu() const;

  // The stream the next ops queue on. A new stream is ordered after
  // everything queued on the previous one (the halves' reuse argument needs
  // one chain of work).
  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const { return stream_; }
  // Starts a collective on the stream: numbers it, arms its deadline.
  void begin(OpDesc desc, std::chrono::milliseconds timeout) override;
  char* stage() override;                  // device pointer
  void exchange(size_t staged = 0) override;
  const char* peer(int p) const override;  // device pointer, mapped for peers

  // The host side channel is the host half of the node's ShmComm.
  char* host_stage() override { return shm_.stage(); }
  const char* host_peer(int p) const override { return shm_.peer(p); }
  size_t host_half_bytes() const override { return shm_.half_bytes(); }
  // Device to device on the stream (either side may be a peer's half).
  void copy(void* dst, const void* src, size_t bytes) override;

  void abort(const std::string& why) { shm_.abort(why); }

 protected:
  void reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                   RedOp op, int divisor) override;
  int max_reduce_srcs() const override;

 private:
  void setup();
  // Frees what setup() made (also after a failed setup); never throws.
  void release() noexcept;

  ShmComm& shm_;
  Bootstrap& store_;  // outlives the comm (the backend keeps it)
  int device_;
  size_t half_;
  char* mine_ = nullptr;             // cudaMalloc'd, 2 * half_
  std::vector<char*> peers_;         // mapped peer buffers (peers_[rank()] == mine_)
  std::vector<cudaEvent_t> ready_;   // [peer * 2 + half]; mine created, peers opened
  std::vector<int> devices_;         // every rank's device ordinal (in its own process)
  std::vector<std::string> bus_ids_; // every rank's GPU, by PCI bus id
  cudaEvent_t switch_ = nullptr;     // orders a new stream after the previous one
  cudaStream_t stream_ = nullptr;
  bool has_stream_ = false;          // stream_ is set (nullptr is the legacy stream)
  bool published_ = false;           // peers may have mapped mine_
  uint32_t step_ = 0;                // exchanges done; stage() uses half step_ % 2
};

}  // namespace rsdp
