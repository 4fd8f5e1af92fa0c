// Records that other processes leave for this one: the values every rank
// publishes through the rendezvous store (core/bootstrap.h) and the header of
// the shared-memory segment group rank 0 creates. Each is encoded and decoded
// here and nowhere else, because a peer may be broken, of another version, of
// another job, or hostile (docs/architecture.md, Records a peer leaves; the
// attacks the tests make: docs/reliability.md): a decoder checks length,
// separators, numeric ranges, the writer's rank and the version tag, and
// returns what was wrong instead of throwing or reading past the value.
//
// Text records (one line, fields separated by '|'):
//
//   peer     rsdp1|peer|<rank>|<pid>|<node id>              core/group.cpp
//   peers    rsdp1|peers|0|<size>|<m>|<len>|<node id>|... (m node ids, each after
//            its length)|<pid>.<node index>,... (size entries, by group rank)
//            or rsdp1|peers|0|fail|timeout|<text>  or  ...|fail|error|<text>
//                                                           core/group.cpp (rank 0)
//   shm      rsdp1|shm|0|/rsdp-<16 hex>                     transport/shm
//   emu      rsdp1|emu|<rank>|/rsdp-<16 hex>                transport/emu
//   ucx      rsdp1|ucx|<rank>|<n>|<2n hex>|<m>|<2m hex>     transport/ucx (collective,
//                                                           point-to-point worker)
//   nccl     rsdp1|nccl|<rank>|<256 hex>                    transport/nccl (unique id)
//   gpu      rsdp1|gpu|<rank>|<PCI bus id>                  algorithms/cuda
//   verdict  rsdp1|verdict|0|ok  or  rsdp1|verdict|0|fail|<text>
//                                                           monitored_barrier (rank 0)
//
// <rank> is the writer's group rank: a record under another rank's key (a
// stale or copied value) is refused. Numbers are decimal without sign or
// leading zeros, hex is lower case, so that decode(encode(x)) == x and
// encode(decode(v)) == v for every valid v (the fuzz target checks both).
//
// Binary records (fixed layouts, a magic and a version): the CUDA-IPC record
// (transport/cuda_ipc) and the segment header (transport/shm/shm_layout.h).
//
// "Flag" keys (shm/attached/<r>, emu/mapped/<r>, cuda-ipc-closed/<r>,
// monitored_barrier/<n>/arrived/<r>) count by their existence only; their
// values are never read.
//
// No torch, UCX or CUDA headers: this compiles alone (tests/native,
// tests/fuzz/fuzz_store_records.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rsdp {
namespace records {

// Who a record should come from, for the checks and for the error text.
struct From {
  std::string key;  // the store key (or the segment's name)
  int rank = -1;    // the writer's group rank, as the key says
  std::string who;  // the writer as errors name it: "rank 3 (group rank 1)"
};

// Every decode_* returns "" when the value is a valid record, else a sentence
// naming the record, the key, the writer and what was wrong, e.g.
//   "malformed peer record from rank 1 (store key 'rsdp/2/0/peer/1'): the pid
//    'x1' is not a number (value 'rsdp1|peer|1|x1|n', 17 bytes)".
// The caller prefixes its rank, group and phase (Group::me()).

// ---- peer: who a rank is ----------------------------------------------------
struct Peer {
  int pid = 0;
  std::string node;  // RSDP_NODE_ID, or host name + boot id
};
// Largest pid Linux can hand out (PID_MAX_LIMIT on 64-bit).
constexpr long kMaxPid = 4194304;
constexpr size_t kMaxNodeIdBytes = 1024;
// "" when `node` can travel in a peer record (1 to 1024 bytes of printable
// ASCII), else why not.
std::string check_node_id(std::string_view node);
std::string encode_peer(int rank, int pid, std::string_view node);
std::string decode_peer(std::string_view value, const From& from, Peer& out);

// ---- peers: the group's peer table, posted by group rank 0 -------------------
// Rank 0 reads every rank's peer record and posts them as one value, so that
// every other rank reads one key instead of all of them (O(1) store requests
// per rank at set-up; docs/scale.md). Each node id is written once, the ranks
// name it by index; node ids come in the order of their first rank, each is
// used, none twice (so that a table has exactly one encoding). When rank 0
// cannot build the table (a rank never came, a record was malformed) it posts
// its error instead, which the others raise as rank 0's.
constexpr int kMaxTableRanks = 1 << 20;  // UCX tags carry 20 bits of rank
constexpr size_t kMaxTableTextBytes = 4096;
struct PeerTable {
  bool ok = true;
  bool timeout = false;     // rank 0's error was a timeout (a rank never came)
  std::string text;         // rank 0's error, when !ok
  std::vector<Peer> peers;  // by group rank, when ok
};
// `peers` must be valid (check_node_id, pids 1..kMaxPid), 1 to kMaxTableRanks.
std::string encode_peer_table(const std::vector<Peer>& peers);
// `text` is cut to kMaxTableTextBytes and made printable (non-printable bytes: '?').
std::string encode_peer_table_failure(bool timeout, std::string_view text);
// `size`: the group size the reader expects (the table must have as many).
std::string decode_peer_table(std::string_view value, const From& from, int size,
                              PeerTable& out);

// ---- shared-memory segment names (shm: the group's, emu: one per rank) -----
// What ShmSegment::random_name() makes: "/rsdp-" and 16 lower-case hex digits.
bool is_segment_name(std::string_view name);
std::string encode_shm_name(std::string_view name);
std::string decode_shm_name(std::string_view value, const From& from, std::string& name);
std::string encode_emu_name(int rank, std::string_view name);
std::string decode_emu_name(std::string_view value, const From& from, std::string& name);

// ---- UCX worker addresses -----------------------------------------------------
// UCX's packed worker addresses are a few hundred bytes; anything beyond
// this is not one.
constexpr size_t kMaxUcxAddressBytes = 64u << 10;
struct UcxAddresses {
  std::string coll, p2p;  // raw bytes
};
std::string encode_ucx(int rank, std::string_view coll, std::string_view p2p);
std::string decode_ucx(std::string_view value, const From& from, UcxAddresses& out);

// ---- NCCL unique id (NCCL_UNIQUE_ID_BYTES; checked where nccl.h is seen) ----
constexpr size_t kNcclIdBytes = 128;
using NcclId = std::array<char, kNcclIdBytes>;
std::string encode_nccl_id(int rank, const NcclId& id);
std::string decode_nccl_id(std::string_view value, const From& from, NcclId& out);

// ---- GPU of a rank: its PCI bus id ("0000:3b:00.0") -------------------------
bool is_pci_bus_id(std::string_view bus);
std::string encode_gpu(int rank, std::string_view bus);
std::string decode_gpu(std::string_view value, const From& from, std::string& bus);

// ---- monitored_barrier's verdict, posted by rank 0 --------------------------
constexpr size_t kMaxVerdictTextBytes = 4096;
struct Verdict {
  bool ok = true;
  std::string text;  // why not, when !ok
};
std::string encode_verdict(const Verdict& v);
std::string decode_verdict(std::string_view value, const From& from, Verdict& out);

// ---- CUDA-IPC record: what a peer needs to map a rank's staging buffer ------
// The handles are cudaIpcMemHandle_t / cudaIpcEventHandle_t as bytes (64 each;
// ipc_comm.cpp checks the sizes against CUDA's headers).
constexpr uint32_t kIpcMagic = 0x43504952;  // "RIPC"
constexpr uint32_t kIpcVersion = 1;
constexpr size_t kIpcHandleBytes = 64;
constexpr size_t kIpcHalfAlign = 256;
struct IpcRecord {
  uint32_t magic;
  uint32_t version;
  int32_t rank;     // the writer's group rank
  int32_t device;   // ordinal in the writer's process (for messages only)
  uint64_t half;    // bytes of one staging half
  char bus_id[32];  // e.g. "0000:3b:00.0", NUL-terminated
  char mem[kIpcHandleBytes];
  char events[2][kIpcHandleBytes];
};
static_assert(sizeof(IpcRecord) == 248, "IpcRecord travels as bytes: no padding");
std::string encode_ipc(const IpcRecord& r);
std::string decode_ipc(std::string_view value, const From& from, IpcRecord& out);

// ---- the header of a group's shared-memory segment --------------------------
// Written by group rank 0 before it publishes the segment's name; read by the
// others from memory the creator may have left half-written (it died) or
// that is not ours at all (a name pointing elsewhere).
constexpr uint64_t kShmMagic = 0x3150445352ull;  // "RSDP1": magic and version
struct SegmentHeader {
  uint64_t magic;
  uint64_t size;
  uint64_t half_bytes;
  uint64_t ring_bytes;
  uint64_t pool_bytes;
};
// `bytes` is the start of the mapping (n bytes of it are readable); it is
// copied once, then checked: the magic, then each field against `want`.
std::string check_segment_header(const void* bytes, size_t n, const SegmentHeader& want,
                                 const From& from);

// ---- helpers, shared with the fuzz target and the tests ---------------------
std::string hex_encode(std::string_view bin);
// False on odd length or a character outside [0-9a-f].
bool hex_decode(std::string_view hex, std::string& out);
// `v` as it may be shown in a message: at most 48 bytes, anything not
// printable as \xNN, and "..." when cut.
std::string excerpt(std::string_view v);

}  // namespace records
}  // namespace rsdp
