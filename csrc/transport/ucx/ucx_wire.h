// What NetComm puts on the wire: the 64-bit UCX tags and the header that
// every collective message carries. Kept apart from the code that uses them
// so that the layout can be read (and checked against the brief) in one place.
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
// a copying protocol: measured over UCX_TLS=tcp on loopback, 8 MiB took 6.6 ms
// one-way with IOV against 2.3 ms for header + contiguous payload (the same as
// the payload alone); up to 16 KiB IOV and contiguous cost the same (~6 us),
// while two messages cost ~13 us. So small payloads ride inside the header
// message and large ones follow it. The receiver posts the payload receive
// only after it has checked the header, so it never receives a payload whose
// size or op it did not agree to.
#pragma once

#include <cstdint>
#include <cstring>

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

}  // namespace ucx_wire
}  // namespace rsdp
