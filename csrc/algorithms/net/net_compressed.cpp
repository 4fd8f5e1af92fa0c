// Compressed collectives over the network (contracts in net_algorithms.h).
#include <algorithm>
#include <vector>

#include "algorithms/net/net_algorithms.h"

namespace rsdp {
namespace net {

void allgather_quantized(NetComm& c, const std::vector<int>& members, const void* in,
                         void* const* outs, const uint64_t* counts, DType dt, QuantBits bits,
                         size_t block, uint32_t& step) {
  const int k = static_cast<int>(members.size()), me = position(members, c.rank());
  std::vector<std::vector<uint8_t>> q(k);
  std::vector<void*> qouts(k);
  std::vector<uint64_t> qcounts(k);
  for (int i = 0; i < k; ++i) {
    qcounts[i] = quant_bytes(counts[i], bits, block);
    q[i].resize(qcounts[i]);
    qouts[i] = q[i].data();
  }
  quantize(in, dt, counts[me], bits, block, qouts[me]);
  allgather_ring(c, members, qouts[me], qouts.data(), qcounts.data(), DType::kUInt8, step);
  for (int i = 0; i < k; ++i) dequantize(qouts[i], counts[i], bits, block, dt, outs[i]);
}

void reduce_scatter_quantized(NetComm& c, const std::vector<int>& members,
                              const void* const* ins, void* out, const uint64_t* counts, DType dt,
                              RedOp op, int divisor, QuantBits bits, size_t block,
                              uint32_t& step, float* const* residuals) {
  const int k = static_cast<int>(members.size()), me = position(members, c.rank());
  const size_t mine = counts[me];
  std::vector<std::vector<uint8_t>> sendq(k), recvq(k);
  std::vector<const void*> sends(k, nullptr);
  std::vector<void*> recvs(k, nullptr);
  std::vector<uint64_t> send_bytes(k, 0), recv_bytes(k, 0);
  for (int i = 0; i < k; ++i) {
    if (i == me) continue;
    sendq[i].resize(quant_bytes(counts[i], bits, block));
    quantize_feedback(ins[i], dt, counts[i], bits, block, residuals ? residuals[i] : nullptr,
                      sendq[i].data());
    sends[i] = sendq[i].data();
    send_bytes[i] = sendq[i].size();
    recvq[i].resize(quant_bytes(mine, bits, block));
    recvs[i] = recvq[i].data();
    recv_bytes[i] = recvq[i].size();
  }
  alltoall_pairwise(c, members, sends.data(), send_bytes.data(), recvs.data(), recv_bytes.data(),
                    step);
  // Sum in member order, in float32, this member's own part exactly.
  std::vector<float> acc(mine, 0.f);
  for (int i = 0; i < k; ++i) {
    if (i != me) dequantize_add(recvs[i], mine, bits, block, acc.data());
    else add_widened(ins[me], dt, mine, acc.data());
  }
  if (op == RedOp::kAvg)
    for (auto& v : acc) v /= static_cast<float>(divisor);
  store_narrowed(acc.data(), mine, dt, out);
}

void allreduce_quantized(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                         DType dt, RedOp op, int divisor, QuantBits bits_rs, QuantBits bits_ag,
                         size_t block, uint32_t& step) {
  const int k = static_cast<int>(members.size()), me = position(members, c.rank());
  const size_t es = dtype_size(dt);
  std::vector<uint64_t> counts(k);
  std::vector<const void*> ins(k);
  std::vector<void*> outs(k);
  size_t off = 0;
  for (int i = 0; i < k; ++i) {
    counts[i] = count / k + (static_cast<size_t>(i) < count % k);
    outs[i] = static_cast<char*>(buf) + off * es;
    ins[i] = outs[i];
    off += counts[i];
  }
  std::vector<char> mine(counts[me] * es);
  reduce_scatter_quantized(c, members, ins.data(), mine.data(), counts.data(), dt, op, divisor,
                           bits_rs, block, step);
  allgather_quantized(c, members, mine.data(), outs.data(), counts.data(), dt, bits_ag, block,
                      step);
}

}  // namespace net
}  // namespace rsdp
