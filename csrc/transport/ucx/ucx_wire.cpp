// The decoders of what arrives on the collective worker (ucx_wire.h): a
// collective's header message and a failure notice. Both read bytes another
// process chose, so both bound every read and write by what arrived and what
// this rank posted, never by a length the message claims. No UCX headers: the
// fuzz targets (tests/fuzz/) compile this file alone.
#include "transport/ucx/ucx_wire.h"

#include <algorithm>

#include "core/error.h"

namespace rsdp {
namespace ucx_wire {

namespace {

constexpr size_t kHdr = sizeof(WireHeader);

// Valid UTF-8 without control characters (newline and tab kept), every other
// byte as '?': a notice's text becomes part of an exception message, and
// Python refuses to decode one that is not UTF-8 (the error would then hide
// the failure it reports).
std::string printable_utf8(const char* s, size_t n) {
  std::string out;
  out.reserve(n);
  auto cont = [&](size_t i) {
    return i < n && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    if (c >= 0x20 && c < 0x7F) len = 1;
    else if (c == '\n' || c == '\t') len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    bool ok = len > 0;
    for (size_t k = 1; ok && k < len; ++k) ok = cont(i + k);
    if (ok && len >= 3) {
      // No overlong forms, surrogates, or code points past U+10FFFF.
      const unsigned char d = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xE0) ok = d >= 0xA0;
      else if (c == 0xED) ok = d < 0xA0;
      else if (c == 0xF0) ok = d >= 0x90;
      else if (c == 0xF4) ok = d < 0x90;
    }
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    out.append(s + i, len);
    i += len;
  }
  return out;
}

}  // namespace

HeaderVerdict check_header(const void* msg, size_t len, const OpDesc& expected, uint32_t step,
                           uint64_t bytes, void* dst, const std::string& me_op,
                           const std::string& who) {
  HeaderVerdict v;
  const char* m = static_cast<const char*>(msg);
  if (len) std::memcpy(&v.hdr, m, std::min(len, kHdr));
  const WireHeader& h = v.hdr;
  if (len < kHdr || h.magic != kMagic) {
    v.error = detail::cat(me_op, "malformed message of ", len, " bytes from ", who, " (step ",
                          step, "; is it running a different version of torch_rsdp?)");
    return v;
  }
  const OpDesc theirs = header_desc(h);
  if (!(theirs == expected) || h.step != step || h.bytes != bytes) {
    v.error = detail::cat(me_op, who, " is running ", theirs.describe(),
                          " but this rank is running ", expected.describe());
    if (h.bytes != bytes || h.step != step)
      v.error += detail::cat("; it sent ", h.bytes, " bytes for step ", h.step,
                             " where this rank expects ", bytes, " bytes for step ", step);
    v.error += ". All ranks must issue the same collectives, in the same order, with the same "
               "sizes and dtypes";
  }
  // The header's own size decides whether a payload message follows (the
  // sender split it so); after a mismatch the receiver drains that message.
  v.payload_follows = h.bytes > kInlineMax;
  if (!v.error.empty()) return v;
  // From here h.bytes == bytes: what arrived must be exactly the header, plus
  // the payload when it travels inline.
  const size_t inline_bytes = v.payload_follows ? 0 : bytes;
  if (len != kHdr + inline_bytes) {
    v.error = detail::cat(me_op, "the message from ", who, " has ", len - kHdr,
                          " payload bytes, though its header announced ", h.bytes,
                          v.payload_follows ? " to follow in a message of their own" : "",
                          " (step ", step, ")");
    return v;
  }
  if (inline_bytes) std::memcpy(dst, m + kHdr, inline_bytes);
  return v;
}

Failure decode_notice(const void* msg, size_t len, const std::vector<int>& members,
                      int from_global, const std::string& from) {
  NoticeMsg m;
  std::memset(&m, 0, sizeof(m));
  if (len) std::memcpy(&m, msg, std::min(len, sizeof(m)));
  const bool member = std::find(members.begin(), members.end(), m.origin) != members.end();
  Failure f;
  if (len < kNoticeHead || m.magic != kNoticeMagic ||
      m.kind > static_cast<uint32_t>(ErrorKind::kSystem) || !member) {
    // Its sender is the one known to have given up.
    f.origin = from_global;
    f.kind = ErrorKind::kPeer;
    f.text = detail::cat("a malformed failure notice (", len, " bytes) arrived from ", from,
                         " (is every rank running the same torch_rsdp?)");
    return f;
  }
  f.origin = m.origin;
  f.kind = static_cast<ErrorKind>(m.kind);
  const size_t n = std::min<size_t>({m.len, kNoticeTextBytes, len - kNoticeHead});
  f.text = printable_utf8(m.text, n);
  return f;
}

}  // namespace ucx_wire
}  // namespace rsdp
