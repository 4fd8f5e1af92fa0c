// BackendRSDP's CUDA ops: the stream discipline around the same queued
// bodies the CPU ops use.
//
// On the calling thread an op records an event on the caller's current
// stream and takes the next completion-flag value. On the worker, with the
// group's stream current, the stream first waits for that event (so the op
// sees everything queued before it), the body queues the device algorithm
// (algorithms/cuda) and any copies, and the stream then raises the flag and
// records the done event. The watchdog keeps the body (and so its tensors)
// alive until the done event completes.
#include "cuda/device_event.h"
#include <c10/cuda/CUDAGuard.h>

#include "algorithms/cuda/cuda_collectives.h"
#include "algorithms/group_comm.h"
#include "backend/backend_rsdp.h"
#include "backend/cuda/cuda_state.h"
#include "backend/cuda/work_cuda.h"
#include "backend/op_queue.h"
#include "backend/store_bootstrap.h"

namespace rsdp {

CudaState& BackendRSDP::cuda_state(c10::Device device) {
  if (!cuda_) {
    GroupComm* comm = comm_.get();
    cuda_ = std::make_shared<CudaState>(device, [comm](const std::string& why) {
      comm->abort(why);
    });
  }
  RSDP_CHECK(cuda_->device == device, "rsdp rank ", global_rank_, ": an op on ", device.str(),
             " but this process group runs its CUDA ops on ", cuda_->device.str(),
             "; use one device per process and group (torch.cuda.set_device)");
  return *cuda_;
}

void BackendRSDP::abandon_cuda_ops() {
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (cuda_) cuda_->flag->abandon();  // a stream may be stuck on it (StreamFlag::abandon)
  if (cuda_)
    cuda_->watchdog.abandon("rsdp rank " + std::to_string(global_rank_) +
                            ": the process group was aborted before this CUDA op finished");
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::enqueue_cuda(c10d::OpType type, const char* title,
                                                         std::vector<at::Tensor> outputs,
                                                         Body body, bool async_op,
                                                         c10::Device device) {
  // One lock from numbering to queueing: flag values must reach the stream
  // in the order they were handed out, or a later value would release the
  // waiters of an earlier op.
  std::lock_guard<std::mutex> lock(cuda_mu_);
  CudaState& state = cuda_state(device);
  c10::cuda::CUDAGuard guard(device);
  auto ready = std::make_shared<DeviceEvent>();
  ready->record(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  const uint32_t value = ++state.issued;
  auto work = c10::make_intrusive<WorkRSDPCuda>(getRank(), type, ++seq_, std::move(outputs),
                                                title, device, state.flag, value);
  GroupComm* comm = comm_.get();
  Bootstrap* boot = boot_.get();
  CudaState* st = &state;
  auto keep = std::make_shared<Body>(std::move(body));
  const auto deadline = CudaWatchdog::Clock::now() + timeout();
  const std::string what = "rsdp rank " + std::to_string(global_rank_) + ": " + title +
                           " (collective #" + std::to_string(work->getSequencenumber()) + ")";
  OpQueue::Task task = [=](bool run) {
    c10::cuda::CUDAGuard g(device);
    c10::cuda::CUDAStreamGuard sg(st->stream);
    std::exception_ptr err;
    if (!run) {
      err = std::make_exception_ptr(Error(
          ErrorKind::kPeer, what + " was cancelled: the process group was shut down"));
    } else {
      try {
        if (!comm->device) comm->device = make_cuda_collectives(*comm, *boot, device.index());
        comm->device->set_stream(st->stream.stream());
        ready->block(st->stream.stream());
        comm->device_op = true;
        (*keep)(*comm);
      } catch (...) {
        err = std::current_exception();
        comm->spread();  // a broken group tells its other nodes
      }
      comm->device_op = false;
    }
    // The flag is raised even after an error: no stream may wait forever.
    auto done = std::make_shared<DeviceEvent>();
    try {
      if (st->flag->available()) st->flag->signal(st->stream.stream(), value);
      done->record(st->stream.stream());
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    work->enqueued(err, done, st->stream);
    st->watchdog.add({work, done, keep, deadline, what});
  };
  if (async_op || !queue_->run_inline_if_idle(task)) queue_->push(std::move(task));
  return work;
}

}  // namespace rsdp
