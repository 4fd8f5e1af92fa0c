// A ring_shift hop whose cross-node half is block-quantised (contract in
// net_algorithms.h). The node-aware ring crosses each node boundary once per
// direction, so on most ranks both sides stay exact and only the boundary
// ranks quantise (the sender) or dequantise (the receiver). recv is written
// only after every piece has gone and come, so it may alias send (a rotation
// in place) and add.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/net/net_algorithms.h"

namespace rsdp {
namespace net {

void ring_shift_quantized(NetComm& c, int send_to, int recv_from, bool send_remote,
                          bool recv_remote, const void* send, void* recv, size_t count, DType dt,
                          const void* add, QuantBits bits, size_t block, float* residual,
                          uint32_t& step) {
  const size_t raw = count * dtype_size(dt), qbytes = quant_bytes(count, bits, block);
  std::vector<uint8_t> out_stage;
  const char* out_bytes = static_cast<const char*>(send);
  size_t out_n = raw;
  if (send_remote) {
    out_stage.resize(qbytes);
    quantize_feedback(send, dt, count, bits, block, residual, out_stage.data());
    out_bytes = reinterpret_cast<const char*>(out_stage.data());
    out_n = qbytes;
  }
  const size_t in_n = recv_remote ? qbytes : raw;
  std::vector<uint8_t> in_stage(in_n);
  // Pieces of each direction numbered alike on both ends of its link.
  const size_t pieces = std::max<size_t>(1, (std::max(out_n, in_n) + kPieceBytes - 1) /
                                                kPieceBytes);
  for (size_t i = 0; i < pieces; ++i) {
    const size_t off = i * kPieceBytes;
    if (off < out_n || (i == 0 && out_n == 0))
      c.isend(send_to, out_bytes + off, std::min(kPieceBytes, out_n - std::min(off, out_n)),
              step + static_cast<uint32_t>(i));
    if (off < in_n || (i == 0 && in_n == 0))
      c.irecv(recv_from, in_stage.data() + off, std::min(kPieceBytes, in_n - std::min(off, in_n)),
              step + static_cast<uint32_t>(i));
    c.wait();
  }
  step += static_cast<uint32_t>(pieces);
  if (count == 0) return;
  if (!recv_remote) {
    if (!add) {
      std::memcpy(recv, in_stage.data(), raw);
      return;
    }
    std::vector<float> acc(count, 0.f);
    add_widened(in_stage.data(), dt, count, acc.data());
    add_widened(add, dt, count, acc.data());
    return store_narrowed(acc.data(), count, dt, recv);
  }
  if (!add) return dequantize(in_stage.data(), count, bits, block, dt, recv);
  std::vector<float> acc(count, 0.f);
  add_widened(add, dt, count, acc.data());
  dequantize_add(in_stage.data(), count, bits, block, acc.data());
  store_narrowed(acc.data(), count, dt, recv);
}

}  // namespace net
}  // namespace rsdp
