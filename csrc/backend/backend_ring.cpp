// BackendRSDP::ring_shift: the ring-redistribution primitive as a queued op.
#include "backend/backend_rsdp.h"
#include "backend/ring_step.h"
#include "backend/op_queue.h"
#include "patterns/ring_order.h"
#include "algorithms/collectives.h"
#include "algorithms/group_comm.h"

namespace rsdp {

namespace {

// What ring_shift and ring_step refuse alike: the op's name says which.
void check_ring_args(const OpContext& c, const at::Tensor& send, const at::Tensor& recv,
                     int direction, const std::optional<at::Tensor>& add) {
  check_tensor(c, send, "tensor");
  check_same_dtype(c, send, {recv}, "output");
  RSDP_CHECK(recv.numel() == send.numel(), "rsdp rank ", c.rank, ": ", c.op, ": output ",
             describe(recv), " must have as many elements as the tensor ", describe(send));
  RSDP_CHECK(direction == 1 || direction == -1, "rsdp rank ", c.rank, ": ", c.op,
             ": direction must be +1 or -1, got ", direction);
  if (!add) return;
  check_same_dtype(c, send, {*add}, "local contribution");
  RSDP_CHECK(add->numel() == send.numel(), "rsdp rank ", c.rank, ": ", c.op,
             ": local contribution ", describe(*add), " must match the tensor ", describe(send));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> BackendRSDP::ring_shift(const at::Tensor& send,
                                                       const at::Tensor& recv, int direction,
                                                       const std::optional<at::Tensor>& add,
                                                       bool async_op,
                                                       const std::optional<at::Tensor>& residual) {
  return translate_errors([&] {
    const char* name = add ? "ring_shift_reduce" : "ring_shift";
    auto c = ctx(name);
    check_ring_args(c, send, recv, direction, add);
    at::Tensor local;
    if (add) local = add->contiguous();
    at::Tensor res;
    if (residual) {
      res = *residual;
      RSDP_CHECK(res.is_cpu() && res.is_contiguous() && res.scalar_type() == at::kFloat &&
                     res.numel() == send.numel(),
                 "rsdp rank ", global_rank_, ": ", name, ": residual ", describe(res),
                 " must be a contiguous float32 CPU tensor of the tensor's ", send.numel(),
                 " elements");
    }
    DType dt = to_dtype(c, send);
    at::Tensor in = dense(send), out = recv, dout = dense(recv);
    std::vector<int> order = ring_order_;
    auto t = timeout();
    return enqueue(c10d::OpType::UNKNOWN, add ? "rsdp:ring_shift_reduce" : "rsdp:ring_shift",
                   {recv}, [=](GroupComm& comm) {
                     coll::ring_shift(comm, order, in.data_ptr(), dout.data_ptr(), in.numel(), dt,
                                      direction, local.defined() ? local.data_ptr() : nullptr,
                                      t, res.numel() ? res.data_ptr<float>() : nullptr);
                     write_back(out, dout);
                   },
                   async_op, send.device());
  });
}

// [Note: ring steps on the caller's thread]
// An RSDP layer issues a ring shift, computes with the shard in hand, then
// waits: dozens of hops per layer. Through the worker queue each hop costs
// two thread hand-offs (wake the worker, wake the waiter), and with more
// ranks than cores every hand-off is a trip through the scheduler. A ring
// step instead runs on the caller's thread: ring_step() stages and posts the
// first segment (no wait: a ring step waits for its two neighbours only,
// shm_comm.h), the caller computes, RingStep::wait() waits for the
// predecessor's post and copies (or adds) it. While a step is open it holds
// the worker queue, so every op keeps its place in issue order; an op
// enqueued meanwhile (from any thread), a second ring step and shutdown
// finish the open step first, so nothing waits on it.

std::shared_ptr<RingStep> BackendRSDP::ring_step(const at::Tensor& send, const at::Tensor& recv,
                                                 int direction,
                                                 const std::optional<at::Tensor>& add) {
  return translate_errors([&]() -> std::shared_ptr<RingStep> {
    const char* name = add ? "ring_shift_reduce" : "ring_shift";
    auto c = ctx(name);
    check_ring_args(c, send, recv, direction, add);
    if (!send.is_cpu() || !recv.is_cpu() || !send.is_contiguous() || !recv.is_contiguous() ||
        (add && (!add->is_cpu() || !add->is_contiguous())))
      return nullptr;
    DType dt = to_dtype(c, send);
    std::lock_guard<std::mutex> g(ring_mu_);
    RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_, ": ", name,
               " called after the process group was shut down");
    // Across nodes, and over the emulated device, the queued ring_shift serves.
    if (comm_->multi_node() || comm_->opts.test.emulate_device()) return nullptr;
    if (open_step_) finish_step_locked(*open_step_);
    if (!queue_->try_reserve()) return nullptr;
    auto step = std::make_shared<RingStep>(
        c10::intrusive_ptr<BackendRSDP>::reclaim_copy(this), send, recv,
        add ? *add : at::Tensor());
    try {
      ring_shift_start(*comm_->shm, step->op, ring_order_, send.data_ptr(), recv.data_ptr(),
                       send.numel(), dt, direction, add ? add->data_ptr() : nullptr, timeout());
    } catch (...) {
      tracker_->failed(std::current_exception());
      comm_->spread();
      queue_->release();
      throw;
    }
    open_step_ = step;
    return step;
  });
}

void BackendRSDP::finish_ring_step(RingStep& step) {
  translate_errors([&] {
    std::lock_guard<std::mutex> g(ring_mu_);
    finish_step_locked(step);
  });
}

void BackendRSDP::finish_step_locked(RingStep& step) {
  if (!step.done) {
    step.done = true;
    try {
      ring_shift_finish(step.op);
    } catch (...) {
      step.error = std::current_exception();
      tracker_->failed(step.error);
      comm_->spread();
    }
    step.release_tensors();
    if (open_step_.get() == &step) open_step_.reset();
    queue_->release();
  }
  if (step.error) std::rethrow_exception(step.error);
}

void BackendRSDP::finish_open_step() {
  std::lock_guard<std::mutex> g(ring_mu_);
  if (!open_step_) return;
  auto step = open_step_;
  try {
    finish_step_locked(*step);
  } catch (...) {
    // Its own wait() raises it; the op being issued meets the broken group.
  }
}

RingStep::RingStep(c10::intrusive_ptr<BackendRSDP> backend, at::Tensor send, at::Tensor recv,
                   at::Tensor add)
    : backend_(std::move(backend)), send_(std::move(send)), recv_(std::move(recv)),
      add_(std::move(add)) {}

void RingStep::wait() { backend_->finish_ring_step(*this); }

void RingStep::release_tensors() {
  send_ = at::Tensor();
  add_ = at::Tensor();
}

std::vector<int> BackendRSDP::ring_neighbours(int direction) const {
  auto nb = rsdp::ring_neighbours(ring_order_, getRank(), direction);
  return {nb.send_to, nb.recv_from};
}

}  // namespace rsdp
