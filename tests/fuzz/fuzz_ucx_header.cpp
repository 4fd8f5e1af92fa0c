// The UCX collective header (csrc/transport/ucx/ucx_wire.h, check_header):
// what a receiver does with a header message that lies about its sizes, op,
// step, dtype or compression bits, or is short, long or of another kind.
//
// Input: a WireHeader (56 bytes) this rank expects (its op descriptor, step,
// and the payload bytes it posted, kept below 16 KiB), then the message as it
// arrived (any length). The message and the posted receive buffer are heap
// blocks of exactly their sizes, so any read or write past them is a
// sanitizer report. Checked: an accepted header agrees in every field and
// its inline payload lands whole in the buffer; a refused one leaves the
// buffer untouched and its error names this rank, the op and the peer.
//
// fuzz-sources: csrc/transport/ucx/ucx_wire.cpp csrc/core/op_desc.cpp
// fuzz-options: -max_len=8448
#include <cstring>
#include <vector>

#include "fuzz_input.h"
#include "transport/ucx/ucx_wire.h"

using namespace rsdp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const auto want = in.take<ucx_wire::WireHeader>();
  const OpDesc expected = ucx_wire::header_desc(want);
  const uint32_t step = want.step;
  const uint64_t bytes = want.bytes & 0x3FFF;
  const std::vector<uint8_t> msg(in.rest(), in.rest() + in.left());
  const size_t len = msg.size();

  constexpr uint8_t kUntouched = 0xA5;
  auto* dst = new uint8_t[bytes];
  std::memset(dst, kUntouched, bytes);
  const std::string me_op = std::string("rsdp rank 0: ") + op_name(expected.kind) + ": ";
  const std::string who = "rank 1";
  const ucx_wire::HeaderVerdict v =
      ucx_wire::check_header(msg.data(), len, expected, step, bytes, dst, me_op, who);

  FUZZ_TRACE("%zu bytes: %s%s\n", len, v.error.empty() ? "accepted" : v.error.c_str(),
             v.payload_follows ? " (payload follows)" : "");
  constexpr size_t kHdr = sizeof(ucx_wire::WireHeader);
  const bool framed = len >= kHdr && v.hdr.magic == ucx_wire::kMagic;
  FUZZ_CHECK(v.payload_follows == (framed && v.hdr.bytes > ucx_wire::kInlineMax),
             "a payload message is expected only where a well-formed header announces one");
  if (v.error.empty()) {
    FUZZ_CHECK(framed, "accepted a message that is no header");
    FUZZ_CHECK(ucx_wire::header_desc(v.hdr) == expected, "accepted another op");
    FUZZ_CHECK(v.hdr.step == step && v.hdr.bytes == bytes, "accepted another step or size");
    const size_t inline_bytes = v.payload_follows ? 0 : bytes;
    FUZZ_CHECK(len == kHdr + inline_bytes, "accepted a message of the wrong length");
    FUZZ_CHECK(inline_bytes == 0 || std::memcmp(dst, msg.data() + kHdr, inline_bytes) == 0,
               "the inline payload did not arrive whole");
  } else {
    FUZZ_CHECK(v.error.compare(0, me_op.size(), me_op) == 0,
               "the error does not name this rank and the op: " + v.error);
    FUZZ_CHECK(v.error.find(who) != std::string::npos, "the error does not name the peer");
    for (uint64_t i = 0; i < bytes; ++i)
      FUZZ_CHECK(dst[i] == kUntouched, "a refused message wrote into the receive buffer");
  }
  delete[] dst;
  return 0;
}
