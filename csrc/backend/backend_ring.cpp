// BackendRSDP::ring_shift: the ring-redistribution primitive as a queued op.
#include "backend/backend_rsdp.h"
#include "patterns/ring_order.h"
#include "algorithms/collectives.h"

namespace rsdp {

c10::intrusive_ptr<c10d::Work> BackendRSDP::ring_shift(const at::Tensor& send,
                                                       const at::Tensor& recv, int direction,
                                                       const std::optional<at::Tensor>& add,
                                                       bool async_op,
                                                       const std::optional<at::Tensor>& residual) {
  return translate_errors([&] {
    const char* name = add ? "ring_shift_reduce" : "ring_shift";
    auto c = ctx(name);
    check_tensor(c, send, "tensor");
    check_same_dtype(c, send, {recv}, "output");
    RSDP_CHECK(recv.numel() == send.numel(), "rsdp rank ", global_rank_, ": ", name, ": output ",
               describe(recv), " must have as many elements as the tensor ", describe(send));
    RSDP_CHECK(direction == 1 || direction == -1, "rsdp rank ", global_rank_, ": ", name,
               ": direction must be +1 or -1, got ", direction);
    at::Tensor local;
    if (add) {
      check_same_dtype(c, send, {*add}, "local contribution");
      RSDP_CHECK(add->numel() == send.numel(), "rsdp rank ", global_rank_, ": ", name,
                 ": local contribution ", describe(*add), " must match the tensor ",
                 describe(send));
      local = add->contiguous();
    }
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

std::vector<int> BackendRSDP::ring_neighbours(int direction) const {
  auto nb = rsdp::ring_neighbours(ring_order_, getRank(), direction);
  return {nb.send_to, nb.recv_from};
}

}  // namespace rsdp
