// BackendRSDP: construction, the worker funnel, send/recv, shutdown.
// The collective overrides live in backend_collectives.cpp.
#include "backend/backend_rsdp.h"

#include "algorithms/collectives.h"
#include "algorithms/emulated_collectives.h"
#include "algorithms/group_comm.h"
#include "algorithms/select.h"
#include "backend/op_queue.h"
#include "backend/ring_step.h"
#include "backend/store_bootstrap.h"
#include "core/group.h"
#include "transport/shm/p2p_engine.h"

namespace rsdp {

BackendRSDP::BackendRSDP(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::vector<int> global_ranks,
                         std::string group_name)
    : c10d::Backend(rank, size),
      timeout_ms_(timeout.count()),
      store_(store),
      group_name_(group_name) {
  translate_errors([&] {
    opts_ = rsdp::Options::from_env();
    check_forced_algorithms(opts_);
    global_rank_ = global_ranks.empty() ? rank : global_ranks.at(rank);
    boot_ = std::make_unique<StoreBootstrap>(store);
    Group g = join_group(*boot_, rank, size, std::move(global_ranks), std::move(group_name),
                         timeout, opts_);
    comm_ = std::make_unique<GroupComm>(g, *boot_, opts_);
    setup_store_requests_ = boot_->requests();
    ring_order_ = comm_->topo.node_major_order();
    queue_ = std::make_shared<OpQueue>();
  });
}

BackendRSDP::~BackendRSDP() { shutdown(); }

const Topology& BackendRSDP::topology() const { return comm_->topo; }

int64_t BackendRSDP::ucx_endpoints() const {
  return comm_ && comm_->net ? comm_->net->endpoints() : 0;
}

const Adaptation& BackendRSDP::adaptation() const { return comm_->shm->adaptation(); }

size_t BackendRSDP::allreduce_oneshot_bytes() const {
  if (comm_->multi_node()) return kOneshotBytes;
  return rsdp::allreduce_oneshot_bytes(false);
}

Traffic& BackendRSDP::traffic() const { return comm_->traffic; }

std::string BackendRSDP::cuda_paths() const {
  // Read on the caller's thread while the worker may be making it: only
  // meaningful once an op on CUDA tensors has completed.
  return comm_ && comm_->device ? comm_->device->describe() : std::string();
}

void BackendRSDP::shutdown() { stop(true); }

void BackendRSDP::abort() {
  if (!shut_down_.load() && comm_) comm_->abort("rsdp rank " + std::to_string(global_rank_) +
                                         ": the process group was aborted");
  stop(false);
}

void BackendRSDP::stop(bool drain) {
  if (shut_down_.exchange(true)) return;
  // Order matters: stop producers of completions before the comm goes away.
  // An open ring step holds the queue: finish it (an abort makes it fail).
  finish_open_step();
  // The queue object stays (stopped): a racing enqueue gets its task cancelled.
  if (queue_) queue_->stop(drain);
  // An abort broke the group: the other nodes hear of it before the
  // endpoints close (the worker is stopped, so this thread may drive them).
  if (!drain && comm_) comm_->spread();
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    p2p_.reset();
  }
  // The CUDA watchdog may still hold Works whose GPU part runs; it finishes
  // them (or, when aborting, fails them) before the comms they use go away.
#ifdef RSDP_WITH_CUDA
  if (!drain) abandon_cuda_ops();
#endif
  cuda_.reset();
  comm_.reset();
  tracker_->clear();
}

c10::intrusive_ptr<WorkRSDP> BackendRSDP::issue(c10::intrusive_ptr<WorkRSDP> work) {
  work->track(tracker_);
  tracker_->issued(work);
  return work;
}

