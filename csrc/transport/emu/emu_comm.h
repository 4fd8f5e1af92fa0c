// The emulated device: the staging interface (transport/staging.h) as CUDA
// IPC implements it, over host memory, so that CPU CI runs the single-node
// algorithms through the same ordering CUDA IPC relies on.
//
// What stands for what:
//   device memory    each rank's staging buffer (two halves) is a shared
//                    memory segment of its own, which every peer maps, as
//                    peers map a buffer exported with cudaIpcGetMemHandle;
//   the stream       an EmuStream: copy() and reduce() queue memcpy and the
//                    CPU kernels there and return at once;
//   IPC events       per half, a "recorded" counter the host bumps when it
//                    records and a "completed" value the stream writes when
//                    it gets there. A wait captures the peer's "recorded"
//                    count at the time of the call, as cudaStreamWaitEvent
//                    captures the most recent record: waiting on an event
//                    the peer has not recorded yet waits for nothing, here
//                    as on the GPU.
// exchange() is IpcComm::exchange(): record the half's event, run the host
// exchange of the node's ShmComm (descriptors, deadlines, every peer has
// queued the same step), then queue a wait on every peer's event of the step.
// The argument of [Note: why two halves are enough on the GPU] (ipc_comm.h)
// is what keeps the halves safe here; a change that breaks it shows as a
// wrong result under the stream's jitter.
//
// Reductions take at most `max_reduce_srcs` sources per pass (default 3,
// below the GPU kernel's 32), so that 4 ranks already run the rounds and
// scratch logic of Staging::reduce.
//
// It is a test fixture (RSDP_TEST_EMULATE_DEVICE), not a backend users choose.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/options.h"
#include "transport/emu/emu_stream.h"
#include "transport/shm/shm_comm.h"
#include "transport/shm/shm_segment.h"
#include "transport/staging.h"

namespace rsdp {

class EmuComm final : public Staging {
 public:
  // shm: the node's host comm over the same ranks. From opts: the staging
  // bytes (RSDP_CUDA_STAGING_BYTES: both halves, each rounded down to 256
  // bytes, at least 64 per rank), the jitter and the stall hook
  // (RSDP_TEST_EMULATE_DEVICE).
  EmuComm(ShmComm& shm, Bootstrap& store, const Options& opts);
  ~EmuComm() override;
  EmuComm(const EmuComm&) = delete;
  EmuComm& operator=(const EmuComm&) = delete;

  const Group& group() const override { return shm_.group(); }
  size_t half_bytes() const override { return half_; }
  void begin(OpDesc desc, std::chrono::milliseconds timeout) override;
  const OpDesc& desc() const override { return shm_.desc(); }
  char* stage() override;
  void exchange(size_t staged = 0) override;
  const char* peer(int p) const override;
  char* host_stage() override { return shm_.stage(); }
  const char* host_peer(int p) const override { return shm_.peer(p); }
  size_t host_half_bytes() const override { return shm_.half_bytes(); }
  void copy(void* dst, const void* src, size_t bytes) override;

  EmuStream& stream() { return *stream_; }
  void abort(const std::string& why) { shm_.abort(why); }

 protected:
  void reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                   RedOp op, int divisor) override;
  int max_reduce_srcs() const override { return max_srcs_; }

 private:
  // The events of one rank, at the start of its segment.
  struct Events {
    std::atomic<uint64_t> recorded[2];   // host: records made
    std::atomic<uint64_t> completed[2];  // stream: the last record it reached
  };
  static constexpr size_t kHalvesOffset = 4096;

  void map_peers(Bootstrap& store);
  Events& events(int r) const { return *reinterpret_cast<Events*>(segs_[r].data()); }
  char* halves(int r) const { return segs_[r].data() + kHalvesOffset; }

  ShmComm& shm_;
  size_t half_;
  int max_srcs_ = 3;
  bool stall_ = false;        // this rank's stream hangs at op stall_seq_
  uint64_t stall_seq_ = 0;
  std::vector<ShmSegment> segs_;  // [rank]: own segment and the peers' mappings
  uint32_t step_ = 0;             // exchanges done; stage() uses half step_ % 2
  std::unique_ptr<EmuStream> stream_;
};

}  // namespace rsdp
