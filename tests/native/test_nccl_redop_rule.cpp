// Standalone test of the rule that keeps ncclAvg off one-rank communicators
// (csrc/transport/nccl/nccl_redop_rule.h; NVIDIA/nccl#1950). Needs neither
// NCCL nor CUDA nor torch, only g++.
//   g++ -std=c++17 -I csrc tests/native/test_nccl_redop_rule.cpp && ./a.out
// Last line "N passed, M failed"; the exit code is non-zero on any failure.
#include <cstdio>

#include "core/dtype.h"
#include "core/reduce_op.h"
#include "transport/nccl/nccl_redop_rule.h"
#include "check.h"

using namespace rsdp;


static const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                  DType::kBFloat16, DType::kInt8, DType::kUInt8,
                                  DType::kInt32, DType::kInt64, DType::kBool,
                                  DType::kComplex64, DType::kComplex128};
static const RedOp kAllOps[] = {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin,
                                RedOp::kMax, RedOp::kBand, RedOp::kBor, RedOp::kBxor};
// Communicator sizes: one rank (the buggy case), the smallest real group, odd
// ones, a node of 8 GPUs and a large rail.
static const int kSizes[] = {1, 2, 3, 7, 8, 1024};

int main() {
  // The bug's case: AVG on one rank goes to NCCL as SUM.
  CHECK(nccl_redop_for(RedOp::kAvg, 1) == RedOp::kSum, "AVG on 1 rank gave %s",
        redop_name(nccl_redop_for(RedOp::kAvg, 1)));

  for (int n : kSizes) {
    for (RedOp op : kAllOps) {
      const RedOp got = nccl_redop_for(op, n);
      if (op == RedOp::kAvg && n == 1) continue;  // checked above
      // With 2 or more ranks AVG must stay AVG (SUM would not divide), and no
      // other operator changes at any size.
      CHECK(got == op, "%s on %d ranks gave %s", redop_name(op), n, redop_name(got));
    }
    // The rule never makes a defined (dtype, op) pair undefined, so the NCCL
    // mapping of the result exists wherever nccl_supports() accepted the op.
    for (DType dt : kAllTypes)
      for (RedOp op : kAllOps)
        if (redop_supported(dt, op))
          CHECK(redop_supported(dt, nccl_redop_for(op, n)),
                "dtype %d %s on %d ranks maps to an undefined %s", static_cast<int>(dt),
                redop_name(op), n, redop_name(nccl_redop_for(op, n)));
  }

  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
