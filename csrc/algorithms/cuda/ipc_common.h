// Helpers shared by the CUDA-IPC algorithms (internal to algorithms/cuda).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"
#include "core/op_desc.h"
#include "core/reduce_op.h"
#include "transport/cuda_ipc/ipc_comm.h"

namespace rsdp {
namespace ipc {
namespace impl {

// bytes from src to dst on the op's stream (device to device; either side
// may be a peer's mapped buffer). Empty copies queue nothing.
void copy(IpcComm& c, void* dst, const void* src, size_t bytes);

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], left to right,
// on the op's stream; AVG divides by `divisor` at the end. More sources than
// one kernel takes reduce in rounds, dst carrying the partial result:
//   dst = op(srcs[0..31]); dst = op(dst, srcs[32..62]); ...
// (AVG sums in all rounds but the last). dst may alias any source; if it
// aliases one after the first round (which the first round would overwrite),
// the rounds run in `scratch` (count elements, not aliasing any source) and
// the result is copied to dst. Without a scratch that case is an error.
void reduce_ordered(IpcComm& c, void* dst, const void* const* srcs, int nsrc, size_t count,
                    DType dt, RedOp op, int divisor, void* scratch);

// Raise kValue before any communication (so no rank leaves the others
// waiting in a half-run op): unless 0 <= root < size; unless the device
// reduction defines (dt, op).
void check_root(const IpcComm& c, int root, OpKind kind);
void check_redop(const IpcComm& c, DType dt, RedOp op, OpKind kind);

}  // namespace impl
}  // namespace ipc
}  // namespace rsdp
