// Standalone test of csrc/core/store_records.cpp, the records ranks leave for
// each other: every kind round-trips, and every way a record can be wrong
// (truncated, another version's, another job's, another rank's, out of range)
// is refused with a sentence naming the key, the writer and the fault.
//   g++ -O1 -std=c++17 -I csrc tests/native/test_store_records.cpp csrc/core/store_records.cpp
//   ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "core/store_records.h"

using namespace rsdp::records;

namespace {

const From kOne{"rsdp/2/0/peer/1", 1, "rank 1"};
const From kRoot{"rsdp/2/0/shm/name", 0, "rank 0"};

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// A refusal that names the key and the writer and says `why`.
#define REFUSED(expr, from, why)                                                          \
  do {                                                                                    \
    const std::string err_ = (expr);                                                      \
    CHECK(!err_.empty() && has(err_, (from).key.c_str()) && has(err_, (from).who.c_str()) && \
              has(err_, why),                                                             \
          "expected a refusal saying '%s', got '%s'", why, err_.c_str());                 \
  } while (0)

void peer() {
  Peer p;
  std::string v = encode_peer(1, 4242, "host-a/6f1c2d3e");
  CHECK(v == "rsdp1|peer|1|4242|host-a/6f1c2d3e", "%s", v.c_str());
  CHECK(decode_peer(v, kOne, p).empty() && p.pid == 4242 && p.node == "host-a/6f1c2d3e", "rt");
  // The node id is the rest: it may contain the separator.
  CHECK(decode_peer("rsdp1|peer|1|7|a|b", kOne, p).empty() && p.node == "a|b", "%s",
        p.node.c_str());
  REFUSED(decode_peer("rsdp1|peer|1|4242", kOne, p), kOne, "no node id");
  REFUSED(decode_peer("rsdp1|peer|1|42x|n", kOne, p), kOne, "pid '42x'");
  REFUSED(decode_peer("rsdp1|peer|1|0|n", kOne, p), kOne, "pid '0'");
  REFUSED(decode_peer("rsdp1|peer|1|-5|n", kOne, p), kOne, "pid '-5'");
  REFUSED(decode_peer("rsdp1|peer|1|042|n", kOne, p), kOne, "pid '042'");
  REFUSED(decode_peer("rsdp1|peer|1|4194305|n", kOne, p), kOne, "pid '4194305'");
  REFUSED(decode_peer("rsdp1|peer|1|99999999999999999999999|n", kOne, p), kOne, "pid");
  REFUSED(decode_peer("rsdp1|peer|1|4242|", kOne, p), kOne, "node id is empty");
  REFUSED(decode_peer("rsdp1|peer|1|4242|a\nb", kOne, p), kOne, "not printable ASCII");
  REFUSED(decode_peer("rsdp1|peer|1|4242|" + std::string(1025, 'n'), kOne, p), kOne,
          "more than 1024");
  REFUSED(decode_peer("4242|host-a/boot", kOne, p), kOne, "not a torch_rsdp record");
  REFUSED(decode_peer("rsdp2|peer|1|4242|n", kOne, p), kOne, "another version");
  REFUSED(decode_peer("rsdp1|ucx|1|4242|n", kOne, p), kOne, "kind is 'ucx'");
  REFUSED(decode_peer("rsdp1|peer|0|4242|n", kOne, p), kOne, "written by group rank 0");
  REFUSED(decode_peer("rsdp1|peer|1", kOne, p), kOne, "ends after the writer's rank");
  REFUSED(decode_peer("", kOne, p), kOne, "empty");
  // Binary junk is shown escaped, and cut.
  const std::string e =
      decode_peer(std::string("\x01\xff''\\", 5) + std::string(100, 'x'), kOne, p);
  CHECK(has(e, "\\x01\\xff\\x27\\x27\\x5c") && has(e, "...") && has(e, "105 bytes"), "%s",
        e.c_str());
  CHECK(check_node_id("node0").empty() && !check_node_id("").empty(), "check_node_id");
}

void names() {
  std::string n;
  const std::string good = "/rsdp-0123456789abcdef";
  CHECK(decode_shm_name(encode_shm_name(good), kRoot, n).empty() && n == good, "shm rt");
  const From two{"rsdp/3/0/emu/segment/2", 2, "rank 2"};
  CHECK(decode_emu_name(encode_emu_name(2, good), two, n).empty() && n == good, "emu rt");
  REFUSED(decode_shm_name("rsdp1|shm|0|/rsdp-0123", kRoot, n), kRoot, "not a segment name");
  REFUSED(decode_shm_name("rsdp1|shm|0|/rsdp-0123456789ABCDEF", kRoot, n), kRoot,
          "not a segment name");
  REFUSED(decode_shm_name("rsdp1|shm|0|/../../dev/zero", kRoot, n), kRoot,
          "not a segment name");
  REFUSED(decode_shm_name("rsdp1|shm|0|" + good + "|x", kRoot, n), kRoot,
          "not a segment name");
  REFUSED(decode_shm_name(good, kRoot, n), kRoot, "not a torch_rsdp record");
  REFUSED(decode_shm_name("rsdp1|shm|0|/rsdp-" + std::string(400, 'a'), kRoot, n), kRoot,
          "longer than any shm record");
  REFUSED(decode_emu_name(encode_emu_name(1, good), two, n), two, "written by group rank 1");
  CHECK(is_segment_name(good) && !is_segment_name("/rsdp-0123456789abcde") &&
            !is_segment_name("rsdp-0123456789abcdef0"),
        "is_segment_name");
}

void ucx() {
  const std::string coll("\0\1\2\xff", 4), p2p(300, '\x7f');
  UcxAddresses a;
  const std::string v = encode_ucx(1, coll, p2p);
  CHECK(decode_ucx(v, kOne, a).empty() && a.coll == coll && a.p2p == p2p, "rt");
  CHECK(v.substr(0, 22) == "rsdp1|ucx|1|4|000102ff", "%s", v.c_str());
  REFUSED(decode_ucx(v.substr(0, v.size() - 1), kOne, a), kOne, "truncated");
  REFUSED(decode_ucx("rsdp1|ucx|1|5|000102ff|1|00", kOne, a), kOne, "announces 5 bytes");
  REFUSED(decode_ucx("rsdp1|ucx|1|0||1|00", kOne, a), kOne, "length '0'");
  REFUSED(decode_ucx("rsdp1|ucx|1|70000|00|1|00", kOne, a), kOne, "length '70000'");
  REFUSED(decode_ucx("rsdp1|ucx|1|2|zz00|1|00", kOne, a), kOne, "not lower-case hex");
  REFUSED(decode_ucx("rsdp1|ucx|1|2|AB00|1|00", kOne, a), kOne, "not lower-case hex");
  REFUSED(decode_ucx("rsdp1|ucx|1|1|00", kOne, a), kOne, "no point-to-point address");
  REFUSED(decode_ucx("rsdp1|ucx|1|1|00|1", kOne, a), kOne, "ends after the length");
  REFUSED(decode_ucx("rsdp1|ucx|1|1|00|1|00|", kOne, a), kOne, "goes on after");
  REFUSED(decode_ucx("0a0b:0c0d", kOne, a), kOne, "not a torch_rsdp record");
  std::string bin;
  CHECK(hex_decode("00ff7f", bin) && bin == std::string("\0\xff\x7f", 3), "hex");
  CHECK(!hex_decode("0", bin) && !hex_decode("0g", bin) && !hex_decode("0F", bin), "bad hex");
}

void nccl_gpu_verdict() {
  NcclId id{}, back{};
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7);
  const From nccl{"rsdp/4/0/nccl/node0/id", 2, "rank 2"};
  CHECK(decode_nccl_id(encode_nccl_id(2, id), nccl, back).empty() && back == id, "nccl rt");
  REFUSED(decode_nccl_id(std::string(id.data(), id.size()), nccl, back), nccl,
          "not a torch_rsdp record");
  REFUSED(decode_nccl_id(encode_nccl_id(2, id).substr(0, 200), nccl, back), nccl,
          "not 256 lower-case hex digits");

