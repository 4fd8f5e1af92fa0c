// BackendRSDP: the c10d::Backend registered as "rsdp".
//
// This is glue only: it checks arguments on the calling thread, converts
// tensors to raw buffers, and queues the algorithm (csrc/algorithms) on the
// group's worker thread; send/recv go to the group's P2P engine. Every op
// returns a WorkRSDP at once.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/tensor_args.h"
#include "backend/torch_version.h"
#include "backend/work_rsdp.h"
#include "backend/work_tracker.h"
#include "core/compression.h"
#include "core/error.h"
#include "core/options.h"


namespace rsdp {

struct GroupComm;
class Adaptation;
struct Topology;
struct Traffic;
class OpQueue;
class P2PEngine;
class RingStep;
class StoreBootstrap;
struct CudaState;  // backend/cuda/cuda_state.h, in CUDA builds

class BackendRSDP : public c10d::Backend {
 public:
  BackendRSDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout, std::vector<int> global_ranks,
              std::string group_name);
  ~BackendRSDP() override;

  const std::string getBackendName() const override { return "rsdp"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Communication memory (backend_alloc.cpp): CPU tensors in this rank's
  // shared pool, which collectives read in one copy. FSDP2 allocates its
  // all-gather and reduce-scatter buffers here once
  // set_allocate_memory_from_process_group_for_comm(True) is called.
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;
  // Bytes of the pool handed out and not yet freed (0 without a pool).
  size_t pool_bytes_in_use() const;
  // Store requests this rank made to set the group up (core/bootstrap.h):
  // O(1) outside group rank 0, whatever the group's size.
  int64_t setup_store_requests() const { return setup_store_requests_; }
  // UCX endpoints this rank holds now, collective and point-to-point (made
  // when a peer is first reached; 0 on one node).
  int64_t ucx_endpoints() const;

  // As gloo's: the count starts at 0 when the group is made, and torch's call
  // at group creation has nothing to reset.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  // shutdown: queued collectives still run (as gloo's destructor does);
  // abort: waits fail at once and queued collectives are cancelled.
  void abort() override;
  void shutdown() override;

  const rsdp::Options& options() const { return opts_; }

  // Compressed inter-node traffic (backend_compression.cpp): "none", "int8"
  // or "int4" (reductions only) per collective, `block` elements per scale.
  // Applies to ops issued after the call (it is queued like one); every rank
  // of the group must make the same call at the same point, or the next
  // compressed op raises a mismatch on all of them.
  // ring_shift / ring_shift_reduce: the cross-node hops of ring_shift
  // (RSDP's weights: int8 only) and of ring_shift_reduce (its gradients).
  void set_compression(const std::string& all_gather, const std::string& reduce_scatter,
                       const std::string& all_reduce, int64_t block,
                       const std::string& ring_shift, const std::string& ring_shift_reduce);
  // {"all_gather", "reduce_scatter", "all_reduce", "ring_shift",
  // "ring_shift_reduce", "block"} as last set.
  std::unordered_map<std::string, std::string> compression() const;
  // reduce_scatter_tensor with error feedback: `residual` (float32, the
  // input's size, owned by the caller and kept between steps) is added to
  // what this rank quantises and receives what that loses. Without
  // compression on the op's path it is a plain reduce-scatter and `residual`
  // is left as it is. average: AVG, else SUM.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_feedback(const at::Tensor& output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& residual,
                                                         bool average, bool async_op);

