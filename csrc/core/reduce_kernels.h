// Element-wise reduction kernels used by every reducing collective.
//
// reduce_n(dst, srcs, nsrc, count, dtype, op, divisor):
//   dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i]
// evaluated left to right (src order fixed, so every rank that reduces the same
// inputs gets bit-identical results). dst may alias any src. For AVG the sum is
// divided by `divisor` (the group size) at the end. float16/bfloat16 are
// accumulated in float32 and rounded once (round to nearest even).
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "core/reduce_op.h"

namespace rsdp {

void reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype,
              RedOp op, int divisor);

}  // namespace rsdp
