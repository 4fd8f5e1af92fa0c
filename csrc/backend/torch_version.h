// The torch versions the c10d glue builds against (setup.py: torch 2.9 to
// 2.13), and what differs between them. tests/project/test_torch_compat.py
// compiles the glue against torch 2.9's c10d headers.
#pragma once

#include <torch/version.h>

// c10d::Backend grew virtual members after torch 2.9, the oldest torch we
// build against (setup.py's install_requires): shrink/supportsShrinking in
// 2.10, getMemoryStats in 2.12. Ours are declared on every torch (Python
// and the tests may call them directly) and are overrides only where the base
// has them; an `override` of a member the base lacks does not compile.
#define RSDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if RSDP_TORCH_AT_LEAST(2, 10)
#define RSDP_OVERRIDE_SINCE_2_10 override
#else
#define RSDP_OVERRIDE_SINCE_2_10
#endif
#if RSDP_TORCH_AT_LEAST(2, 12)
#define RSDP_OVERRIDE_SINCE_2_12 override
#else
#define RSDP_OVERRIDE_SINCE_2_12
#endif