  // --- The rest of c10d::Backend's contract ---------------------------------
  // Recovery (backend_shrink.cpp): a new backend over the ranks not excluded,
  // built from scratch (fresh shared memory, endpoints, topology); this one
  // is left to be destroyed. SHRINK_ABORT (1) first aborts this one's ops.
  bool supportsShrinking() const RSDP_OVERRIDE_SINCE_2_10 { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts_override = nullptr)
      RSDP_OVERRIDE_SINCE_2_10;
  // Works across the group (backend_tracking.cpp, over work_tracker.h).
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10d::ErrorType getError() override { return tracker_->error(); }
  void waitForPendingWorks() override;
  void registerOnCompletionHook(
      std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  // Durations are always measured (work_tracker.h): nothing to turn on.
  void enableCollectivesTiming() override {}
  // Every op issued between the two becomes part of the one Work
  // endCoalescing returns (batch_isend_irecv, _coalescing_manager).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // The communication memory pool (backend_alloc.cpp).
  std::unordered_map<std::string, uint64_t> getMemoryStats() RSDP_OVERRIDE_SINCE_2_12;
  // gloo's semantics, through the store (backend_monitored_barrier.cpp):
  // rank 0 names the ranks that did not arrive within the timeout, the
  // others fail with its verdict instead of waiting for their own timeout.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  // One queued collective: runs on the worker with the group's comm.
  using Body = std::function<void(GroupComm&)>;

  // Ring redistribution (backend_ring.cpp): recv <- the ring neighbour's send
  // (+ add). direction +1 sends to the successor. residual: error feedback
  // of a compressed cross-node hop (algorithms/collectives.h), float32 of
  // send's size, owned by the caller; untouched where this rank's send stays
  // exact.
  c10::intrusive_ptr<c10d::Work> ring_shift(const at::Tensor& send, const at::Tensor& recv,
                                            int direction, const std::optional<at::Tensor>& add,
                                            bool async_op,
                                            const std::optional<at::Tensor>& residual);
  // {rank this one sends to, rank it receives from} for a direction.
  // A ring shift run on the calling thread in two halves ([Note: ring steps on
  // the caller's thread], backend_ring.cpp): staged and posted now, finished
  // by RingStep::wait(). Null where it cannot run so (not a dense CPU tensor
  // of a one-node group, or ops queued on the worker): use ring_shift then.
  std::shared_ptr<RingStep> ring_step(const at::Tensor& send, const at::Tensor& recv,
                                      int direction, const std::optional<at::Tensor>& add);
  void finish_ring_step(RingStep& step);
  std::vector<int> ring_neighbours(int direction) const;
  const std::vector<int>& ring_order() const { return ring_order_; }
  // Where the group's ranks live (core/topology.h), and its traffic counters.
  const Topology& topology() const;
  // How this node's shared memory adapts to where its ranks run: the latest
  // hand-off probe's findings and the stores chosen (transport/shm/adaptation.h).
  const Adaptation& adaptation() const;
  // The largest CPU all-reduce that runs one-shot: on one node the group's
  // bound (algorithms/select.h), across nodes the leaders' path's.
  size_t allreduce_oneshot_bytes() const;
  Traffic& traffic() const;
  // Which transports serve the group's CUDA ops ("" before the first one).
  std::string cuda_paths() const;

 private:
  // Validate on the calling thread and return the op, for the plain and the
  // coalesced variants alike.
  Body prepare_allgather(std::vector<std::vector<at::Tensor>>& outputs,
                         std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts);
  Body prepare_allgather_base(at::Tensor& output, at::Tensor& input,
                              const c10d::AllgatherOptions& opts);
  // all_reduce of a sparse COO tensor (backend_sparse.cpp).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts);
  Body prepare_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                   const c10d::ReduceScatterOptions& opts);
  // Queues body on the worker; the Work completes with `outputs`.
  // A blocking op (async_op false) runs on the calling thread when the
  // worker is idle. `device` is where the op's tensors live; CUDA ops go
  // through enqueue_cuda().
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         std::vector<at::Tensor> outputs, Body body,
                                         bool async_op = true,
                                         c10::Device device = c10::Device(c10::kCPU));
  // backend/cuda/backend_cuda.cpp: stream-ordered CUDA ops (CUDA builds only).
  c10::intrusive_ptr<c10d::Work> enqueue_cuda(c10d::OpType type, const char* title,
                                              std::vector<at::Tensor> outputs, Body body,
                                              bool async_op, c10::Device device);
  CudaState& cuda_state(c10::Device device);
  void abandon_cuda_ops();
  c10::intrusive_ptr<c10d::Work> enqueue_p2p(c10d::OpType type, const char* title,
                                             at::Tensor tensor, int peer, int tag);
  OpContext ctx(const char* op) const { return OpContext{global_rank_, op}; }
  std::chrono::milliseconds op_timeout(std::chrono::milliseconds t) const;
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load());
  }
  // A Work about to be issued: tracked before it can complete.
  c10::intrusive_ptr<WorkRSDP> issue(c10::intrusive_ptr<WorkRSDP> work);

  rsdp::Options opts_;
  int global_rank_;
  std::atomic<int64_t> timeout_ms_;  // setTimeout may change it while ops run
  c10::intrusive_ptr<c10d::Store> store_;  // shrink and monitoredBarrier meet on it
  std::string group_name_;
  uint64_t monitored_barriers_ = 0;  // numbers each call (all ranks count alike)
  std::shared_ptr<WorkTracker> tracker_ = std::make_shared<WorkTracker>();
  mutable std::mutex compression_mu_;
  Compression compression_;  // as last set from the caller's side
  std::vector<int> ring_order_;  // group ranks, node-adjacent
  std::unique_ptr<StoreBootstrap> boot_;  // kept: device comms rendezvous lazily
  int64_t setup_store_requests_ = 0;
  std::unique_ptr<GroupComm> comm_;
  // The CUDA side (stream, completion flag, watchdog), made by the first CUDA
  // op. shared_ptr: the type is complete only in CUDA builds.
  std::mutex cuda_mu_;
  std::shared_ptr<CudaState> cuda_;
  std::shared_ptr<OpQueue> queue_;  // shared: Works wait on it (help_from)
  std::mutex p2p_mu_;
  std::unique_ptr<P2PEngine> p2p_;  // started by the first send/recv
  std::atomic<uint64_t> seq_{0};
  // The ring step open on this group (at most one: a new one, any queued op
  // and shutdown finish it first); guards the RingSteps' state.
  std::mutex ring_mu_;
  std::shared_ptr<RingStep> open_step_;
  void finish_step_locked(RingStep& step);
  void finish_open_step();
  void stop(bool drain);
  std::atomic<bool> shut_down_{false};
};

// Converts rsdp::Error thrown on the calling thread into c10 exceptions.
template <typename F>
auto translate_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    std::rethrow_exception(to_torch_exception(std::current_exception()));
  }
}

}  // namespace rsdp
