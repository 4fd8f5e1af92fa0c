// Which reduction NcclComm asks NCCL for: the rule, free of nccl.h and CUDA so
// that tests/native/test_nccl_redop_rule.cpp checks it on any machine.
//
// [Note: no ncclAvg on a one-rank communicator]
// NCCL up to 2.29.6 leaves a tail of the output (its last few elements)
// unwritten when ncclAvg runs on a communicator of one rank (NVIDIA/nccl#1950,
// fixed in 2.29.7; PyTorch users met it as pytorch/pytorch#168092: stock
// ProcessGroupNCCL passes ncclAvg through). On an H200 with NCCL 2.28.9 a
// float32 AVG reduce-scatter of 100,003 elements on one rank left the last 3
// elements as whatever the output held before; an all-reduce in place hides
// the bug, as its unwritten tail already holds the answer. On one rank the
// average of a value is the value itself, so SUM gives the same result
// exactly and has no such tail. The rule does not look at the NCCL version:
// on one rank SUM is right with every version, so AVG has nothing to offer
// there. The global group of one rank and a node stage whose node has one GPU
// both reach NCCL through NcclComm, which applies the rule to every call with
// a reduction.
#pragma once

#include "core/reduce_op.h"

namespace rsdp {

// The operator to hand NCCL for `op` on a communicator of `ranks` ranks.
// Where (dtype, op) is defined (redop_supported), so is the result.
inline RedOp nccl_redop_for(RedOp op, int ranks) {
  return op == RedOp::kAvg && ranks == 1 ? RedOp::kSum : op;
}

}  // namespace rsdp
