// The UCX failure notice (csrc/transport/ucx/ucx_wire.h, decode_notice): the
// message a member on another node sends when it finds the group broken. Its
// length field, origin and kind are the sender's word.
//
// Input: the group (1 byte: size 1..16; 1 byte: the stride and 1 byte: the
// offset of its members' global ranks), the sender's group rank as its tag
// names it (1 byte, may name no member), then the message as it arrived (any
// length; the receive buffer holds at most sizeof(NoticeMsg)). Checked: the
// failure names a member as its origin (or, for a malformed notice, the
// sender), its kind is an ErrorKind, and its text is no longer than the
// notice's text field and printable UTF-8.
//
// fuzz-sources: csrc/transport/ucx/ucx_wire.cpp csrc/core/op_desc.cpp
// fuzz-options: -max_len=1100
#include <algorithm>
#include <vector>

#include "fuzz_input.h"
#include "transport/ucx/ucx_wire.h"

using namespace rsdp;

namespace {

bool printable_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    if (n == 1 && c < 0x20 && c != '\n' && c != '\t') return false;
    if (c == 0x7F) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const int n = 1 + in.take<uint8_t>() % 16;
  const int stride = 1 + in.take<uint8_t>() % 4, offset = in.take<uint8_t>();
  const int src = in.take<uint8_t>() % 20;
  std::vector<int> members;
  for (int r = 0; r < n; ++r) members.push_back(offset + r * stride);
  const bool known = src < n;
  const int from_global = known ? members[src] : -1;
  const std::string from = known ? "rank " + std::to_string(from_global) : "an unknown rank";
  // What UCX hands over: at most the receive buffer, in a buffer of that size.
  const size_t len = std::min(in.left(), sizeof(ucx_wire::NoticeMsg));
  const std::vector<uint8_t> msg(in.rest(), in.rest() + len);

  const Failure f = ucx_wire::decode_notice(msg.data(), len, members, from_global, from);
  FUZZ_TRACE("origin %d kind %d: %s\n", f.origin, static_cast<int>(f.kind), f.text.c_str());
  const bool member = std::find(members.begin(), members.end(), f.origin) != members.end();
  FUZZ_CHECK(member || f.origin == from_global, "the origin is no member and not the sender");
  FUZZ_CHECK(static_cast<int>(f.kind) >= 0 && f.kind <= ErrorKind::kSystem, "no ErrorKind");
  FUZZ_CHECK(f.text.size() <= kNoticeTextBytes + 200, "text longer than the notice can carry");
  FUZZ_CHECK(printable_utf8(f.text), "text is not printable UTF-8");
  return 0;
}
