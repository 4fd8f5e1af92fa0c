// Recursive halving + doubling allreduce over the network (Rabenseifner's):
// for mid-sized messages on many members, where a ring's 2(K-1) rounds cost
// more than its bytes.
//
// With K a power of two the buffer is split into K blocks. Reduce-scatter by
// recursive halving: in round r (mask K/2, K/4, ..., 1) a member and the one
// whose position differs in that bit share a range of 2*mask blocks; each
// sends the half the other keeps and reduces the half it keeps, so after
// log2(K) rounds member j holds block j complete. All-gather by recursive
// doubling walks the masks back up, each round exchanging the ranges held.
// That is 2 log2(K) rounds, and each member sends 2(K-1)/K of the buffer,
// as on a ring. Other K: the first 2*rem members (rem = K - largest power of
// two) pair up first, the even one handing its buffer to the odd one and
// sitting out until the odd one hands the result back (MPICH's scheme, as
// in net_recursive_doubling.cpp).
//
// Each block's final reduction happens on one member only, which then hands
// it out unchanged, so every member ends bit-identical whatever the order
// the partial sums met in. Segments of at most kPieceBytes bound the
// temporary buffer; empty blocks send nothing (both ends know the sizes).
#include <algorithm>
#include <vector>

#include "algorithms/net/net_algorithms.h"
#include "core/reduce_kernels.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace net {
namespace {

// Start of block j of K when `total` elements are split as evenly as possible
// (as the ring splits its chunks).
size_t block_off(size_t total, int k, int j) {
  return j * (total / k) + std::min<size_t>(j, total % k);
}

}  // namespace

void allreduce_rhd(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                   DType dt, RedOp op, int divisor, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  const bool avg = op == RedOp::kAvg;
  const RedOp step_op = avg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  auto divide = [&](char* p, size_t n) {
    const void* src[1] = {p};
    if (n) reduce_n(p, src, 1, n, dt, RedOp::kAvg, divisor);
  };
  if (k == 1) {
    if (avg) divide(static_cast<char*>(buf), count);
    return;
  }
  int p2 = 1;
  while (p2 * 2 <= k) p2 *= 2;
  const int rem = k - p2;
  // Position among the p2 active members, -1 for those that sit out.
  const int me = i >= 2 * rem ? i - rem : (i % 2 ? i / 2 : -1);
  auto real = [&](int v) { return members[v < rem ? 2 * v + 1 : v + rem]; };
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  std::vector<char> tmp(std::min(piece, count) * es);
  char* data = static_cast<char*>(buf);
  // Sends send_n elements to `peer` and receives recv_n from it into `into`
  // (tmp, or the blocks' own place in the segment), in one step.
  auto exchange = [&](int peer, const char* send, size_t send_n, char* into, size_t recv_n) {
    if (send_n) c.isend(peer, send, send_n * es, step);
    if (recv_n) c.irecv(peer, into, recv_n * es, step);
    if (send_n || recv_n) c.wait();
  };
  auto combine = [&](char* dst, size_t n) {
    const void* srcs[2] = {dst, tmp.data()};
    if (n) reduce_n(dst, srcs, 2, n, dt, step_op, 1);
  };
  size_t base = 0;
  while (base < count) {
    const size_t seg = clip(count, base, piece);
    char* s = data + base * es;
    auto off = [&](int j) { return block_off(seg, p2, j); };
    auto at = [&](int j) { return s + off(j) * es; };
    // Fold the extra members in: the even one of each pair hands its
    // segment to the odd one.
    if (i < 2 * rem) {
      if (i % 2 == 0) {
        exchange(members[i + 1], s, seg, nullptr, 0);
      } else {
        exchange(members[i - 1], nullptr, 0, tmp.data(), seg);
        combine(s, seg);
      }
    }
    ++step;
    // Reduce-scatter by recursive halving: [lo, hi) are the blocks this
    // member still reduces.
    int lo = 0, hi = p2;
    for (int mask = p2 / 2; mask >= 1; mask /= 2, ++step) {
      if (me < 0) continue;  // keeps `step` in line with the active members
      const int mid = lo + mask;
      const bool upper = (me & mask) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int send_lo = upper ? lo : mid, send_hi = upper ? mid : hi;
      const size_t keep_n = off(keep_hi) - off(keep_lo);
      exchange(real(me ^ mask), at(send_lo), off(send_hi) - off(send_lo), tmp.data(), keep_n);
      combine(at(keep_lo), keep_n);
      lo = keep_lo;
      hi = keep_hi;
    }
    // Block `me` is complete here and nowhere else.
    if (avg && me >= 0) divide(at(me), off(me + 1) - off(me));
    // All-gather by recursive doubling: this member holds [lo, lo + mask).
    for (int mask = 1; mask < p2; mask *= 2, ++step) {
      if (me < 0) continue;
      const int peer_lo = lo ^ mask;
      exchange(real(me ^ mask), at(lo), off(lo + mask) - off(lo), at(peer_lo),
               off(peer_lo + mask) - off(peer_lo));
      lo = std::min(lo, peer_lo);
    }
    // Hand the result back to the members that sat out.
    if (i < 2 * rem) {
      if (i % 2)
        exchange(members[i - 1], s, seg, nullptr, 0);
      else
        exchange(members[i + 1], nullptr, 0, s, seg);
    }
    ++step;
    base += piece;
  }
}

}  // namespace net
}  // namespace rsdp
