#include "algorithms/cuda/ipc_common.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_reduce.h"

namespace rsdp {
namespace ipc {
namespace impl {

void copy(IpcComm& c, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  RSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream()), "(",
                  c.group().me(), ": ", c.desc().describe(), ", copying ", bytes, " bytes)");
}

namespace {

// device_reduce_n, with the rank and the op in its errors.
void reduce_call(IpcComm& c, void* dst, const void* const* srcs, int nsrc, size_t count,
                 DType dt, RedOp op, int divisor) {
  try {
    device_reduce_n(dst, srcs, nsrc, count, dt, op, divisor, c.stream());
  } catch (const Error& e) {
    throw Error(e.kind(), ::rsdp::detail::cat(c.group().me(), ": ", c.desc().describe(),
                                              ", reducing ", nsrc, " x ", count, " elements: ",
                                              e.what()));
  }
}

}  // namespace

void reduce_ordered(IpcComm& c, void* dst, const void* const* srcs, int nsrc, size_t count,
                    DType dt, RedOp op, int divisor, void* scratch) {
  if (count == 0 || nsrc <= 0) return;
  if (nsrc <= kMaxDeviceReduceSrcs) {
    reduce_call(c, dst, srcs, nsrc, count, dt, op, divisor);
    return;
  }
  void* out = dst;
  for (int k = kMaxDeviceReduceSrcs; k < nsrc; ++k)
    if (srcs[k] == dst) {
      RSDP_CHECK_KIND(ErrorKind::kSystem, scratch != nullptr, c.group().me(), ": ",
                      c.desc().describe(), ": internal error: the reduction's output aliases its "
                      "source ", k, " of ", nsrc, " and no scratch space was given");
      out = scratch;
      break;
    }
  // AVG: sum in every round, divide once in the last.
  const RedOp partial = op == RedOp::kAvg ? RedOp::kSum : op;
  int done = kMaxDeviceReduceSrcs;
  reduce_call(c, out, srcs, done, count, dt, partial, divisor);
  std::vector<const void*> round(kMaxDeviceReduceSrcs);
  while (done < nsrc) {
    const int take = std::min(nsrc - done, kMaxDeviceReduceSrcs - 1);
    round[0] = out;
    std::copy(srcs + done, srcs + done + take, round.begin() + 1);
    done += take;
    reduce_call(c, out, round.data(), take + 1, count, dt, done == nsrc ? op : partial, divisor);
  }
  if (out != dst) copy(c, dst, out, count * dtype_size(dt));
}

void check_root(const IpcComm& c, int root, OpKind kind) {
  RSDP_CHECK(root >= 0 && root < c.size(), c.group().me(), ": ", op_name(kind), ": root ", root,
             " is not a rank of the node's group of ", c.size());
}

void check_redop(const IpcComm& c, DType dt, RedOp op, OpKind kind) {
  RSDP_CHECK(redop_supported(dt, op), c.group().me(), ": ", op_name(kind), ": reduce op ",
             redop_name(op), " is not defined for ", dtype_name(dt));
}

}  // namespace impl
}  // namespace ipc
}  // namespace rsdp
