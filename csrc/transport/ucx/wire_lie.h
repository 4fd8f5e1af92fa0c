// A test-only fault of the UCX collective engine: a rank whose messages are
// well-formed but whose headers lie. RSDP_TEST_WIRE_LIE=<field> (a test hook,
// core/test_hooks.h, read once per process group) makes every header this rank
// sends carry that field altered, the payload and the UCX tag untouched, so
// that tests/backend/test_hostile_peer.py can prove the honest peer refuses
// the message with an error naming the peer and the op, and never writes a
// byte it did not agree to receive. Nothing else sets it.
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/op_desc.h"
#include "transport/ucx/ucx_wire.h"

namespace rsdp {
namespace ucx_wire {

// Plausible lies (a real dtype, a real op): the receiver must tell them from
// the truth by comparing, not by spotting garbage.
inline void apply_wire_lie(const std::string& field, WireHeader& h) {
  if (field == "bytes") {
    h.bytes += 8;
  } else if (field == "step") {
    h.step += 1;
  } else if (field == "dtype") {
    const bool f32 = h.dtype == static_cast<uint8_t>(DType::kFloat32);
    h.dtype = static_cast<uint8_t>(f32 ? DType::kInt32 : DType::kFloat32);
  } else if (field == "op") {
    const bool bcast = h.kind == static_cast<uint8_t>(OpKind::kBroadcast);
    h.kind = static_cast<uint8_t>(bcast ? OpKind::kAllreduce : OpKind::kBroadcast);
  } else if (field == "bits") {
    h.wire_bits = h.wire_bits ? 0 : 8;
  } else if (field == "count") {
    h.count += 1;
  }
}

}  // namespace ucx_wire
}  // namespace rsdp
