// The framing of the point-to-point rings (p2p_engine.h): each ordered pair
// of ranks has a byte ring in shared memory, written by the sender (head) and
// consumed by the receiver (tail), carrying messages of a 24-byte header
// {magic, seq, tag, bytes} and then `bytes` of payload.
//
// Both counters and every byte of the ring are written by another process,
// which may have died half-way or scribbled over them. So the engine reads
// them only through these functions, which bound every copy by the ring's
// capacity and refuse counters that cannot be right, and
// tests/fuzz/fuzz_shm_ring.cpp feeds them lying counters and headers. No
// process state here: this compiles alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/shm/shm_layout.h"

namespace rsdp {

// One ring: its control block (head, tail) and its `cap` data bytes.
struct RingView {
  ChannelCtl* ctl;
  char* data;
  size_t cap;
};

namespace p2p_wire {

struct MsgHeader {
  uint32_t magic;  // catches a stream that lost its framing
  uint32_t seq;    // per-channel message number, likewise
  int64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(MsgHeader) == 24, "MsgHeader must have no padding");
constexpr uint32_t kMsgMagic = 0x52534450;  // "RSDP"
constexpr size_t kHdr = sizeof(MsgHeader);

// The bytes written and not yet consumed, head - tail; false when that cannot
// be (head behind tail, or more than `cap` ahead of it: a copy of that many
// bytes would run past the ring).
bool ring_fill(uint64_t head, uint64_t tail, size_t cap, size_t* fill);

// Copy n <= cap bytes at stream position `pos` into / out of the ring (which
// wraps): the caller has checked n against ring_fill().
void ring_write(const RingView& v, uint64_t pos, const void* src, size_t n);
void ring_read(const RingView& v, uint64_t pos, void* dst, size_t n);

enum class Next {
  kWait,     // no whole header has arrived yet
  kHeader,   // *h is the next message's header
  kCorrupt,  // the stream lost its framing (wrong magic or message number)
};
// The header at `tail` of a ring holding `fill` bytes (ring_fill), which must
// be message number `seq` of the channel.
Next read_header(const RingView& v, uint64_t tail, size_t fill, uint32_t seq, MsgHeader* h);

}  // namespace p2p_wire
}  // namespace rsdp
