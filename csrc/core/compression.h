// A process group's compression setting: which collectives send block-
// quantised values between nodes (core/quantize.h), and the block size.
// Off by default; every exact path is untouched while it is off. Only the
// inter-node stage of the hierarchical algorithms is compressed (and, for
// ring_shift, the hops whose sender and receiver are on different nodes),
// only for float32/bfloat16/float16 and (for reductions) SUM and AVG;
// anything else runs exactly as without it.
#pragma once

#include <cstddef>

#include "core/quantize.h"

namespace rsdp {

struct Compression {
  QuantBits all_gather = QuantBits::kNone;
  QuantBits reduce_scatter = QuantBits::kNone;
  QuantBits all_reduce = QuantBits::kNone;
  QuantBits ring_shift = QuantBits::kNone;         // plain shifts (RSDP's weights)
  QuantBits ring_shift_reduce = QuantBits::kNone;  // shift-reduce (its gradients)
  size_t block = 512;  // elements per scale; even

  bool any() const {
    return all_gather != QuantBits::kNone || reduce_scatter != QuantBits::kNone ||
           all_reduce != QuantBits::kNone || ring_shift != QuantBits::kNone ||
           ring_shift_reduce != QuantBits::kNone;
  }
};

}  // namespace rsdp
