// The shared-memory point-to-point rings (csrc/transport/shm/p2p_wire.h):
// counters and bytes another process wrote, perhaps half-way before it died,
// perhaps garbage. Drives ring_fill, read_header, ring_read and ring_write the
// way P2PEngine::progress_incoming and progress_send do (the receiver checks
// the counters, reads headers while whole ones are there, refuses one of the
// wrong magic or number, and takes a payload only into a posted receive of
// its exact size; the sender writes a header and as much payload as fits).
//
// Input: the ring's capacity (2 bytes: 1..4096), head and tail (8 bytes
// each), the channel's next message number (4), the size of the posted
// receive (2) and of a message to send (2), then the ring's bytes (the rest,
// zero past the end). The ring is a heap block of exactly its capacity and
// every receive buffer one of exactly its size: any copy past them is a
// sanitizer report. Checked: the counters the code accepts are at most a
// ring apart, and it never moves more than they allow.
//
// fuzz-sources: csrc/transport/shm/p2p_wire.cpp
#include <algorithm>
#include <memory>
#include <vector>

#include "fuzz_input.h"
#include "transport/shm/p2p_wire.h"

using namespace rsdp;
using p2p_wire::kHdr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const size_t cap = 1 + in.take<uint16_t>() % 4096;
  const uint64_t head0 = in.take<uint64_t>(), tail0 = in.take<uint64_t>();
  uint32_t seq = in.take<uint32_t>();
  const size_t posted = in.take<uint16_t>(), to_send = in.take<uint16_t>();
  std::unique_ptr<char[]> ring(new char[cap]());
  size_t got = 0;
  const uint8_t* bytes = in.bytes(cap, &got);
  std::memcpy(ring.get(), bytes, got);
  ChannelCtl ctl;
  ctl.head.store(head0);
  ctl.tail.store(tail0);
  const RingView v{&ctl, ring.get(), cap};

  // The receiver (progress_incoming).
  uint64_t tail = tail0;
  size_t fill = 0;
  if (p2p_wire::ring_fill(head0, tail, cap, &fill)) {
    FUZZ_CHECK(fill <= cap && head0 - tail0 == fill, "accepted counters more than a ring apart");
    for (int messages = 0; messages < 64; ++messages) {
      p2p_wire::MsgHeader h;
      const p2p_wire::Next next = p2p_wire::read_header(v, tail, fill, seq, &h);
      FUZZ_TRACE("fill %zu: %s\n", fill,
                 next == p2p_wire::Next::kWait     ? "wait"
                 : next == p2p_wire::Next::kHeader ? "header"
                                                   : "corrupt");
      if (next == p2p_wire::Next::kWait) {
        FUZZ_CHECK(fill < kHdr, "waits though a whole header is there");
        break;
      }
      if (next == p2p_wire::Next::kCorrupt) {
        FUZZ_CHECK(h.magic != p2p_wire::kMsgMagic || h.seq != seq, "refused a good header");
        break;
      }
      ++seq;
      tail += kHdr;
      fill -= kHdr;
      // A message of another size fails the receive and is stashed: the
      // engine allocates h.bytes then (and names the sender if it cannot), so
      // nothing is read here.
      if (h.bytes != posted) break;
      std::unique_ptr<char[]> dst(new char[posted]);
      const size_t n = std::min<size_t>(fill, posted);
      p2p_wire::ring_read(v, tail, dst.get(), n);
      tail += n;
      fill -= n;
      if (n < posted) break;  // the rest comes as the sender moves on
    }
  }

  FUZZ_TRACE("receiver: counters %s\n",
             p2p_wire::ring_fill(head0, tail0, cap, &fill) ? "accepted" : "refused");
  // The sender (progress_send): the tail is the receiver's word.
  const uint64_t head = head0;
  if (p2p_wire::ring_fill(head, tail0, cap, &fill)) {
    size_t room = cap - fill;
    FUZZ_CHECK(room <= cap, "more room than the ring has");
    if (room >= kHdr) {
      const p2p_wire::MsgHeader h{p2p_wire::kMsgMagic, seq, 7, to_send};
      p2p_wire::ring_write(v, head, &h, kHdr);
      room -= kHdr;
      std::vector<char> payload(to_send, 'x');
      const size_t n = std::min(room, payload.size());
      p2p_wire::ring_write(v, head + kHdr, payload.data(), n);
    }
  }
  return 0;
}