  std::string bus;
  CHECK(decode_gpu(encode_gpu(1, "0000:3B:00.0"), kOne, bus).empty() && bus == "0000:3B:00.0",
        "gpu rt");
  CHECK(decode_gpu(encode_gpu(1, "00000000:3b:00.0"), kOne, bus).empty(), "8-digit domain");
  REFUSED(decode_gpu("rsdp1|gpu|1|GPU-1234", kOne, bus), kOne, "not a PCI bus id");
  REFUSED(decode_gpu("rsdp1|gpu|1|0000:3b:00.00", kOne, bus), kOne, "not a PCI bus id");
  CHECK(!is_pci_bus_id("000:3b:00.0") && !is_pci_bus_id("0000:3b:00:0") &&
            !is_pci_bus_id("0000:3g:00.0") && !is_pci_bus_id(""),
        "is_pci_bus_id");

  const From v{"rsdp/2/0/monitored_barrier/1/verdict", 0, "rank 0"};
  Verdict out;
  CHECK(decode_verdict(encode_verdict({}), v, out).empty() && out.ok, "ok");
  CHECK(decode_verdict(encode_verdict({false, "Rank 1 failed"}), v, out).empty() && !out.ok &&
            out.text == "Rank 1 failed",
        "fail");
  REFUSED(decode_verdict("", v, out), v, "empty");
  REFUSED(decode_verdict("rsdp1|verdict|0|fail|", v, out), v, "its text");
  REFUSED(decode_verdict("rsdp1|verdict|0|maybe", v, out), v, "neither 'ok' nor");
  REFUSED(decode_verdict("rsdp1|verdict|0|fail|" + std::string(5000, 'x'), v, out), v,
          "longer than any verdict record");
}

