// RSDP's sharded Linear, its ring schedules in C++ (torch_rsdp/rsdp/_layers/sharded_linear.py calls
// them; the Python schedules in torch_rsdp/rsdp/_rotation/rotation.py remain for what these do not
// take: mixed dtypes, groups across nodes, compressed gradient hops).
//
// A layer's forward is W ring hops of its flat shard with a matmul per shard in hand, its
// backward 2(W-1) hops (weights counter-rotating, gradient sums riding home) with two matmuls
// per shard: written in Python, each hop costs interpreter and dispatch time as large as the
// matmuls themselves for a small layer. Here a whole schedule
// is one call; the hops are ring steps on the caller's thread (BackendRSDP::ring_step, which
// the bindings hand in as RingHops: this layer includes nothing of the backend).
//
// Shard j of the flat layout holds the weight at `w_off` (stored [out_j, in] for nn.Linear
// split by output features, [out, in_j] split by input features; transposed ([in, out], as
// transformers' Conv1D) when `transposed`) and, split by output features, the bias at `b_off`.
// The arithmetic sees w_io, the shard as [in_j, out] / [in, out_j].
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace rsdp {

// What the schedules need of the backend: start one ring hop (`send` to the neighbour in
// `direction`, the other neighbour's into `recv`, plus `add` when given) and get the function
// that waits for it. csrc/bindings/ serves it with the backend's ring steps.
class RingHops {
 public:
  virtual ~RingHops() = default;
  virtual std::function<void()> start(const at::Tensor& send, const at::Tensor& recv,
                                      int direction, const std::optional<at::Tensor>& add) = 0;
};

struct LinearGeometry {
  bool split_out = true;
  bool transposed = false;
  int64_t fin = 0, fout = 0;
  std::vector<int64_t> sizes, starts;  // per group rank: its features along the split
  int64_t w_off = 0;
  int64_t b_off = -1;  // < 0: no sharded bias
};

// y [N, out] = x2 [N, in] through every shard, own first (origins[t]: the group rank whose
// shard is in hand after t hops of direction +1). `bufs`: one (W == 2) or two flat buffers
// like `src` for the shards in flight. `whole`: the shards are copied into one whole weight as
// they pass and y comes from one matmul ([Note: whole small layers] in linear_schedule.cpp).
at::Tensor linear_forward(RingHops& ring, const LinearGeometry& g, const at::Tensor& x2,
                          const at::Tensor& src, const std::vector<at::Tensor>& bufs,
                          const std::vector<int64_t>& origins, bool whole);

// Backward with direction -1 (origins[t] for t = 0 .. W). With `need_x`: returns grad of x2
// (weights counter-rotate from `src` through `wbuf`). With `acc` (zeroed, like `src`):
// leaves in it the sum over ranks of this rank's shard's gradient (`local`: scratch).
// `whole`: this rank's gradient contribution to the whole weight in one matmul, each shard's
// part copied from it, and the input gradient from one matmul with the weights copied into
// one whole weight as they pass, instead of a matmul per shard that reads x2 or dy2 again
// ([Note: whole small layers]).
at::Tensor linear_backward(RingHops& ring, const LinearGeometry& g, const at::Tensor& x2,
                           const at::Tensor& dy2, const at::Tensor& src,
                           const at::Tensor& wbuf, const at::Tensor& acc,
                           const at::Tensor& local, const std::vector<int64_t>& origins,
                           bool need_x, bool whole);

}  // namespace rsdp
