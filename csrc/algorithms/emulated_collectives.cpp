#include "algorithms/emulated_collectives.h"

#include "algorithms/collectives.h"
#include "core/error.h"
#include "primitives/ring_shift.h"
#include "transport/emu/emu_comm.h"

namespace rsdp {
namespace {

using Millis = std::chrono::milliseconds;

class EmulatedCollectives final : public DeviceCollectives {
 public:
  EmulatedCollectives(GroupComm& g, Bootstrap& store)
      : g_(g),
        emu_(*g.shm, store, g.opts) {
    RSDP_CHECK(!g.multi_node(), g.group.me(),
               ": the emulated device serves groups on one node only");
  }

  int device() const override { return 0; }
  void set_stream(void*) override {}
  std::string describe() const override {
    return detail::cat("intra-node: emulated device (", g_.size(),
                       " ranks; the CUDA-IPC algorithms on host memory, a stream thread per "
                       "rank, jitter up to ", g_.opts.test.emulate_device_jitter_us, " us)");
  }

  void broadcast(void* buf, size_t count, DType dt, int root, Millis timeout) override {
    CollArgs a = args(OpKind::kBroadcast, timeout, dt);
    a.count = count, a.root = root, a.buf = buf;
    run(a);
  }
  void allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout) override {
    CollArgs a = args(OpKind::kAllreduce, timeout, dt);
    a.count = count, a.redop = op, a.buf = buf;
    run(a);
  }
  void reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) override {
    CollArgs a = args(OpKind::kReduce, timeout, dt);
    a.count = count, a.redop = op, a.root = root, a.buf = buf;
    run(a);
  }
  void allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                 Millis timeout) override {
    CollArgs a = args(OpKind::kAllgather, timeout, dt);
    a.counts = counts, a.in = in, a.outs = outs;
    run(a);
  }
  void gather(const void* in, void* const* outs, size_t count, DType dt, int root,
              Millis timeout) override {
    CollArgs a = args(OpKind::kGather, timeout, dt);
    a.count = count, a.root = root, a.in = in, a.outs = outs;
    run(a);
  }
  void scatter(const void* const* ins, void* out, size_t count, DType dt, int root,
               Millis timeout) override {
    CollArgs a = args(OpKind::kScatter, timeout, dt);
    a.count = count, a.root = root, a.ins = ins, a.out = out;
    run(a);
  }
  void reduce_scatter(const void* const* ins, void* out, const uint64_t* counts, DType dt,
                      RedOp op, Millis timeout) override {
    CollArgs a = args(OpKind::kReduceScatter, timeout, dt);
    a.counts = counts, a.redop = op, a.ins = ins, a.out = out;
    run(a);
  }
  void alltoall(const void* const* sends, const uint64_t* send_bytes, void* const* recvs,
                const uint64_t* recv_bytes, DType dt, Millis timeout) override {
    CollArgs a = args(OpKind::kAlltoall, timeout, dt);
    a.sends = sends, a.send_bytes = send_bytes, a.recvs = recvs, a.recv_bytes = recv_bytes;
    run(a);
  }
  void ring_shift(const std::vector<int>& order, const void* send, void* recv, size_t count,
                  DType dt, int direction, const void* add, Millis timeout) override {
    const auto deadline = Clock::now() + timeout;
    rsdp::ring_shift(emu_, order, send, recv, count, dt, direction, add, timeout);
    finish(deadline, timeout);
  }

  void abort(const std::string& why) override { emu_.abort(why); }

 private:
  using Clock = EmuStream::Clock;
  CollArgs args(OpKind op, Millis timeout, DType dt) const {
    return CollArgs{.g = g_, .op = op, .timeout = timeout, .dt = dt};
  }
  void run(const CollArgs& a) {
    const auto deadline = Clock::now() + a.timeout;
    coll::run_on_device(emu_, a);
    finish(deadline, a.timeout);
  }
  // The host waits for the stream (see the header). A stream still busy at
  // the op's deadline is a timeout that breaks the group, as the CUDA
  // watchdog makes it: every member then fails instead of waiting.
  void finish(Clock::time_point deadline, Millis timeout) {
    if (emu_.stream().drain(deadline)) return;
    const std::string why =
        detail::cat(g_.group.me(), ": ", timed_out_waiting(timeout.count()),
                    " for the emulated device's stream to finish ", emu_.desc().describe(),
                    " (it is ", emu_.stream().current().empty() ? "running" : "",
                    emu_.stream().current(), ")");
    emu_.abort(why);
    RSDP_FAIL(ErrorKind::kTimeout, why);
  }

  GroupComm& g_;
  EmuComm emu_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_emulated_collectives(GroupComm& g, Bootstrap& store) {
  return std::make_unique<EmulatedCollectives>(g, store);
}

}  // namespace rsdp