void peer_table() {
  const From t{"rsdp/4/0/peers", 0, "rank 0"};
  PeerTable out;
  // Node ids once each, in the order of their first rank; one may hold '|'.
  std::vector<Peer> peers{{11, "host-a/1"}, {12, "host-a/1"}, {13, "b|x"}, {14, "host-a/1"}};
  std::string v = encode_peer_table(peers);
  CHECK(v == "rsdp1|peers|0|4|2|8|host-a/1|3|b|x|11.0,12.0,13.1,14.0", "%s", v.c_str());
  CHECK(decode_peer_table(v, t, 4, out).empty() && out.ok && out.peers.size() == 4 &&
            out.peers[2].pid == 13 && out.peers[2].node == "b|x" && out.peers[3].node == "host-a/1",
        "round trip");
  REFUSED(decode_peer_table(v, t, 5, out), t, "this group has 5");
  REFUSED(decode_peer_table(v.substr(0, v.size() - 5), t, 4, out), t, "3 rank entries for 4");
  REFUSED(decode_peer_table(v + ",15.0", t, 4, out), t, "more rank entries");
  REFUSED(decode_peer_table("rsdp1|peers|0|2|2|1|a|1|a|1.0,2.1", t, 2, out), t, "listed twice");
  REFUSED(decode_peer_table("rsdp1|peers|0|2|2|1|a|1|b|1.1,2.0", t, 2, out), t,
          "names node 1 before node 0");
  REFUSED(decode_peer_table("rsdp1|peers|0|2|2|1|a|1|b|1.0,2.0", t, 2, out), t,
          "lists 2 nodes but its ranks use 1");
  REFUSED(decode_peer_table("rsdp1|peers|0|2|1|9|a|1.0,2.0", t, 2, out), t, "truncated");
  REFUSED(decode_peer_table("rsdp1|peers|0|2|1|1|a|0.0,2.0", t, 2, out), t, "group rank 0");
  REFUSED(decode_peer_table("rsdp1|peers|1|2|1|1|a|1.0,2.0", t, 2, out), t, "group rank 1");
  // Rank 0's failure, which the others raise as its.
  v = encode_peer_table_failure(true, "timed out for rank 3\n");
  CHECK(decode_peer_table(v, t, 4, out).empty() && !out.ok && out.timeout &&
            out.text == "timed out for rank 3?",
        "%s", v.c_str());
  CHECK(decode_peer_table(encode_peer_table_failure(false, "x"), t, 4, out).empty() &&
            !out.ok && !out.timeout,
        "error");
  REFUSED(decode_peer_table("rsdp1|peers|0|fail|maybe|x", t, 4, out), t, "neither 'timeout|'");
  REFUSED(decode_peer_table("rsdp1|peers|0|fail|error|", t, 4, out), t, "failure text");
}

