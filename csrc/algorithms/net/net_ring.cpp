// Ring algorithms over the network: allreduce, all-gather, reduce-scatter.
//
// With K members in a ring each rank sends to its successor and receives
// from its predecessor in every step, so every link of the ring is busy at
// once and each rank sends exactly the bandwidth-optimal amount:
//   all-gather      (K-1) blocks
//   reduce-scatter  (K-1) blocks
//   allreduce       2(K-1)/K of the buffer (reduce-scatter + all-gather)
// Reducing steps work on pieces of at most kPieceBytes per chunk, so the
// temporary buffers stay small whatever the message size.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/net/net_algorithms.h"
#include "core/error.h"
#include "core/reduce_kernels.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace net {

int position(const std::vector<int>& members, int rank) {
  auto it = std::find(members.begin(), members.end(), rank);
  RSDP_CHECK_KIND(ErrorKind::kSystem, it != members.end(), "rsdp: rank ", rank,
                  " is not a member of the algorithm's rank list");
  return static_cast<int>(it - members.begin());
}

namespace {

int mod(int a, int k) { return ((a % k) + k) % k; }

// Chunk j of K when `total` elements are split as evenly as possible.
size_t chunk_off(size_t total, int k, int j) {
  return j * (total / k) + std::min<size_t>(j, total % k);
}
size_t chunk_len(size_t total, int k, int j) { return total / k + (static_cast<size_t>(j) < total % k); }

void divide(void* p, size_t count, DType dt, int divisor) {
  const void* src[1] = {p};
  if (count) reduce_n(p, src, 1, count, dt, RedOp::kAvg, divisor);
}

}  // namespace

void allreduce_ring(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                    DType dt, RedOp op, int divisor, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  const bool avg = op == RedOp::kAvg;
  const RedOp step_op = avg ? RedOp::kSum : op;
  if (k == 1) {
    if (avg) divide(buf, count, dt, divisor);
    return;
  }
  const int next = members[(i + 1) % k], prev = members[mod(i - 1, k)];
  const size_t es = dtype_size(dt);
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  std::vector<char> tmp(std::min(piece, count / k + 1) * es);
  char* data = static_cast<char*>(buf);
  size_t base = 0;
  do {
    const size_t seg = clip(count, base, piece * k);
    auto at = [&](int j) { return data + (base + chunk_off(seg, k, j)) * es; };
    auto len = [&](int j) { return chunk_len(seg, k, j); };
    // Reduce-scatter: after K-1 steps chunk (i+1) mod K is complete here.
    for (int s = 0; s < k - 1; ++s) {
      const int sb = mod(i - s, k), rb = mod(i - s - 1, k);
      c.isend(next, at(sb), len(sb) * es, step);
      c.irecv(prev, tmp.data(), len(rb) * es, step);
      ++step;
      c.wait();
      const void* srcs[2] = {at(rb), tmp.data()};
      if (len(rb)) reduce_n(at(rb), srcs, 2, len(rb), dt, step_op, 1);
    }
    const int owned = mod(i + 1, k);
    if (avg) divide(at(owned), len(owned), dt, divisor);
    // All-gather the complete chunks.
    for (int s = 0; s < k - 1; ++s) {
      const int sb = mod(i + 1 - s, k), rb = mod(i - s, k);
      c.isend(next, at(sb), len(sb) * es, step);
      c.irecv(prev, at(rb), len(rb) * es, step);
      ++step;
      c.wait();
    }
    base += piece * k;
  } while (base < count);
}

void allgather_ring(NetComm& c, const std::vector<int>& members, const void* in,
                    void* const* outs, const uint64_t* counts, DType dt, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  const size_t es = dtype_size(dt);
  if (counts[i] && outs[i] != in) std::memcpy(outs[i], in, counts[i] * es);
  const int next = members[(i + 1) % k], prev = members[mod(i - 1, k)];
  for (int s = 0; s < k - 1; ++s) {
    const int sb = mod(i - s, k), rb = mod(i - s - 1, k);
    c.isend(next, outs[sb], counts[sb] * es, step);
    c.irecv(prev, outs[rb], counts[rb] * es, step);
    ++step;
    c.wait();
  }
}

void reduce_scatter_ring(NetComm& c, const std::vector<int>& members, const void* const* ins,
                         void* out, const uint64_t* counts, DType dt, RedOp op, int divisor,
                         uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  const size_t es = dtype_size(dt);
  const bool avg = op == RedOp::kAvg;
  const RedOp step_op = avg ? RedOp::kSum : op;
  char* dst = static_cast<char*>(out);
  if (k == 1) {
    if (counts[0] && ins[0] != out) std::memmove(out, ins[0], counts[0] * es);
    if (avg) divide(out, counts[0], dt, divisor);
    return;
  }
  const int next = members[(i + 1) % k], prev = members[mod(i - 1, k)];
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  uint64_t most = 0;
  for (int j = 0; j < k; ++j) most = std::max(most, counts[j]);
  const size_t buf_elems = std::min<size_t>(piece, most);
  std::vector<char> acc(buf_elems * es), tmp(buf_elems * es);
  auto in_at = [&](int b, size_t off) { return static_cast<const char*>(ins[b]) + off * es; };
  size_t off = 0;
  do {
    auto len = [&](int b) { return clip(counts[b], off, piece); };
    // Step s: pass on the partial sum of block (i-s-1), receive that of
    // block (i-s-2) and add this rank's contribution; the last block
    // received is this rank's own, complete.
    for (int s = 0; s < k - 1; ++s) {
      const int sb = mod(i - s - 1, k), rb = mod(i - s - 2, k);
      const char* src = s == 0 ? in_at(sb, off) : acc.data();
      c.isend(next, src, len(sb) * es, step);
      c.irecv(prev, tmp.data(), len(rb) * es, step);
      ++step;
      c.wait();
      char* into = s == k - 2 ? dst + off * es : acc.data();
      const void* srcs[2] = {in_at(rb, off), tmp.data()};
      if (len(rb)) reduce_n(into, srcs, 2, len(rb), dt, step_op, 1);
    }
    if (avg) divide(dst + off * es, len(i), dt, divisor);
    off += piece;
  } while (off < most);
}

}  // namespace net
}  // namespace rsdp
