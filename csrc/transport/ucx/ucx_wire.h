// What NetComm puts on the wire: the 64-bit UCX tags and the header that
// every collective message carries. Kept apart from the code that uses them
// so that the layout can be read (and checked) in one place.
//
// Tags
//   collective: bit 63 = 0 | src group rank (20) | op seq low 22 bits |
//               header bit (1) | step (20)
//   p2p:        bit 63 = 1 | zero (11) | src group rank (20) | user tag low 32 bits
//   notice:     bit 63 = 1 | zero (43) | src group rank (20)   (collective worker;
//               a broken group's failure, ucx_coll.h, received from any source)
// A receive always matches the full tag (the source included), except a p2p
// any-source receive, which masks the source bits out; so messages of
// different ops, steps, peers and the two message kinds never match each
// other. The sequence number wraps after 4M collectives; only a message left
// unmatched by a failed op that long ago could be mistaken for a new one.
//
// Why a separate header bit: a payload larger than kInlineMax travels as its
// own contiguous message (tag without the bit) after a header-only message
// (tag with the bit). UCX 1.13 sends an IOV datatype [header, payload] through
// a copying protocol, so a large payload as an IOV costs several times what
// the payload alone costs as a contiguous message; a small one costs the same
// either way, while a second message costs a second message's latency. So
// small payloads ride inside the header message and large ones follow it.
// The receiver posts the payload receive only after it has checked the
// header, so it never receives a payload whose size or op it did not agree to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/notice.h"
#include "core/op_desc.h"

namespace rsdp {
namespace ucx_wire {

constexpr int kRankBits = 20;
constexpr int kStepBits = 20;
constexpr int kSeqBits = 22;
constexpr uint64_t kP2PBit = 1ull << 63;
constexpr uint64_t kHeaderBit = 1ull << kStepBits;
constexpr uint64_t kRankMask = (1ull << kRankBits) - 1;

// Payloads up to this size travel inside the header message.
constexpr size_t kInlineMax = 8192;

inline uint64_t coll_tag(int src, uint64_t seq, uint32_t step, bool header) {
  return (static_cast<uint64_t>(src) & kRankMask) << (kSeqBits + 1 + kStepBits) |
         (seq & ((1ull << kSeqBits) - 1)) << (1 + kStepBits) | (header ? kHeaderBit : 0) |
         (step & ((1ull << kStepBits) - 1));
}

inline uint64_t p2p_tag(int src, int user_tag) {
  return kP2PBit | (static_cast<uint64_t>(src) & kRankMask) << 32 |
         static_cast<uint32_t>(user_tag);
}
constexpr uint64_t kP2PSrcMask = kRankMask << 32;
inline int p2p_src(uint64_t tag) { return static_cast<int>((tag >> 32) & kRankMask); }

inline uint64_t notice_tag(int src) { return kP2PBit | (static_cast<uint64_t>(src) & kRankMask); }
constexpr uint64_t kNoticeSrcMask = kRankMask;
constexpr uint32_t kNoticeMagic = 0x4e435552;  // "RUCN"

// The sender's view of the message: its op descriptor, the step and the
// payload size. Fixed layout (no padding), compared field by field.
struct WireHeader {
  uint32_t magic;
  uint32_t step;
  uint64_t seq;
  uint64_t count;
  uint64_t aux;
  uint64_t bytes;
  int32_t root;
  uint8_t kind;
  uint8_t dtype;
  uint8_t redop;
  int8_t direction;
  uint8_t wire_bits;  // the compression the sender applies (0: exact)
  uint8_t reserved[7];
};
static_assert(sizeof(WireHeader) == 56, "WireHeader must have no padding");
constexpr uint32_t kMagic = 0x58435552;  // "RUCX"

inline WireHeader make_header(const OpDesc& d, uint32_t step, uint64_t bytes) {
  WireHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kMagic;
  h.step = step;
  h.seq = d.seq;
  h.count = d.count;
  h.aux = d.aux;
  h.bytes = bytes;
  h.root = d.root;
  h.kind = static_cast<uint8_t>(d.kind);
  h.dtype = static_cast<uint8_t>(d.dtype);
  h.redop = static_cast<uint8_t>(d.redop);
  h.direction = d.direction;
  h.wire_bits = d.wire_bits;
  return h;
}

// Every field make_header() sends, in OpDesc's order (on_device is not sent).
inline OpDesc header_desc(const WireHeader& h) {
  return OpDesc{.seq = h.seq,
                .count = h.count,
                .aux = h.aux,
                .root = h.root,
                .kind = static_cast<OpKind>(h.kind),
                .dtype = static_cast<DType>(h.dtype),
                .redop = static_cast<RedOp>(h.redop),
                .direction = h.direction,
                .wire_bits = h.wire_bits};
}

// What a receiver makes of a header message (the decoder the fuzz target
// tests/fuzz/fuzz_ucx_header.cpp feeds with lying headers).
struct HeaderVerdict {
  std::string error;             // empty: the header agrees with this rank's op
  bool payload_follows = false;  // a separate payload message comes (to receive, or drain)
  WireHeader hdr{};              // as received; zero past the end of a short message
};

// Checks the header message `msg` of `len` bytes from `who` against this rank's op
// (`expected`, `step`, and the `bytes` it posted to receive) and, when it agrees and carries
// its payload inline, copies that payload to `dst` (`bytes` long). Never reads past msg + len
// nor writes past dst + bytes, whatever the message says. `me_op` prefixes every error
// ("rsdp rank 0: allreduce: "), so that each names this rank, the op and the peer.
HeaderVerdict check_header(const void* msg, size_t len, const OpDesc& expected, uint32_t step,
                           uint64_t bytes, void* dst, const std::string& me_op,
                           const std::string& who);

// A failure notice on the wire (the notice tag; ucx_coll.h's note on the notice
// across nodes): its first offsetof(text) bytes, then `len` bytes of text.
struct NoticeMsg {
  uint32_t magic;
  int32_t origin;  // global rank that reported the failure
  uint32_t kind;   // its ErrorKind
  uint32_t len;
  char text[kNoticeTextBytes];
};
constexpr size_t kNoticeHead = offsetof(NoticeMsg, text);

// The failure a notice message of `len` bytes reports, as its receiver raises it. `from` names
// the sender (its tag says which group rank; `from_global` is that rank's global rank, or -1
// when the tag names no member) and `members` are the group's global ranks. A notice that is
// short, of another kind, or from an origin outside the group becomes a failure reported by
// its sender that says so; the text is cut to what arrived and made printable UTF-8 (it ends
// up in a Python exception).
Failure decode_notice(const void* msg, size_t len, const std::vector<int>& members,
                      int from_global, const std::string& from);

}  // namespace ucx_wire
}  // namespace rsdp
