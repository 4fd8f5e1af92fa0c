// The table of collective algorithms: the rows of algorithms.def, read here
// by selection (select.cpp), the RSDP_ALGO_<OP> parsing (core/options.cpp)
// and the dispatch (collectives.cpp).
//
// Adding an algorithm:
//   1. Write it in its own file(s) (setup.py finds them) with an entry point
//      `void coll::run_<name>(const CollArgs& a)` serving its ops (switch on
//      a.op). Across nodes the dispatch has begun the op on the network; on
//      one node the algorithm begins it on the ShmComm (OpDesc::make()).
//      If a forced choice does not fit every group, also write
//      `bool coll::<name>_applies(const Choice& c)` (else: applies_always).
//   2. Add its row to algorithms.def. The Algo id, the name in logs and in
//      RSDP_ALGO_<OP> (and that variable's error message) and the dispatch
//      follow from the row.
//   Only for it to be chosen without RSDP_ALGO_<OP>: the automatic policy
//   in select.cpp.
//
// This header needs only core types, so that core/options.cpp (also built
// alone by the C++ transport test) can read the names without the entry
// points; those are bound in algorithm_table.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/op_desc.h"
#include "core/quantize.h"
#include "core/reduce_op.h"

namespace rsdp {

struct GroupComm;
struct Options;
struct Topology;

constexpr uint32_t op_bit(OpKind k) { return 1u << static_cast<unsigned>(k); }
template <typename... K>
constexpr uint32_t op_set(K... kinds) {
  return (0u | ... | op_bit(kinds));
}

enum class Where : uint8_t { kOneNode, kSeveralNodes };
enum class Memory : uint8_t { kHost, kHostOrDevice };

class Staging;

enum class Algo : uint8_t {
#define RSDP_ALGORITHM(id, ...) id,
#include "algorithms/algorithms.def"
#undef RSDP_ALGORITHM
};

struct AlgoInfo {
  Algo id;
  const char* name;
  Where where;
  Memory memory;
  uint32_t ops;  // op_bit()s
  bool forceable;
  bool serves(OpKind op) const { return (ops & op_bit(op)) != 0; }
};

inline constexpr AlgoInfo kAlgos[] = {
#define RSDP_ALGORITHM(id, name, where, memory, ops, forceable, ...) \
  {Algo::id, name, Where::where, Memory::memory, ops, forceable},
#include "algorithms/algorithms.def"
#undef RSDP_ALGORITHM
};
inline constexpr int kNumAlgos = sizeof(kAlgos) / sizeof(kAlgos[0]);

inline const AlgoInfo& algo_info(Algo a) { return kAlgos[static_cast<int>(a)]; }
inline const char* algo_name(Algo a) { return algo_info(a).name; }

// The forceable algorithm of `op` called `name`, or null ("auto", or a name
// that does not serve the op).
inline const AlgoInfo* find_algo(OpKind op, const std::string& name) {
  for (const AlgoInfo& a : kAlgos)
    if (a.forceable && a.serves(op) && name == a.name) return &a;
  return nullptr;
}

// The names RSDP_ALGO_<OP> accepts besides "auto", space-separated in row
// order; empty when fewer than two forceable algorithms serve the op (there
// is nothing to choose, and no such variable).
inline std::string algo_choices(OpKind op) {
  std::string names;
  int n = 0;
  for (const AlgoInfo& a : kAlgos) {
    if (!a.forceable || !a.serves(op)) continue;
    names += n++ ? " " : "";
    names += a.name;
  }
  return n >= 2 ? names : std::string();
}

// One collective's arguments, as collectives.h takes them, for the entry
// points. Only the fields of `op` are set; arrays are indexed by group rank.
struct CollArgs {
  GroupComm& g;
  OpKind op;
  std::chrono::milliseconds timeout;
  DType dt = DType::kUInt8;
  size_t count = 0;                   // elements: the buffer, or each rank's (gather, scatter)
  const uint64_t* counts = nullptr;   // allgather, reduce_scatter: elements per rank
  RedOp redop = RedOp::kSum;
  int root = -1;
  void* buf = nullptr;                // broadcast, allreduce, reduce: in place
  const void* in = nullptr;           // allgather, gather
  void* const* outs = nullptr;        // allgather, gather (root)
  const void* const* ins = nullptr;   // reduce_scatter, scatter (root)
  void* out = nullptr;                // reduce_scatter, scatter
  float* const* residual = nullptr;   // reduce_scatter: error feedback (collectives.h)
  const void* const* sends = nullptr; // alltoall
  const uint64_t* send_bytes = nullptr;
  void* const* recvs = nullptr;
  const uint64_t* recv_bytes = nullptr;
  // Across nodes: block-quantised between nodes (set by the dispatch).
  QuantBits bits = QuantBits::kNone;
  // The staging transport of the single-node rows: the group's shared
  // memory when null, else a device's (coll::run_on_device).
  Staging* node = nullptr;
};

// What a choice depends on; `bytes` is the op's total payload, `half_bytes`
// the staging half of the transport the single-node rows would run on.
struct Choice {
  OpKind op;
  size_t bytes;
  const Topology& topo;
  const Options& opts;
  size_t half_bytes;
  Where where;       // where the op runs: a node stage is kOneNode in any group
  bool device;       // the buffers are device memory
};

// The entry points the rows name, defined in each algorithm's own file
// (algorithm_entries.cpp: those of the shared-memory, hierarchical and flat
// network algorithms).
namespace coll {
#define RSDP_ALGORITHM(id, name, where, memory, ops, forceable, applies, run) \
  bool applies(const Choice& c);                                              \
  void run(const CollArgs& a);
#include "algorithms/algorithms.def"
#undef RSDP_ALGORITHM
}  // namespace coll

struct AlgoEntry {
  bool (*applies)(const Choice&);
  void (*run)(const CollArgs&);
};

// The entry points of `a` (algorithm_table.cpp).
const AlgoEntry& algo_entry(Algo a);

}  // namespace rsdp
