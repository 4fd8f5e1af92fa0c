// See store_records.h. Every decoder works on a string_view of the value as
// the store returned it and only ever reads inside it; a value is split into
// the envelope (tag, kind, writer's rank) and a body that each kind checks.
#include "core/store_records.h"

#include <climits>
#include <cstdio>
#include <cstring>
#include <set>
#include <unordered_map>

namespace rsdp {
namespace records {
namespace {

constexpr std::string_view kTag = "rsdp1";

// The longest value of each kind: a longer one is refused before any parsing.
constexpr size_t kMaxPeerBytes = 64 + kMaxNodeIdBytes;
constexpr size_t kMaxNameBytes = 64;
constexpr size_t kMaxUcxBytes = 64 + 4 * kMaxUcxAddressBytes;
constexpr size_t kMaxNcclBytes = 64 + 2 * kNcclIdBytes;
constexpr size_t kMaxGpuBytes = 64;
constexpr size_t kMaxVerdictBytes = 64 + kMaxVerdictTextBytes;

template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  (s.append(args), ...);
  return s;
}

std::string num(unsigned long long v) { return std::to_string(v); }

// "malformed <what> from <who> (store key '<key>'): <why> (value '...', N bytes)".
std::string malformed(const char* what, const From& from, std::string_view value,
                      const std::string& why, const char* where = "store key") {
  return cat("malformed ", what, " from ", from.who, " (", where, " '", excerpt(from.key),
             "'): ", why, " (value '", excerpt(value), "', ", num(value.size()), " bytes)");
}

// A decimal number without sign or leading zeros, at most `max`.
bool parse_uint(std::string_view s, unsigned long long max, unsigned long long& out) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return false;
  unsigned long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  if (v > max) return false;
  out = v;
  return true;
}

bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool is_any_case_hex(char c) { return is_hex_digit(c) || (c >= 'A' && c <= 'F'); }

// `s` up to the next '|' (all of it when there is none); `s` keeps the rest.
std::string_view take_field(std::string_view& s, bool& had_bar) {
  const size_t bar = s.find('|');
  had_bar = bar != std::string_view::npos;
  std::string_view f = s.substr(0, bar);
  s = had_bar ? s.substr(bar + 1) : std::string_view();
  return f;
}

// The envelope "rsdp1|<kind>|<rank>|": checks it, leaves the body in `body`.
std::string open_envelope(std::string_view value, const char* kind, const char* what,
                          const From& from, size_t max_bytes, std::string_view& body) {
  if (value.empty()) return malformed(what, from, value, "the value is empty");
  if (value.size() > max_bytes)
    return malformed(what, from, value,
                     cat("it is longer than any ", kind, " record (at most ", num(max_bytes),
                         " bytes)"));
  std::string_view rest = value;
  bool bar = false;
  const std::string_view tag = take_field(rest, bar);
  if (tag != kTag) {
    const bool ours = tag.size() > 4 && tag.substr(0, 4) == "rsdp" &&
                      tag.find_first_not_of("0123456789", 4) == std::string_view::npos;
    return malformed(what, from, value,
                     ours ? cat("it was written by another version of torch_rsdp (record "
                                "version '", excerpt(tag), "', this one reads '",
                                std::string(kTag), "')")
                          : cat("it is not a torch_rsdp record (no '", std::string(kTag),
                                "|' tag: another job's or another program's value under "
                                "this key?)"));
  }
  const std::string_view k = take_field(rest, bar);
  if (k != kind)
    return malformed(what, from, value,
                     cat("its kind is '", excerpt(k), "', not '", kind, "'"));
  const std::string_view r = take_field(rest, bar);
  unsigned long long writer = 0;
  if (!parse_uint(r, INT_MAX, writer))
    return malformed(what, from, value, cat("the writer's rank '", excerpt(r),
                                            "' is not a rank"));
  if (static_cast<long long>(writer) != from.rank)
    return malformed(what, from, value,
                     cat("it was written by group rank ", num(writer), ", not by group rank ",
                         std::to_string(from.rank), " (a stale or copied record?)"));
  if (!bar) return malformed(what, from, value, "it ends after the writer's rank");
  body = rest;
  return "";
}

std::string envelope(const char* kind, int rank) {
  return cat(std::string(kTag), "|", kind, "|", std::to_string(rank), "|");
}

// True when every byte of `s` is printable ASCII: such text may end up in an
// exception message, which Python must be able to decode.
bool printable_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

}  // namespace

std::string hex_encode(std::string_view bin) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bin.size() * 2);
  for (unsigned char c : bin) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

