// libFuzzer target of csrc/core/store_records.cpp: every record another
// process leaves for a rank (store values, the shared-memory segment header).
//
// Input: the first byte picks the record kind (modulo the number of kinds: 9
// is the peer table of a group of 3),
// the rest is the value as the store would return it. Besides "no crash, no
// out-of-bounds read" (ASan, UBSan), each decode must be exact: a value it
// accepts re-encodes to the same bytes, and a refusal is a sentence that names
// the key and the writer. Inputs stay below 4 KiB: past that only the UCX
// record grows, through the same loops.
//
// fuzz-sources: csrc/core/store_records.cpp
// fuzz-options: -max_len=4096
//
//   clang++-14 -g -O1 -fsanitize=fuzzer,address,undefined -I csrc \
//       tests/fuzz/fuzz_store_records.cpp csrc/core/store_records.cpp -o fuzz_store_records
//   ./fuzz_store_records tests/fuzz/corpus/store_records
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/store_records.h"
#include "fuzz_input.h"

using namespace rsdp::records;

namespace {

// The writer every value claims to come from: group rank 1 (0 for the records
// only rank 0 writes), as the key of a real group would say.
const From kFrom{"rsdp/2/0/fuzz/1", 1, "rank 1"};
const From kFromRoot{"rsdp/2/0/fuzz/0", 0, "rank 0"};

// A refusal names the key and the writer; an acceptance round-trips.
void expect(const char* kind, const std::string& err, std::string_view value, const From& from,
            const std::string& reencoded) {
  FUZZ_TRACE("%s '%s': %s\n", kind, excerpt(value).c_str(), err.empty() ? "ok" : err.c_str());
  if (!err.empty()) {
    FUZZ_CHECK(err.find(from.who) != std::string::npos &&
                   err.find(excerpt(from.key)) != std::string::npos,
               "the error does not name the writer and the key: " + err);
    return;
  }
  FUZZ_CHECK(reencoded == value, std::string(kind) + " accepted '" + excerpt(value) +
                                     "', which re-encodes to '" + excerpt(reencoded) + "'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view v(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 10) {
    case 0: {
      Peer p;
      const std::string err = decode_peer(v, kFrom, p);
      expect("peer", err, v, kFrom, err.empty() ? encode_peer(kFrom.rank, p.pid, p.node) : "");
      FUZZ_CHECK(!err.empty() || (p.pid > 0 && p.pid <= kMaxPid && check_node_id(p.node).empty()),
                 "a peer record outside the ranges was accepted");
      break;
    }
    case 1: {
      std::string name;
      const std::string err = decode_shm_name(v, kFromRoot, name);
      expect("shm", err, v, kFromRoot, err.empty() ? encode_shm_name(name) : "");
      FUZZ_CHECK(!err.empty() || is_segment_name(name), "a bad segment name was accepted");
      break;
    }
    case 2: {
      std::string name;
      const std::string err = decode_emu_name(v, kFrom, name);
      expect("emu", err, v, kFrom, err.empty() ? encode_emu_name(kFrom.rank, name) : "");
      break;
    }
    case 3: {
      UcxAddresses a;
      const std::string err = decode_ucx(v, kFrom, a);
      expect("ucx", err, v, kFrom, err.empty() ? encode_ucx(kFrom.rank, a.coll, a.p2p) : "");
      FUZZ_CHECK(!err.empty() || (!a.coll.empty() && !a.p2p.empty() &&
                                  a.coll.size() <= kMaxUcxAddressBytes &&
                                  a.p2p.size() <= kMaxUcxAddressBytes),
                 "an empty or oversized UCX address was accepted");
      break;
    }
    case 4: {
      NcclId id{};
      const std::string err = decode_nccl_id(v, kFromRoot, id);
      expect("nccl", err, v, kFromRoot, err.empty() ? encode_nccl_id(kFromRoot.rank, id) : "");
      break;
    }
    case 5: {
      std::string bus;
      const std::string err = decode_gpu(v, kFrom, bus);
      expect("gpu", err, v, kFrom, err.empty() ? encode_gpu(kFrom.rank, bus) : "");
      FUZZ_CHECK(!err.empty() || is_pci_bus_id(bus), "a bad bus id was accepted");
      break;
    }
    case 6: {
      Verdict out;
      const std::string err = decode_verdict(v, kFromRoot, out);
      expect("verdict", err, v, kFromRoot, err.empty() ? encode_verdict(out) : "");
      break;
    }
    case 7: {
      IpcRecord r;
      const std::string err = decode_ipc(v, kFrom, r);
      expect("ipc", err, v, kFrom, err.empty() ? encode_ipc(r) : "");
      FUZZ_CHECK(!err.empty() || strnlen(r.bus_id, sizeof(r.bus_id)) < sizeof(r.bus_id),
                 "a bus id without its NUL was accepted");
      break;
    }
    case 9: {
      // The peer table of a group of 3 (the size the reader expects).
      PeerTable t;
      const From from{"rsdp/3/0/peers", 0, "rank 0"};
      const std::string err = decode_peer_table(v, from, 3, t);
      expect("peers", err, v, from,
             !err.empty() ? ""
             : t.ok       ? encode_peer_table(t.peers)
                          : encode_peer_table_failure(t.timeout, t.text));
      FUZZ_CHECK(!err.empty() || !t.ok || t.peers.size() == 3,
                 "a peer table of another size was accepted");
      for (const Peer& p : t.peers)
        FUZZ_CHECK(p.pid > 0 && p.pid <= kMaxPid && check_node_id(p.node).empty(),
                   "a peer table entry outside the ranges was accepted");
      break;
    }
    case 8: {
      // The segment header, in a heap block of exactly the input's size, as a
      // mapping of that many bytes would be.
      const SegmentHeader want{kShmMagic, 2, 32768, 65536, 0};
      const From seg{"/rsdp-0123456789abcdef", 0, "rank 0"};
      const std::string mem(v);
      const std::string err = check_segment_header(mem.data(), mem.size(), want, seg);
      FUZZ_TRACE("segment header (%zu bytes): %s\n", mem.size(), err.empty() ? "ok" : err.c_str());
      FUZZ_CHECK(!err.empty() || (mem.size() >= sizeof(SegmentHeader) &&
                                  std::memcmp(mem.data(), &want, sizeof(want)) == 0),
                 "a segment header unlike the expected one was accepted");
      FUZZ_CHECK(err.empty() || err.find(seg.key) != std::string::npos,
                 "the error does not name the segment: " + err);
      break;
    }
  }
  return 0;
}
