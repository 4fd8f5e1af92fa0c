// Argument checks and conversions between torch and rsdp types, done on the
// calling thread before anything is queued: a bad call raises at once, names
// the rank, the op and the offending shape/dtype, and never reaches a peer.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/reduce_op.h"

namespace rsdp {

struct OpContext {
  int rank;        // global rank, for messages
  const char* op;  // torch-facing op name, e.g. "all_reduce"
};

std::string describe(const at::Tensor& t);  // "float32[4, 3]"

DType to_dtype(const OpContext& ctx, const at::Tensor& t);
// `on_device`: the tensors are CUDA tensors, reduced by the device kernels or NCCL, which
// take fewer (dtype, op) pairs than the host (host_redop_supported: integer AVG).
RedOp to_redop(const OpContext& ctx, const c10d::ReduceOp& op, DType dt, bool on_device);

// CPU (or CUDA in CUDA builds), strided, supported dtype.
void check_tensor(const OpContext& ctx, const at::Tensor& t, const char* what);
void check_one(const OpContext& ctx, const std::vector<at::Tensor>& ts, const char* what);
// Each of ts is a valid tensor with ref's dtype, on ref's device.
void check_same_dtype(const OpContext& ctx, const at::Tensor& ref,
                      const std::vector<at::Tensor>& ts, const char* what);
void check_rank(const OpContext& ctx, int64_t r, int size, const char* what);

// A contiguous tensor with t's data: t itself when possible, else a copy.
// After the op, write_back() copies results into a non-contiguous original.
inline at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
inline void write_back(const at::Tensor& orig, const at::Tensor& dense_copy) {
  if (!orig.is_same(dense_copy)) orig.copy_(dense_copy);
}

}  // namespace rsdp
