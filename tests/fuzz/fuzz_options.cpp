// The option parser (csrc/core/options.h, Options::from_env, with the test
// hooks of csrc/core/test_hooks.h): the RSDP_* environment variables, whatever they hold (overlong, negative, signed,
// non-numeric, past 2^64, with suffixes, blanks or control characters).
//
// Input: lines "NAME=value" (NAME one of the variables from_env reads;
// other lines are skipped; a value is the rest of its line). Each input
// starts from an environment without them. Checked: from_env either raises
// rsdp::Error naming the variable, or returns settings inside their
// documented ranges (docs/configuration.md); UBSan watches the number parsing
// (signed overflow, shifts).
//
// fuzz-sources: csrc/core/options.cpp csrc/core/test_hooks.cpp csrc/core/op_desc.cpp
// fuzz-options: -max_len=2048
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/options.h"
#include "fuzz_input.h"

using namespace rsdp;

namespace {

const std::vector<std::string>& names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v = {"RSDP_SHM_BYTES",          "RSDP_P2P_BYTES",
                                  "RSDP_POOL_BYTES",         "RSDP_SPIN_US",
                                  "RSDP_DEBUG",              "RSDP_NODE_ID",
                                  "RSDP_CUDA_STAGING_BYTES", "RSDP_CUDA_INTRA",
                                  "RSDP_TEST_EMULATE_DEVICE", "RSDP_TEST_WIRE_LIE",
                                  "RSDP_TEST_SHM_STORES",    "RSDP_SHM_ADAPT"};
    for (int k = 0; k < kNumOpKinds; ++k) v.push_back(algo_env_var(static_cast<OpKind>(k)));
    return v;
  }();
  return n;
}

// The variables live in buffers of ours, handed to putenv once and rewritten
// in place: setenv copies every value into memory glibc never frees, which
// grows the process by gigabytes over a long run. An empty value is unset to
// from_env, as to the backend.
constexpr size_t kValueMax = 4096;  // above the inputs' -max_len
struct Slot {
  std::string name;
  std::vector<char> buf;  // "NAME=value\0"
};

std::vector<Slot>& slots() {
  static std::vector<Slot> s = [] {
    std::vector<Slot> v;
    for (const auto& n : names()) v.push_back(Slot{n, std::vector<char>(n.size() + 2 + kValueMax)});
    for (auto& slot : v) {
      std::memcpy(slot.buf.data(), slot.name.data(), slot.name.size());
      slot.buf[slot.name.size()] = '=';
      putenv(slot.buf.data());
    }
    return v;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (auto& slot : slots()) slot.buf[slot.name.size() + 1] = '\0';
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> set;
  for (size_t at = 0; at <= text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq);
    // The environment cannot hold a NUL: a value ends at the first one.
    std::string value = line.substr(eq + 1).c_str();
    value.resize(std::min(value.size(), kValueMax - 1));
    for (auto& slot : slots()) {
      if (slot.name != name) continue;
      std::memcpy(slot.buf.data() + name.size() + 1, value.c_str(), value.size() + 1);
      if (!value.empty()) set.push_back(name);
    }
  }
  try {
    const Options o = Options::from_env();
    FUZZ_TRACE("accepted: shm %zu pool %zu spin %d intra %s\n", o.shm_bytes, o.pool_bytes,
               o.spin_us, o.cuda_intra.c_str());
    FUZZ_CHECK(o.shm_bytes >= 8192 && o.shm_bytes <= (1ull << 40), "RSDP_SHM_BYTES out of range");
    for (size_t b : {o.p2p_bytes, o.pool_bytes})
      FUZZ_CHECK(b <= (1ull << 40), "a byte count past 1024G");
    FUZZ_CHECK(o.cuda_staging_bytes >= 8192 && o.cuda_staging_bytes <= (1ull << 40),
               "RSDP_CUDA_STAGING_BYTES out of range");
    FUZZ_CHECK(o.spin_us >= 0 && o.spin_us <= 1000000, "RSDP_SPIN_US out of range");
    FUZZ_CHECK(o.cuda_intra == "auto" || o.cuda_intra == "ipc" || o.cuda_intra == "nccl",
               "RSDP_CUDA_INTRA='" + o.cuda_intra + "' accepted");
    const std::string lie = " " + o.test.wire_lie + " ";
    FUZZ_CHECK(o.test.wire_lie.empty() ||
                   std::string(" bytes step dtype op bits count ").find(lie) != std::string::npos,
               "RSDP_TEST_WIRE_LIE='" + o.test.wire_lie + "' accepted");
    FUZZ_CHECK(o.test.shm_stores.empty() || o.test.shm_stores == "cached" ||
                   o.test.shm_stores == "streaming",
               "RSDP_TEST_SHM_STORES='" + o.test.shm_stores + "' accepted");
    FUZZ_CHECK(o.test.emulate_device_jitter_us >= -1, "negative jitter");
    FUZZ_CHECK(o.test.emulate_device_stall_rank >= -1, "negative stall rank");
  } catch (const Error& e) {
    const std::string what = e.what();
    FUZZ_TRACE("refused: %s\n", what.c_str());
    bool named = false;
    for (const auto& n : set) named |= what.find(n) != std::string::npos;
    FUZZ_CHECK(e.kind() == ErrorKind::kValue, "not a ValueError: " + what);
    FUZZ_CHECK(named, "the error names no variable that was set: " + what);
  }
  return 0;
}
