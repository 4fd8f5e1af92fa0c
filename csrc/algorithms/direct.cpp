// One-copy collectives over the communication memory (transport/shm/shm_pool.h).
//
// When a rank's buffer lies in its pool, every peer of the node can read it
// where it lies. Each entry below first runs one exchange in which every rank
// posts where its buffer is (or that it is elsewhere). If every buffer the op
// reads was posted, the op runs directly:
//   allgather       each rank copies every peer's input into its output;
//   broadcast       every rank copies the root's buffer;
//   reduce_scatter  rank p reduces chunk p of every rank's input into its output;
//   allreduce       rank p reduces chunk p of every rank's buffer into its own
//                   chunk p; after an exchange each rank copies the others'
//                   reduced chunks from their owners;
// then a last exchange releases the buffers (a peer may still be reading
// until then). Bytes moved: one copy (or one reduction) of what each rank
// needs, against two copies through the staging halves.
//
// Otherwise the entry returns false and the caller runs its staging
// algorithm. The decision depends only on what every rank posted in the same
// step, so every rank makes the same one. The probe costs one synchronisation,
// so it runs only for messages large enough to hide it, and only where the
// group has pools (the same on every rank: the layout check at init compares
// them). All-reduce, which synchronises three times against the staging
// path's one or two, pays off from a larger size than the others.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/reduce_kernels.h"

namespace rsdp {
namespace algo {
namespace {

constexpr size_t kDirectMinBytes = 64u << 10;
constexpr size_t kDirectAllreduceMinBytes = 256u << 10;
// All-reduce works through the buffers in segments of this size, so that what
// one rank reduces is still cached when the others copy it.
constexpr size_t kSegmentBytes = 1u << 20;

bool worth_probing(const ShmComm& c, size_t bytes, size_t min_bytes = kDirectMinBytes) {
  return c.pool() && c.size() > 1 && bytes >= min_bytes;
}

// Post this rank's buffer and collect every peer's, or fail with empty.
// A rank that contributes nothing needs no buffer.
std::vector<const char*> probe(ShmComm& c, const void* mine, const uint64_t* bytes) {
  const int n = c.size(), me = c.rank();
  c.exchange(0, mine ? c.pool_offset(mine, bytes[me]) : kNotInPool);
  std::vector<const char*> at(n, nullptr);
  for (int p = 0; p < n; ++p) {
    if (bytes[p] == 0) continue;
    at[p] = c.posted(p, bytes[p]);
    if (!at[p]) return {};
  }
  return at;
}

}  // namespace

bool direct_allgather(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts,
                      DType dt) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  std::vector<uint64_t> bytes(n);
  size_t total = 0;
  for (int p = 0; p < n; ++p) total += bytes[p] = counts[p] * es;
  if (!worth_probing(c, total)) return false;
  auto at = probe(c, in, bytes.data());
  if (at.empty()) return false;
  if (outs[me] != in && bytes[me]) std::memcpy(outs[me], in, bytes[me]);
  // Start at the next rank so that ranks read different peers at a time.
  for (int i = 1; i < n; ++i) {
    const int p = (me + i) % n;
    if (bytes[p]) std::memcpy(outs[p], at[p], bytes[p]);
  }
  c.exchange(bytes[me]);
  c.count_one_copy();
  return true;
}

bool direct_broadcast(ShmComm& c, void* buf, size_t bytes, int root) {
  const int n = c.size(), me = c.rank();
  if (!worth_probing(c, bytes)) return false;
  std::vector<uint64_t> need(n, 0);
  need[root] = bytes;
  auto at = probe(c, me == root ? buf : nullptr, need.data());
  if (at.empty()) return false;
  if (me != root) std::memcpy(buf, at[root], bytes);
  c.exchange(me == root ? bytes : 0);
  c.count_one_copy();
  return true;
}

bool direct_reduce_scatter(ShmComm& c, const void* const* ins, void* out, const uint64_t* counts,
                           DType dt, RedOp op) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  // Peers find rank q's contribution to p at one posted base plus p's
  // offset, so only an input laid out as one buffer in rank order qualifies.
  std::vector<uint64_t> prefix(n + 1, 0);
  for (int p = 0; p < n; ++p) prefix[p + 1] = prefix[p] + counts[p];
  const size_t total = prefix[n] * es;
  if (!worth_probing(c, total)) return false;
  const char* base = static_cast<const char*>(ins[0]);
  bool one_buffer = true;
  for (int p = 0; p < n; ++p)
    if (counts[p] && static_cast<const char*>(ins[p]) != base + prefix[p] * es) one_buffer = false;
  std::vector<uint64_t> bytes(n, total);
  auto at = probe(c, one_buffer ? base : nullptr, bytes.data());
  if (at.empty()) return false;
  std::vector<const void*> srcs(n);
  for (int q = 0; q < n; ++q) srcs[q] = at[q] + prefix[me] * es;
  if (counts[me]) reduce_n(out, srcs.data(), n, counts[me], dt, op, n);
  c.exchange(total - counts[me] * es);
  c.count_one_copy();
  return true;
}

bool direct_allreduce(ShmComm& c, void* buf, size_t count, DType dt, RedOp op) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), bytes = count * es;
  if (!worth_probing(c, bytes, kDirectAllreduceMinBytes)) return false;
  std::vector<uint64_t> need(n, bytes);
  auto at = probe(c, buf, need.data());
  if (at.empty()) return false;
  // Segments of kSegmentBytes, cut into n slots that start on cache lines (no
  // two ranks write one line). Per segment: reduce this rank's slot, exchange,
  // copy the others' slots while they are still in the shared cache. Rank q
  // overwrites its copy of slot p of a segment only after the exchange that
  // follows p's reduction of it, so no read races a write.
  const size_t line = 64 / es ? 64 / es : 1;
  const size_t slot = std::max(line, kSegmentBytes / n / es / line * line);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> srcs(n);
  for (size_t base = 0; base < count; base += slot * n) {
    auto first = [&](int p) { return std::min(count, base + p * slot); };
    auto len = [&](int p) { return std::min(count, base + (p + 1) * slot) - first(p); };
    for (int q = 0; q < n; ++q) srcs[q] = at[q] + first(me) * es;
    if (len(me)) reduce_n(data + first(me) * es, srcs.data(), n, len(me), dt, op, n);
    c.exchange(len(me) * es);
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;
      if (len(p)) std::memcpy(data + first(p) * es, at[p] + first(p) * es, len(p) * es);
    }
  }
  c.exchange();
  c.count_one_copy();
  return true;
}

}  // namespace algo
}  // namespace rsdp
