// The compressed-block decoder (csrc/core/quantize.h): dequantize and
// dequantize_add read blocks a peer quantised, scales included (NaN, Inf,
// subnormal, negative), codes included (any nibble or byte, the non-finite
// codes too).
//
// Input: bits (1 byte: int4 or int8), dtype (1 byte: float32, bfloat16,
// float16), block (2 bytes: even, 32..4126), count (2 bytes: 0..8191), the
// sender's byte count as an offset from the right one (1 signed byte; 0 in
// most seeds), then the payload (the rest, zero past the end).
//
// The payload travels as the collective does: a header announcing the
// sender's byte count, checked by check_header (csrc/transport/ucx/ucx_wire.h)
// against quant_bytes() of this rank's op, which must refuse any other count;
// an accepted payload lands in a buffer of exactly quant_bytes() and is
// decoded into outputs of exactly `count` elements, so any read or write past
// them is a sanitizer report. Checked besides: dequantize and dequantize_add
// agree bit for bit, and, on float32 data, a round trip through quantize
// stays within the documented bound (half a scale, plus rounding), and
// Inf and NaN come back as they were.
//
// fuzz-sources: csrc/core/quantize.cpp csrc/transport/ucx/ucx_wire.cpp csrc/core/op_desc.cpp
// fuzz-options: -max_len=33000
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/quantize.h"
#include "fuzz_input.h"
#include "transport/ucx/ucx_wire.h"

using namespace rsdp;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The payload as it arrives: a header with the sender's byte count, then the
// payload inline or, past kInlineMax, in a message of its own (whose size UCX
// checks against the posted receive, as handle() does).
bool receive(const std::vector<uint8_t>& sent, const OpDesc& op, size_t want, uint8_t* dst) {
  ucx_wire::WireHeader h = ucx_wire::make_header(op, 3, sent.size());
  const bool follows = sent.size() > ucx_wire::kInlineMax;
  std::vector<uint8_t> msg(sizeof h + (follows ? 0 : sent.size()));
  std::memcpy(msg.data(), &h, sizeof h);
  if (!follows && !sent.empty()) std::memcpy(msg.data() + sizeof h, sent.data(), sent.size());
  const auto v = ucx_wire::check_header(msg.data(), msg.size(), op, 3, want, dst,
                                        "rsdp rank 0: allreduce: ", "rank 1");
  if (!v.error.empty()) return false;
  FUZZ_CHECK(sent.size() == want, "a payload of another size was accepted");
  if (v.payload_follows) std::memcpy(dst, sent.data(), want);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const QuantBits bits = in.take<uint8_t>() & 1 ? QuantBits::kInt8 : QuantBits::kInt4;
  static const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const DType dt = kTypes[in.take<uint8_t>() % 3];
  const size_t block = 32 + 2 * (in.take<uint16_t>() % 2048);
  const size_t count = in.take<uint16_t>() % 8192;
  const int delta = in.take<int8_t>();

  const size_t want = quant_bytes(count, bits, block);
  const size_t sent_bytes = static_cast<size_t>(std::max<long>(0, long(want) + delta));
  std::vector<uint8_t> sent(sent_bytes, 0);
  size_t got = 0;
  const uint8_t* payload = in.bytes(sent_bytes, &got);
  if (got) std::memcpy(sent.data(), payload, got);

  OpDesc op = OpDesc::make(OpKind::kAllreduce, dt, count);
  op.wire_bits = static_cast<uint8_t>(bits);
  std::unique_ptr<uint8_t[]> q(new uint8_t[want]);
  const bool ok = receive(sent, op, want, q.get());
  FUZZ_TRACE("int%d %s block %zu count %zu: %zu bytes sent, %zu wanted: %s\n",
             static_cast<int>(bits), dtype_name(dt), block, count, sent_bytes, want,
             ok ? "decoded" : "refused");
  FUZZ_CHECK(ok == (sent_bytes == want), "the byte count check is wrong");
  if (!ok) return 0;

  const size_t es = dtype_size(dt);
  std::unique_ptr<uint8_t[]> out(new uint8_t[count * es]);
  dequantize(q.get(), count, bits, block, dt, out.get());
  std::unique_ptr<float[]> acc(new float[count]());
  dequantize_add(q.get(), count, bits, block, acc.get());
  if (dt == DType::kFloat32) {
    for (size_t i = 0; i < count; ++i) {
      float a;
      std::memcpy(&a, out.get() + 4 * i, 4);
      const float b = acc[i];
      FUZZ_CHECK((std::isnan(a) && std::isnan(b)) || a == b,
                 "dequantize and dequantize_add disagree at element " + std::to_string(i));
    }
  }

  // Round trip of float32 values read from the payload's bytes (repeated as
  // far as needed).
  if (dt != DType::kFloat32 || count == 0 || sent.empty()) return 0;
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) {
    uint8_t b[4];
    for (size_t k = 0; k < 4; ++k) b[k] = sent[(4 * i + k) % sent.size()];
    std::memcpy(&x[i], b, 4);
  }
  std::unique_ptr<uint8_t[]> q2(new uint8_t[want]);
  quantize(x.data(), DType::kFloat32, count, bits, block, q2.get());
  std::unique_ptr<float[]> y(new float[count]);
  dequantize(q2.get(), count, bits, block, DType::kFloat32, y.get());
  for (size_t i = 0; i < count; ++i) {
    float scale;
    std::memcpy(&scale, q2.get() + 4 * (i / block), 4);
    if (std::isnan(x[i])) {
      FUZZ_CHECK(std::isnan(y[i]), "NaN lost at element " + std::to_string(i));
    } else if (std::isinf(x[i])) {
      FUZZ_CHECK(bits_of(y[i]) == bits_of(x[i]), "Inf lost at element " + std::to_string(i));
    } else {
      const float levels = bits == QuantBits::kInt8 ? 126.f : 6.f;
      // A block below float32's normal range quantises to zero (quantize.cpp).
      const double bound = scale > 0.f ? scale * (0.5 + 1e-4) + std::fabs(x[i]) * 1e-6
                                       : levels * 1.1755e-38;
      FUZZ_CHECK(std::fabs(double(y[i]) - double(x[i])) <= bound,
                 "element " + std::to_string(i) + " off by more than half a scale");
    }
  }
  return 0;
}