bool hex_decode(std::string_view hex, std::string& out) {
  if (hex.size() % 2) return false;
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string v(hex.size() / 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const char hi = hex[2 * i], lo = hex[2 * i + 1];
    if (!is_hex_digit(hi) || !is_hex_digit(lo)) return false;
    v[i] = static_cast<char>(nibble(hi) << 4 | nibble(lo));
  }
  out = std::move(v);
  return true;
}

std::string excerpt(std::string_view v) {
  constexpr size_t kShown = 48;
  std::string out;
  for (size_t i = 0; i < v.size() && i < kShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (v.size() > kShown) out += "...";
  return out;
}

// ---- peer --------------------------------------------------------------------

std::string check_node_id(std::string_view node) {
  if (node.empty()) return "the node id is empty";
  if (node.size() > kMaxNodeIdBytes)
    return cat("the node id has ", num(node.size()), " bytes, more than ",
               num(kMaxNodeIdBytes));
  if (!printable_ascii(node)) return cat("the node id '", excerpt(node),
                                          "' is not printable ASCII");
  return "";
}

std::string encode_peer(int rank, int pid, std::string_view node) {
  return cat(envelope("peer", rank), std::to_string(pid), "|", std::string(node));
}

std::string decode_peer(std::string_view value, const From& from, Peer& out) {
  const char* what = "peer record";
  std::string_view body;
  std::string err = open_envelope(value, "peer", what, from, kMaxPeerBytes, body);
  if (!err.empty()) return err;
  bool bar = false;
  const std::string_view pid = take_field(body, bar);
  unsigned long long p = 0;
  if (!parse_uint(pid, kMaxPid, p) || p == 0)
    return malformed(what, from, value,
                     cat("the pid '", excerpt(pid), "' is not a process id (1 to ",
                         num(kMaxPid), ")"));
  if (!bar) return malformed(what, from, value, "it has no node id after the pid");
  err = check_node_id(body);
  if (!err.empty()) return malformed(what, from, value, err);
  out.pid = static_cast<int>(p);
  out.node = std::string(body);
  return "";
}

// ---- peers: the peer table -----------------------------------------------------

std::string encode_peer_table(const std::vector<Peer>& peers) {
  std::vector<const std::string*> nodes;
  std::unordered_map<std::string, size_t> index;
  std::string ranks;
  for (size_t r = 0; r < peers.size(); ++r) {
    auto it = index.emplace(peers[r].node, nodes.size()).first;
    if (it->second == nodes.size()) nodes.push_back(&peers[r].node);
    ranks += cat(r ? "," : "", std::to_string(peers[r].pid), ".", num(it->second));
  }
  std::string out = cat(envelope("peers", 0), num(peers.size()), "|", num(nodes.size()), "|");
  for (const std::string* n : nodes) out += cat(num(n->size()), "|", *n, "|");
  return out + ranks;
}

std::string encode_peer_table_failure(bool timeout, std::string_view text) {
  std::string t(text.substr(0, kMaxTableTextBytes));
  for (char& c : t)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  if (t.empty()) t = "?";
  return cat(envelope("peers", 0), "fail|", timeout ? "timeout|" : "error|", t);
}

std::string decode_peer_table(std::string_view value, const From& from, int size,
                              PeerTable& out) {
  const char* what = "peer table";
  if (size < 1 || size > kMaxTableRanks)
    return malformed(what, from, value, cat("this rank expects a group of ",
                                            std::to_string(size), " ranks"));
  // Every node id once at most, and a pid and an index per rank.
  const size_t max_bytes = 64 + kMaxTableTextBytes +
                           static_cast<size_t>(size) * (kMaxNodeIdBytes + 8 + 8 + 20);
  std::string_view body;
  std::string err = open_envelope(value, "peers", what, from, max_bytes, body);
  if (!err.empty()) return err;
  bool bar = false;
  std::string_view rest = body;
  const std::string_view first = take_field(rest, bar);
  if (first == "fail") {
    const std::string_view kind = bar ? take_field(rest, bar) : std::string_view();
    if (kind != "timeout" && kind != "error")
      return malformed(what, from, value, "its failure is neither 'timeout|' nor 'error|'");
    if (!bar || rest.empty() || rest.size() > kMaxTableTextBytes || !printable_ascii(rest))
      return malformed(what, from, value,
                       cat("its failure text is not 1 to ", num(kMaxTableTextBytes),
                           " bytes of printable ASCII"));
    out = PeerTable{false, kind == "timeout", std::string(rest), {}};
    return "";
  }
  unsigned long long n = 0, m = 0;
  if (!parse_uint(first, kMaxTableRanks, n) || static_cast<long long>(n) != size)
    return malformed(what, from, value,
                     cat("it lists '", excerpt(first), "' ranks, this group has ",
                         std::to_string(size)));
  if (!bar) return malformed(what, from, value, "it ends after the number of ranks");
  const std::string_view nm = take_field(rest, bar);
  if (!parse_uint(nm, n, m) || m == 0)
    return malformed(what, from, value,
                     cat("its number of nodes '", excerpt(nm), "' is not 1 to ", num(n)));
  if (!bar) return malformed(what, from, value, "it ends after the number of nodes");
  std::vector<std::string_view> nodes;
  std::set<std::string_view> seen;
  for (unsigned long long i = 0; i < m; ++i) {
    const std::string_view len = take_field(rest, bar);
    unsigned long long l = 0;
    if (!parse_uint(len, kMaxNodeIdBytes, l) || l == 0)
      return malformed(what, from, value,
                       cat("the length '", excerpt(len), "' of node id ", num(i),
                           " is not 1 to ", num(kMaxNodeIdBytes)));
    if (!bar || rest.size() < l + 1 || rest[l] != '|')
      return malformed(what, from, value,
                       cat("node id ", num(i), " is not ", num(l), " bytes followed by '|' "
                           "(truncated?)"));
    const std::string_view node = rest.substr(0, l);
    rest = rest.substr(l + 1);
    err = check_node_id(node);
    if (!err.empty()) return malformed(what, from, value, cat("node id ", num(i), ": ", err));
    if (!seen.insert(node).second)
      return malformed(what, from, value, cat("node id ", num(i), " '", excerpt(node),
                                              "' is listed twice"));
    nodes.push_back(node);
  }
  std::vector<Peer> peers(n);
  size_t used = 0;  // nodes named so far: the next new one must be nodes[used]
  for (unsigned long long r = 0; r < n; ++r) {
    const size_t comma = rest.find(',');
    const bool more = comma != std::string_view::npos;
    const std::string_view entry = rest.substr(0, comma);
    rest = more ? rest.substr(comma + 1) : std::string_view();
    if (more != (r + 1 < n))
      return malformed(what, from, value,
                       more ? "it has more rank entries than ranks"
                            : cat("it has ", num(r + 1), " rank entries for ", num(n),
                                  " ranks (truncated?)"));
    const size_t dot = entry.find('.');
    unsigned long long pid = 0, idx = 0;
    if (dot == std::string_view::npos || !parse_uint(entry.substr(0, dot), kMaxPid, pid) ||
        pid == 0 || !parse_uint(entry.substr(dot + 1), m - 1, idx))
      return malformed(what, from, value,
                       cat("the entry of group rank ", num(r), " '", excerpt(entry),
                           "' is not <pid 1 to ", num(kMaxPid), ">.<node index below ", num(m),
                           ">"));
    if (idx > used)
      return malformed(what, from, value,
                       cat("group rank ", num(r), " names node ", num(idx), " before node ",
                           num(used), " was named (nodes go in the order of their first rank)"));
    if (idx == used) ++used;
    peers[r].pid = static_cast<int>(pid);
    peers[r].node = std::string(nodes[idx]);
  }
  if (used != m)
    return malformed(what, from, value, cat("it lists ", num(m), " nodes but its ranks use ",
                                            num(used)));
  out = PeerTable{true, false, {}, std::move(peers)};
  return "";
}

// ---- segment names -----------------------------------------------------------

bool is_segment_name(std::string_view name) {
  constexpr std::string_view kPrefix = "/rsdp-";
  if (name.size() != kPrefix.size() + 16 || name.substr(0, kPrefix.size()) != kPrefix)
    return false;
  for (char c : name.substr(kPrefix.size()))
    if (!is_hex_digit(c)) return false;
  return true;
}

namespace {

std::string decode_name(const char* kind, const char* what, std::string_view value,
                        const From& from, std::string& name) {
  std::string_view body;
  std::string err = open_envelope(value, kind, what, from, kMaxNameBytes, body);
  if (!err.empty()) return err;
  if (!is_segment_name(body))
    return malformed(what, from, value,
                     cat("'", excerpt(body), "' is not a segment name of torch_rsdp "
                         "('/rsdp-' and 16 hex digits)"));
  name = std::string(body);
  return "";
}

}  // namespace

std::string encode_shm_name(std::string_view name) {
  return envelope("shm", 0) + std::string(name);
}

std::string decode_shm_name(std::string_view value, const From& from, std::string& name) {
  return decode_name("shm", "shared-memory name record", value, from, name);
}

std::string encode_emu_name(int rank, std::string_view name) {
  return envelope("emu", rank) + std::string(name);
}

std::string decode_emu_name(std::string_view value, const From& from, std::string& name) {
  return decode_name("emu", "emulated-device segment record", value, from, name);
}

// ---- UCX -----------------------------------------------------------------------

std::string encode_ucx(int rank, std::string_view coll, std::string_view p2p) {
  return cat(envelope("ucx", rank), num(coll.size()), "|", hex_encode(coll), "|",
             num(p2p.size()), "|", hex_encode(p2p));
}

std::string decode_ucx(std::string_view value, const From& from, UcxAddresses& out) {
  const char* what = "UCX address record";
  std::string_view body;
  std::string err = open_envelope(value, "ucx", what, from, kMaxUcxBytes, body);
  if (!err.empty()) return err;
  std::string addr[2];
  const char* names[2] = {"collective", "point-to-point"};
  for (int i = 0; i < 2; ++i) {
    bool bar = false;
    const std::string_view n = take_field(body, bar);
    unsigned long long bytes = 0;
    if (!parse_uint(n, kMaxUcxAddressBytes, bytes) || bytes == 0)
      return malformed(what, from, value,
                       cat("the length '", excerpt(n), "' of the ", names[i],
                           " address is not 1 to ", num(kMaxUcxAddressBytes), " bytes"));
    if (!bar)
      return malformed(what, from, value,
                       cat("it ends after the length of the ", names[i], " address"));
    const std::string_view hex = take_field(body, bar);
    if (hex.size() != 2 * bytes)
      return malformed(what, from, value,
                       cat("the ", names[i], " address announces ", num(bytes),
                           " bytes but has ", num(hex.size()), " hex digits (truncated?)"));
    if (!hex_decode(hex, addr[i]))
      return malformed(what, from, value,
                       cat("the ", names[i], " address is not lower-case hex"));
    if (bar != (i == 0))
      return malformed(what, from, value,
                       i == 0 ? "it has no point-to-point address"
                              : "it goes on after the point-to-point address");
  }
  out.coll = std::move(addr[0]);
  out.p2p = std::move(addr[1]);
  return "";
}

// ---- NCCL ----------------------------------------------------------------------

std::string encode_nccl_id(int rank, const NcclId& id) {
  return envelope("nccl", rank) + hex_encode(std::string_view(id.data(), id.size()));
}

std::string decode_nccl_id(std::string_view value, const From& from, NcclId& out) {
  const char* what = "NCCL unique id record";
  std::string_view body;
  std::string err = open_envelope(value, "nccl", what, from, kMaxNcclBytes, body);
  if (!err.empty()) return err;
  std::string bin;
  if (body.size() != 2 * kNcclIdBytes || !hex_decode(body, bin))
    return malformed(what, from, value,
                     cat("the id is not ", num(2 * kNcclIdBytes), " lower-case hex digits (",
                         num(body.size()), " characters)"));
  std::memcpy(out.data(), bin.data(), kNcclIdBytes);
  return "";
}

// ---- GPU -------------------------------------------------------------------------

bool is_pci_bus_id(std::string_view bus) {
  // domain (4 to 8 hex digits) ':' bus (2) ':' device (2) '.' function (1)
  const size_t colon = bus.find(':');
  if (colon == std::string_view::npos || colon < 4 || colon > 8) return false;
  const std::string_view tail = bus.substr(colon);
  if (tail.size() != 8 || tail[0] != ':' || tail[3] != ':' || tail[6] != '.') return false;
  for (size_t i = 0; i < bus.size(); ++i) {
    const size_t t = i - colon;
    if (i >= colon && (t == 0 || t == 3 || t == 6)) continue;
    if (!is_any_case_hex(bus[i])) return false;
  }
  return true;
}

std::string encode_gpu(int rank, std::string_view bus) {
  return envelope("gpu", rank) + std::string(bus);
}

std::string decode_gpu(std::string_view value, const From& from, std::string& bus) {
  const char* what = "GPU record";
  std::string_view body;
  std::string err = open_envelope(value, "gpu", what, from, kMaxGpuBytes, body);
  if (!err.empty()) return err;
  if (!is_pci_bus_id(body))
    return malformed(what, from, value,
                     cat("'", excerpt(body), "' is not a PCI bus id (e.g. 0000:3b:00.0)"));
  bus = std::string(body);
  return "";
}

// ---- monitored_barrier's verdict -------------------------------------------------

std::string encode_verdict(const Verdict& v) {
  return envelope("verdict", 0) + (v.ok ? std::string("ok") : "fail|" + v.text);
}

std::string decode_verdict(std::string_view value, const From& from, Verdict& out) {
  const char* what = "monitored_barrier verdict";
  std::string_view body;
  std::string err = open_envelope(value, "verdict", what, from, kMaxVerdictBytes, body);
  if (!err.empty()) return err;
  if (body == "ok") {
    out = Verdict{};
    return "";
  }
  bool bar = false;
  const std::string_view word = take_field(body, bar);
  if (word != "fail" || !bar)
    return malformed(what, from, value, "it says neither 'ok' nor 'fail|<why>'");
  if (body.empty() || body.size() > kMaxVerdictTextBytes || !printable_ascii(body))
    return malformed(what, from, value,
                     cat("its text is not 1 to ", num(kMaxVerdictTextBytes),
                         " bytes of printable ASCII"));
  out.ok = false;
  out.text = std::string(body);
  return "";
}

// ---- CUDA-IPC ----------------------------------------------------------------------

std::string encode_ipc(const IpcRecord& r) {
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

std::string decode_ipc(std::string_view value, const From& from, IpcRecord& out) {
  const char* what = "CUDA-IPC record";
  if (value.size() != sizeof(IpcRecord))
    return malformed(what, from, value,
                     cat("it has ", num(value.size()), " bytes, not ", num(sizeof(IpcRecord))));
  IpcRecord r;
  std::memcpy(&r, value.data(), sizeof(r));
  if (r.magic != kIpcMagic)
    return malformed(what, from, value, "it does not start with the magic 'RIPC'");
  if (r.version != kIpcVersion)
    return malformed(what, from, value,
                     cat("it was written by another version of torch_rsdp (record version ",
                         num(r.version), ", this one reads ", num(kIpcVersion), ")"));
  if (r.rank != from.rank)
    return malformed(what, from, value,
                     cat("it was written by group rank ", std::to_string(r.rank),
                         ", not by group rank ", std::to_string(from.rank),
                         " (a stale or copied record?)"));
  if (r.device < 0 || r.device > 65535)
    return malformed(what, from, value,
                     cat("device ", std::to_string(r.device), " is not a device ordinal"));
  if (r.half == 0 || r.half % kIpcHalfAlign != 0 || r.half > (1ull << 40))
    return malformed(what, from, value,
                     cat("staging halves of ", num(r.half), " bytes are not a multiple of ",
                         num(kIpcHalfAlign), " up to 1 TiB"));
  const size_t bus_len = strnlen(r.bus_id, sizeof(r.bus_id));
  if (bus_len == sizeof(r.bus_id) || !is_pci_bus_id(std::string_view(r.bus_id, bus_len)))
    return malformed(what, from, value, "its PCI bus id is not one");
  out = r;
  return "";
}

// ---- segment header ----------------------------------------------------------------

std::string check_segment_header(const void* bytes, size_t n, const SegmentHeader& want,
                                 const From& from) {
  const char* what = "shared-memory segment header";
  auto bad = [&](const std::string& why) {
    return cat("malformed ", what, " from ", from.who, " (segment '", excerpt(from.key),
               "'): ", why);
  };
  if (n < sizeof(SegmentHeader))
    return bad(cat("the segment has ", num(n), " bytes, less than its header"));
  SegmentHeader h;
  // One copy: the segment is shared, and a broken peer may still write to it.
  std::memcpy(&h, bytes, sizeof(h));
  if (h.magic != kShmMagic) {
    if (h.magic == 0)
      return bad("its header is empty: the creator never finished writing it (did it die?)");
    const bool ours = (h.magic & 0xffffffffull) == (kShmMagic & 0xffffffffull);
    return bad(ours ? "it was laid out by another version of torch_rsdp"
                    : "it is not a torch_rsdp segment (wrong magic)");
  }
  struct Field {
    const char* name;
    uint64_t got, want;
  } fields[] = {{"group size", h.size, want.size},
                {"staging half bytes", h.half_bytes, want.half_bytes},
                {"p2p ring bytes", h.ring_bytes, want.ring_bytes},
                {"pool bytes", h.pool_bytes, want.pool_bytes}};
  for (const Field& f : fields)
    if (f.got != f.want)
      return cat("the shared memory '", excerpt(from.key), "' was laid out differently by ",
                 from.who, ": its ", f.name, " is ", num(f.got), ", this rank expects ",
                 num(f.want), " (do all ranks use the same RSDP_SHM_BYTES, RSDP_P2P_BYTES "
                 "and RSDP_POOL_BYTES?)");
  return "";
}

}  // namespace records
}  // namespace rsdp
