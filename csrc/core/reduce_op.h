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
//  - integers: SUM PRODUCT MIN MAX BAND BOR BXOR (AVG is not: it would round)
//  - bool:     SUM(=OR) PRODUCT(=AND) MIN(=AND) MAX(=OR) BAND BOR BXOR
//  - complex:  SUM AVG
inline bool redop_supported(DType t, RedOp op) {
  if (dtype_is_complex(t)) return op == RedOp::kSum || op == RedOp::kAvg;
  if (dtype_is_floating(t))
    return op != RedOp::kBand && op != RedOp::kBor && op != RedOp::kBxor;
  return op != RedOp::kAvg;
}

}  // namespace rsdp
