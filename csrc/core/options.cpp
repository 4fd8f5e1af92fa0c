#include "core/options.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env_parse.h"
#include "core/error.h"

namespace rsdp {
namespace {

// The value parsers, shared with the test hooks (core/env_parse.h).
using env_parse::env;
using env_parse::parse_bytes;
using env_parse::parse_int;

}  // namespace

const char* adapt_mode_name(AdaptMode m) {
  switch (m) {
    case AdaptMode::kOff: return "off";
    case AdaptMode::kOnce: return "once";
    case AdaptMode::kContinuous: return "continuous";
  }
  return "unknown";
}

std::string algo_env_var(OpKind op) {
  std::string var = "RSDP_ALGO_";
  for (const char* p = op_name(op); *p; ++p) var += static_cast<char>(std::toupper(*p));
  return var;
}

Options Options::from_env() {
  Options o;
  if (const char* v = env("RSDP_SHM_BYTES")) o.shm_bytes = parse_bytes("RSDP_SHM_BYTES", v);
  if (const char* v = env("RSDP_P2P_BYTES")) o.p2p_bytes = parse_bytes("RSDP_P2P_BYTES", v);
  if (const char* v = env("RSDP_POOL_BYTES")) o.pool_bytes = parse_bytes("RSDP_POOL_BYTES", v);
  if (const char* v = env("RSDP_SPIN_US")) o.spin_us = parse_int("RSDP_SPIN_US", v, 1'000'000);
  if (const char* v = env("RSDP_DEBUG")) o.debug = std::strcmp(v, "0") != 0;
  if (const char* v = env("RSDP_NODE_ID")) o.node_id = v;
  if (const char* v = env("RSDP_CUDA_STAGING_BYTES"))
    o.cuda_staging_bytes = parse_bytes("RSDP_CUDA_STAGING_BYTES", v);
  // `v` must be one of `names` (space-separated), a whole one: "ipc nccl" is in the list
  // but no choice.
  auto check_choice = [](const char* var, const char* v, const std::string& names) {
    RSDP_CHECK(std::strchr(v, ' ') == nullptr &&
                   (" " + names + " ").find(std::string(" ") + v + " ") != std::string::npos,
               "environment variable ", var, "='", v, "' is none of its choices: ", names);
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
  if (const char* v = env("RSDP_SHM_ADAPT")) {
    check_choice("RSDP_SHM_ADAPT", v, "off once continuous");
    o.shm_adapt = std::strcmp(v, "off") == 0    ? AdaptMode::kOff
                  : std::strcmp(v, "once") == 0 ? AdaptMode::kOnce
                                                : AdaptMode::kContinuous;
  }
  o.test = TestHooks::from_env();
  RSDP_CHECK(o.shm_bytes >= 8192, "RSDP_SHM_BYTES must be at least 8K, got ", o.shm_bytes);
  RSDP_CHECK(o.cuda_staging_bytes >= 8192, "RSDP_CUDA_STAGING_BYTES must be at least 8K, got ",
             o.cuda_staging_bytes);
  return o;
}

}  // namespace rsdp
