#include "core/options.h"

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

}  // namespace

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
  struct Algo {
    const char* var;
    std::string* into;
    const char* names;  // accepted values, space-separated
  };
  const Algo algos[] = {
      {"RSDP_ALGO_ALLREDUCE", &o.algo_allreduce, "auto oneshot rs_ag hier ring rd"},
      {"RSDP_ALGO_ALLGATHER", &o.algo_allgather, "auto hier ring"},
      {"RSDP_ALGO_REDUCE_SCATTER", &o.algo_reduce_scatter, "auto hier ring"},
      {"RSDP_ALGO_BROADCAST", &o.algo_broadcast, "auto hier tree"},
      {"RSDP_ALGO_REDUCE", &o.algo_reduce, "auto hier tree"},
      {"RSDP_ALGO_BARRIER", &o.algo_barrier, "auto hier flat"},
      {"RSDP_CUDA_INTRA", &o.cuda_intra, "auto ipc nccl"},
  };
  for (const Algo& a : algos) {
    const char* v = env(a.var);
    if (!v) continue;
    std::string names = std::string(" ") + a.names + " ";
    RSDP_CHECK(names.find(std::string(" ") + v + " ") != std::string::npos, "environment variable ",
               a.var, "='", v, "' names no algorithm; choose one of: ", a.names);
    *a.into = v;
  }
  RSDP_CHECK(o.shm_bytes >= 8192, "RSDP_SHM_BYTES must be at least 8K, got ", o.shm_bytes);
  RSDP_CHECK(o.cuda_staging_bytes >= 8192, "RSDP_CUDA_STAGING_BYTES must be at least 8K, got ",
             o.cuda_staging_bytes);
  return o;
}

}  // namespace rsdp
