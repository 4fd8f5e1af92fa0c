// See p2p_wire.h.
#include "transport/shm/p2p_wire.h"

#include <algorithm>
#include <cstring>

namespace rsdp {
namespace p2p_wire {

bool ring_fill(uint64_t head, uint64_t tail, size_t cap, size_t* fill) {
  // Unsigned: a head behind tail wraps to a huge difference, caught alike.
  const uint64_t d = head - tail;
  if (d > cap) return false;
  *fill = static_cast<size_t>(d);
  return true;
}

void ring_write(const RingView& v, uint64_t pos, const void* src, size_t n) {
  if (n == 0) return;  // src may be null then (an empty tensor)
  const size_t off = pos % v.cap, first = std::min(n, v.cap - off);
  std::memcpy(v.data + off, src, first);
  std::memcpy(v.data, static_cast<const char*>(src) + first, n - first);
}

void ring_read(const RingView& v, uint64_t pos, void* dst, size_t n) {
  if (n == 0) return;
  const size_t off = pos % v.cap, first = std::min(n, v.cap - off);
  std::memcpy(dst, v.data + off, first);
  std::memcpy(static_cast<char*>(dst) + first, v.data, n - first);
}

Next read_header(const RingView& v, uint64_t tail, size_t fill, uint32_t seq, MsgHeader* h) {
  if (fill < kHdr) return Next::kWait;
  ring_read(v, tail, h, kHdr);
  return h->magic == kMsgMagic && h->seq == seq ? Next::kHeader : Next::kCorrupt;
}

}  // namespace p2p_wire
}  // namespace rsdp
