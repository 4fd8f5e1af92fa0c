// Element-wise reduction on the GPU: the device twin of core/reduce_kernels.h.
//
// device_reduce_n(dst, srcs, nsrc, count, dtype, op, divisor, stream):
//   dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i]
// evaluated in source order (so every rank that reduces the same inputs gets
// bit-identical results). Sources may be peer buffers mapped through CUDA IPC.
// dst may alias any src element-for-element. For AVG the sum is divided by
// `divisor` at the end. float16/bfloat16 accumulate in float32 and round once.
// Queued on `stream`; returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"
#include "core/reduce_op.h"

namespace rsdp {

// Sources per call; callers with more reduce in rounds.
constexpr int kMaxDeviceReduceSrcs = 32;

void device_reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype,
                     RedOp op, int divisor, cudaStream_t stream);

}  // namespace rsdp
