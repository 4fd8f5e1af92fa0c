// Turns a failed CUDA runtime call into rsdp::Error, naming the call.
// Only CUDA builds compile files that include this.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

// RSDP_CUDA_CHECK(cudaMalloc(&p, n), "staging buffer of ", n, " bytes");
#define RSDP_CUDA_CHECK(call, ...)                                                    \
  do {                                                                                \
    cudaError_t rsdp_cuda_err_ = (call);                                              \
    if (rsdp_cuda_err_ != cudaSuccess)                                                \
      ::rsdp::throw_error(::rsdp::ErrorKind::kSystem,                                 \
                          ::rsdp::detail::cat(#call, " failed: ",                     \
                                              cudaGetErrorString(rsdp_cuda_err_), " ", \
                                              ##__VA_ARGS__));                        \
  } while (0)
