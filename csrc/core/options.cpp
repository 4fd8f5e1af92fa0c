#include "core/options.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace rsdp {
namespace {

// Accepts plain byte counts and K/M/G suffixes (powers of two): "64K", "2M".
size_t parse_bytes(const char* name, const char* text) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  RSDP_CHECK(end != text, "environment variable ", name, "='", text, "' is not a byte count");
  switch (*end) {
    case 'k': case 'K': v <<= 10; ++end; break;
    case 'm': case 'M': v <<= 20; ++end; break;
    case 'g': case 'G': v <<= 30; ++end; break;
    default: break;
  }
  if (*end == 'i' || *end == 'B' || *end == 'b') ++end;
  if (*end == 'B') ++end;
  RSDP_CHECK(*end == '\0', "environment variable ", name, "='", text, "' is not a byte count");
  return static_cast<size_t>(v);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// RSDP_EMULATE_DEVICE: "0" (off), "1" (on), or comma-separated settings that
// turn it on: "jitter=<us>", "stall=<group rank>@<op number>".
void parse_emulate_device(const char* v, Options& o) {
  if (std::strcmp(v, "0") == 0) return;
  o.emulate_device_jitter_us = 20;
  if (std::strcmp(v, "1") == 0) return;
  std::string rest = v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    int rank = -1;
    unsigned long long seq = 0;
    int used = 0;
    if (std::sscanf(item.c_str(), "jitter=%d%n", &o.emulate_device_jitter_us, &used) == 1 &&
        used == static_cast<int>(item.size()) && o.emulate_device_jitter_us >= 0)
      continue;
    if (std::sscanf(item.c_str(), "stall=%d@%llu%n", &rank, &seq, &used) == 2 &&
        used == static_cast<int>(item.size()) && rank >= 0) {
      o.emulate_device_stall_rank = rank;
      o.emulate_device_stall_seq = seq;
      continue;
    }
    RSDP_FAIL(ErrorKind::kValue, "environment variable RSDP_EMULATE_DEVICE='", v,
              "': '", item, "' is none of 0, 1, jitter=<microseconds>, stall=<rank>@<op number>");
  }
}

}  // namespace

std::string algo_env_var(OpKind op) {
  std::string var = "RSDP_ALGO_";
  for (const char* p = op_name(op); *p; ++p) var += static_cast<char>(std::toupper(*p));
  return var;
}

Options Options::from_env() {
  Options o;
  if (const char* v = env("RSDP_SHM_BYTES")) o.shm_bytes = parse_bytes("RSDP_SHM_BYTES", v);
  if (const char* v = env("RSDP_ONESHOT_BYTES"))
    o.oneshot_bytes = parse_bytes("RSDP_ONESHOT_BYTES", v);
  if (const char* v = env("RSDP_P2P_BYTES")) o.p2p_bytes = parse_bytes("RSDP_P2P_BYTES", v);
  if (const char* v = env("RSDP_POOL_BYTES")) o.pool_bytes = parse_bytes("RSDP_POOL_BYTES", v);
  if (const char* v = env("RSDP_SPIN_US")) o.spin_us = std::atoi(v);
  if (const char* v = env("RSDP_DEBUG")) o.debug = std::strcmp(v, "0") != 0;
  if (const char* v = env("RSDP_NODE_ID")) o.node_id = v;
  if (const char* v = env("RSDP_CUDA_STAGING_BYTES"))
    o.cuda_staging_bytes = parse_bytes("RSDP_CUDA_STAGING_BYTES", v);
  if (const char* v = env("RSDP_CUDA_ONESHOT_BYTES"))
    o.cuda_oneshot_bytes = parse_bytes("RSDP_CUDA_ONESHOT_BYTES", v);
  if (const char* v = env("RSDP_EMULATE_DEVICE")) parse_emulate_device(v, o);
  // `v` must be one of `names` (space-separated).
  auto check_choice = [](const char* var, const char* v, const std::string& names) {
    RSDP_CHECK((" " + names + " ").find(std::string(" ") + v + " ") != std::string::npos,
               "environment variable ", var, "='", v, "' names no algorithm; choose one of: ",
               names);
  };
  // RSDP_ALGO_<OP>, as given ("auto" is unset): the names each op accepts are the algorithm
  // table's, which checks them (check_forced_algorithms, algorithms/select.cpp).
  for (int k = 0; k < kNumOpKinds; ++k) {
    const char* v = env(algo_env_var(static_cast<OpKind>(k)).c_str());
    if (v && std::strcmp(v, "auto") != 0) o.algo[k] = v;
  }
  if (const char* v = env("RSDP_CUDA_INTRA")) {
    check_choice("RSDP_CUDA_INTRA", v, "auto ipc nccl");
    o.cuda_intra = v;
  }
  RSDP_CHECK(o.shm_bytes >= 8192, "RSDP_SHM_BYTES must be at least 8K, got ", o.shm_bytes);
  RSDP_CHECK(o.cuda_staging_bytes >= 8192, "RSDP_CUDA_STAGING_BYTES must be at least 8K, got ",
             o.cuda_staging_bytes);
  return o;
}

}  // namespace rsdp
