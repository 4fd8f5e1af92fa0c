// Rooted and all-pairs algorithms over the network.
//
// broadcast / reduce: binomial trees on ranks relative to the root
// (v = (position - root) mod K). In round r a rank whose bit r is set talks
// to v - 2^r, so the root's data reaches (or the sum reaches the root from)
// all K members in ceil(log2 K) rounds; every rank sends at most once.
// barrier: dissemination, ceil(log2 K) rounds of empty messages.
// gather / scatter / alltoall: the root (or every rank) posts all its
// messages at once and lets the transport overlap them.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/net/net_algorithms.h"
#include "core/error.h"
#include "core/reduce_kernels.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace net {
namespace {
int mod(int a, int k) { return ((a % k) + k) % k; }
}  // namespace

void broadcast_tree(NetComm& c, const std::vector<int>& members, void* buf, size_t bytes,
                    int root, uint32_t& step) {
  const int k = static_cast<int>(members.size());
  const int v = mod(position(members, c.rank()) - root, k);
  auto member = [&](int rel) { return members[(rel + root) % k]; };
  int mask = 1;
  while (mask < k) {
    if (v & mask) {
      c.irecv(member(v - mask), buf, bytes, step);
      c.wait();
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < k) c.isend(member(v + mask), buf, bytes, step);
  c.wait();
  ++step;
}

void reduce_tree(NetComm& c, const std::vector<int>& members, void* buf, size_t count, DType dt,
                 RedOp op, int root, int divisor, uint32_t& step) {
  const int k = static_cast<int>(members.size());
  const int v = mod(position(members, c.rank()) - root, k);
  auto member = [&](int rel) { return members[(rel + root) % k]; };
  const bool avg = op == RedOp::kAvg;
  const RedOp step_op = avg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  const size_t buf_elems = std::min(piece, count);
  std::vector<char> own(v == 0 ? 0 : buf_elems * es), tmp(buf_elems * es);
  char* data = static_cast<char*>(buf);
  size_t off = 0;
  do {
    const size_t len = clip(count, off, piece);
    // The root accumulates in place; the others in a copy (their buffers
    // are inputs only).
    char* acc = v == 0 ? data + off * es : own.data();
    if (v != 0 && len) std::memcpy(acc, data + off * es, len * es);
    for (int mask = 1; mask < k; mask <<= 1) {
      if (v & mask) {
        c.isend(member(v - mask), acc, len * es, step);
        c.wait();
        break;
      }
      if ((v | mask) < k) {
        c.irecv(member(v | mask), tmp.data(), len * es, step);
        c.wait();
        const void* srcs[2] = {acc, tmp.data()};
        if (len) reduce_n(acc, srcs, 2, len, dt, step_op, 1);
      }
    }
    ++step;
    if (v == 0 && avg && len) {
      const void* srcs[1] = {acc};
      reduce_n(acc, srcs, 1, len, dt, RedOp::kAvg, divisor);
    }
    off += piece;
  } while (off < count);
}

void barrier(NetComm& c, const std::vector<int>& members, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  for (int d = 1; d < k; d <<= 1) {
    c.isend(members[(i + d) % k], nullptr, 0, step);
    c.irecv(members[mod(i - d, k)], nullptr, 0, step);
    ++step;
    c.wait();
  }
}

void gather_linear(NetComm& c, const std::vector<int>& members, const void* in,
                   void* const* outs, size_t bytes, int root, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  if (i == root) {
    for (int p = 0; p < k; ++p)
      if (p != i) c.irecv(members[p], outs[p], bytes, step);
    if (bytes && outs[i] != in) std::memcpy(outs[i], in, bytes);
  } else {
    c.isend(members[root], in, bytes, step);
  }
  ++step;
  c.wait();
}

void scatter_linear(NetComm& c, const std::vector<int>& members, const void* const* ins,
                    void* out, size_t bytes, int root, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  if (i == root) {
    for (int p = 0; p < k; ++p)
      if (p != i) c.isend(members[p], ins[p], bytes, step);
    if (bytes && ins[i] != out) std::memcpy(out, ins[i], bytes);
  } else {
    c.irecv(members[root], out, bytes, step);
  }
  ++step;
  c.wait();
}

void alltoall_pairwise(NetComm& c, const std::vector<int>& members, const void* const* sends,
                       const uint64_t* send_bytes, void* const* recvs, const uint64_t* recv_bytes,
                       uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  // Post in ring order starting at the neighbour, so peers do not all
  // target the same rank first.
  for (int d = 1; d < k; ++d) {
    const int to = (i + d) % k, from = mod(i - d, k);
    c.irecv(members[from], recvs[from], recv_bytes[from], step);
    c.isend(members[to], sends[to], send_bytes[to], step);
  }
  RSDP_CHECK_KIND(ErrorKind::kMismatch, send_bytes[i] == recv_bytes[i], c.group().me(),
                  ": alltoall size mismatch: this rank sends ", send_bytes[i],
                  " bytes to itself but expects ", recv_bytes[i]);
  if (send_bytes[i] && recvs[i] != sends[i]) std::memcpy(recvs[i], sends[i], send_bytes[i]);
  ++step;
  c.wait();
}

}  // namespace net
}  // namespace rsdp