IpcRecord good_ipc() {
  IpcRecord r;
  std::memset(&r, 0, sizeof(r));
  r.magic = kIpcMagic;
  r.version = kIpcVersion;
  r.rank = 1;
  r.device = 3;
  r.half = 1u << 20;
  std::strcpy(r.bus_id, "0000:3b:00.0");
  for (size_t i = 0; i < kIpcHandleBytes; ++i) r.mem[i] = static_cast<char>(i);
  return r;
}

void ipc() {
  IpcRecord out;
  const std::string v = encode_ipc(good_ipc());
  CHECK(decode_ipc(v, kOne, out).empty() && out.device == 3 && out.half == (1u << 20) &&
            std::memcmp(out.mem, good_ipc().mem, kIpcHandleBytes) == 0,
        "rt");
  REFUSED(decode_ipc(v.substr(0, 100), kOne, out), kOne, "has 100 bytes, not 248");
  auto with = [](void (*edit)(IpcRecord&)) {
    IpcRecord r = good_ipc();
    edit(r);
    return encode_ipc(r);
  };
  REFUSED(decode_ipc(with([](IpcRecord& r) { r.magic = 0; }), kOne, out), kOne, "magic");
  REFUSED(decode_ipc(with([](IpcRecord& r) { r.version = 2; }), kOne, out), kOne,
          "another version");
  REFUSED(decode_ipc(with([](IpcRecord& r) { r.rank = 0; }), kOne, out), kOne,
          "written by group rank 0");
  REFUSED(decode_ipc(with([](IpcRecord& r) { r.device = -1; }), kOne, out), kOne,
          "not a device ordinal");
  REFUSED(decode_ipc(with([](IpcRecord& r) { r.half = 1000; }), kOne, out), kOne,
          "staging halves of 1000");
  REFUSED(decode_ipc(with([](IpcRecord& r) { std::memset(r.bus_id, '0', 32); }), kOne,
                         out),
          kOne, "PCI bus id");
}

void segment_header() {
  const SegmentHeader want{kShmMagic, 2, 32768, 65536, 0};
  const From seg{"/rsdp-0123456789abcdef", 0, "rank 0"};
  char mem[64] = {0};
  std::memcpy(mem, &want, sizeof(want));
  CHECK(check_segment_header(mem, sizeof(mem), want, seg).empty(), "valid");
  std::string e = check_segment_header(mem, 20, want, seg);
  CHECK(has(e, "20 bytes, less than its header") && has(e, seg.key.c_str()), "%s", e.c_str());
  SegmentHeader h = want;
  h.half_bytes = 4096;
  std::memcpy(mem, &h, sizeof(h));
  e = check_segment_header(mem, sizeof(mem), want, seg);
  CHECK(has(e, "laid out differently by rank 0") && has(e, "staging half bytes is 4096"), "%s",
        e.c_str());
  std::memset(mem, 0, sizeof(mem));
  e = check_segment_header(mem, sizeof(mem), want, seg);
  CHECK(has(e, "header is empty") && has(e, "rank 0"), "%s", e.c_str());
  h = want;
  h.magic += 1ull << 32;  // "RSDP2"
  std::memcpy(mem, &h, sizeof(h));
  e = check_segment_header(mem, sizeof(mem), want, seg);
  CHECK(has(e, "another version"), "%s", e.c_str());
  h.magic = 0x1234;
  std::memcpy(mem, &h, sizeof(h));
  e = check_segment_header(mem, sizeof(mem), want, seg);
  CHECK(has(e, "not a torch_rsdp segment"), "%s", e.c_str());
}

}  // namespace

int main() {
  peer();
  names();
  ucx();
  nccl_gpu_verdict();
  peer_table();
  ipc();
  segment_header();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