std::chrono::milliseconds BackendRSDP::op_timeout(std::chrono::milliseconds t) const {
  return t == c10d::kUnsetTimeout ? timeout() : t;
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::enqueue(c10d::OpType type, const char* title,
                                                    std::vector<at::Tensor> outputs, Body body,
                                                    bool async_op, c10::Device device) {
  RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_, ": ", title,
             " called after the process group was shut down");
  // An open ring step holds the queue and keeps its place in issue order.
  finish_open_step();
#ifdef RSDP_WITH_CUDA
  if (device.is_cuda()) {
    // The group's device collectives are the emulated ones then (CPU memory).
    RSDP_CHECK(!comm_->opts.test.emulate_device(), "rsdp rank ", global_rank_, ": ", title,
               " on ", device.str(), ": RSDP_TEST_EMULATE_DEVICE (a test fixture) makes the group "
               "serve CPU tensors through the emulated device; unset it to use CUDA tensors");
    return enqueue_cuda(type, title, std::move(outputs), std::move(body), async_op, device);
  }
#endif
  auto work =
      issue(c10::make_intrusive<WorkRSDP>(getRank(), type, ++seq_, std::move(outputs), title));
  // A blocking op runs inline unless the queue is busy; queued, its caller
  // waits (torch calls wait()) and may run it, as for an async op.
  work->help_from(queue_, comm_->opts.spin_us);
  GroupComm* comm = comm_.get();
  Bootstrap* boot = boot_.get();
  const std::string name = title;
  // The test fixture RSDP_TEST_EMULATE_DEVICE: CPU tensors of a single-node group
  // take the device path, over the emulated device.
  const bool emulated = comm->opts.test.emulate_device() && !comm->multi_node();
  OpQueue::Task task = [work, comm, boot, emulated, name, body = std::move(body)](bool run) mutable {
    std::exception_ptr err;
    if (!run) {
      err = std::make_exception_ptr(Error(
          ErrorKind::kPeer, "rsdp: " + name + " was cancelled: the process group was shut down"));
    } else {
      work->mark_running();
      try {
        if (emulated) {
          if (!comm->device) comm->device = make_emulated_collectives(*comm, *boot);
          comm->device_op = true;
        }
        body(*comm);
      } catch (...) {
        err = std::current_exception();
        comm->spread();  // a broken group tells its other nodes
      }
      comm->device_op = false;
    }
    // Drop the tensors the body captured before waking the waiter, so a
    // buffer freed right after wait() is really freed.
    body = nullptr;
    work->complete(err);
  };
  if (async_op || !queue_->run_inline_if_idle(task)) queue_->push(std::move(task));
  return work;
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::enqueue_p2p(c10d::OpType type, const char* title,
                                                        at::Tensor tensor, int peer, int tag) {
  const bool is_send = type == c10d::OpType::SEND;
  // CUDA tensors travel through host memory: a send copies out on the
  // caller's stream (and waits for it), a recv copies in before its Work
  // completes, so wait() returns with the data on the device.
  at::Tensor buf = !tensor.is_cuda() ? dense(tensor)
                   : is_send        ? tensor.to(at::kCPU).contiguous()
                                    : at::empty(tensor.sizes(), tensor.options()
                                                                    .device(at::kCPU)
                                                                    .pinned_memory(true));
  auto work = c10::make_intrusive<WorkRSDP>(getRank(), type, seq_.load(),
                                            std::vector<at::Tensor>{tensor}, title);
  auto done = [work, tensor, buf, is_send](std::exception_ptr err, int src) {
    if (!err && !is_send) {
      try {
        write_back(tensor, buf);
      } catch (...) {
        err = std::current_exception();
      }
    }
    work->complete(err, src);
  };
  // Under the lock, so shutdown cannot free the engine in between.
  std::lock_guard<std::mutex> g(p2p_mu_);
  RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_, ": ", title,
             " called after the process group was shut down");
  issue(work);
  try {
    void* data = buf.numel() ? buf.data_ptr() : nullptr;
    if (comm_->multi_node()) {
      // Across nodes every pair talks through the network transport, which
      // also matches receives from any source.
      if (is_send)
        comm_->net->p2p_send(data, buf.nbytes(), peer, tag, timeout(), std::move(done));
      else
        comm_->net->p2p_recv(data, buf.nbytes(), peer, tag, timeout(), std::move(done));
      return work;
    }
    if (!p2p_) p2p_ = std::make_unique<P2PEngine>(*comm_->shm);
    if (is_send)
      p2p_->send(data, buf.nbytes(), peer, tag, timeout(), std::move(done));
    else
      p2p_->recv(data, buf.nbytes(), peer, tag, timeout(), std::move(done));
    return work;
  } catch (...) {
    work->complete(std::current_exception());  // not left pending
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::send(std::vector<at::Tensor>& tensors, int dst,
                                                 int tag) {
  return translate_errors([&] {
    auto c = ctx("send");
    check_one(c, tensors, "tensor");
    check_rank(c, dst, getSize(), "destination rank");
    RSDP_CHECK(dst != getRank(), "rsdp rank ", global_rank_, ": send: a rank cannot send to itself");
    return enqueue_p2p(c10d::OpType::SEND, "rsdp:send", tensors[0], dst, tag);
  });
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::recv(std::vector<at::Tensor>& tensors, int src,
                                                 int tag) {
  return translate_errors([&] {
    auto c = ctx("recv");
    check_one(c, tensors, "tensor");
    check_rank(c, src, getSize(), "source rank");
    RSDP_CHECK(src != getRank(), "rsdp rank ", global_rank_,
               ": recv: a rank cannot receive from itself");
    return enqueue_p2p(c10d::OpType::RECV, "rsdp:recv", tensors[0], src, tag);
  });
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  return translate_errors([&] {
    check_one(ctx("recv"), tensors, "tensor");
    return enqueue_p2p(c10d::OpType::RECVANYSOURCE, "rsdp:recv_anysource", tensors[0], -1, tag);
  });
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::barrier(const c10d::BarrierOptions& opts) {
  return translate_errors([&] {
    auto t = op_timeout(opts.timeout);
    // The worker runs ops in order, so this completes after all earlier ones.
    return enqueue(c10d::OpType::BARRIER, "rsdp:barrier", {},
                   [t](GroupComm& c) { coll::barrier(c, t); }, opts.asyncOp);
  });
}

}  // namespace rsdp
