// Reduction operators, mirroring c10d::ReduceOp minus PREMUL_SUM.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace rsdp {

enum class RedOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };

inline const char* redop_name(RedOp op) {
  switch (op) {
    case RedOp::kSum: return "SUM";
    case RedOp::kAvg: return "AVG";
    case RedOp::kProduct: return "PRODUCT";
    case RedOp::kMin: return "MIN";
    case RedOp::kMax: return "MAX";
    case RedOp::kBand: return "BAND";
    case RedOp::kBor: return "BOR";
    case RedOp::kBxor: return "BXOR";
  }
  return "?";
}

// Which (dtype, op) pairs are defined:
//  - floating: SUM AVG PRODUCT MIN MAX
//  - integers: SUM PRODUCT MIN MAX BAND BOR BXOR (AVG on the host only: host_redop_supported)
//  - bool:     SUM(=OR) PRODUCT(=AND) MIN(=AND) MAX(=OR) BAND BOR BXOR
//  - complex:  SUM AVG
inline bool redop_supported(DType t, RedOp op) {
  if (dtype_is_complex(t)) return op == RedOp::kSum || op == RedOp::kAvg;
  if (dtype_is_floating(t))
    return op != RedOp::kBand && op != RedOp::kBor && op != RedOp::kBxor;
  return op != RedOp::kAvg;
}

// Where the host kernels (reduce_n) define (dtype, op): the above, and AVG of integers as
// NCCL computes it (ncclAvg: sum with wrap-around, then one division truncating toward
// zero), which Lightning's sync_dist logging relies on. The device kernels do not average
// integers, so CUDA tensors keep to redop_supported.
inline bool host_redop_supported(DType t, RedOp op) {
  return redop_supported(t, op) || (op == RedOp::kAvg && t != DType::kBool);
}

}  // namespace rsdp
