// How the CPU kernels (reduction, quantisation) are built for several ISAs.
//
// RSDP_CLONES on an entry point compiles it for AVX-512, AVX2 and the
// baseline; an ifunc picks one when the library loads. x86-64-v4 (AVX-512
// F/BW/DQ/VL) rather than plain "avx512f": VL gives the 256-bit code 32
// registers, mask blends and vpternlog, which makes the branch-free
// fp16/bf16 conversions much cheaper. A CPU with AVX-512F alone (no BW, DQ
// or VL) takes the AVX2 clone.
// RSDP_AI forces the helpers inline, so each clone gets its own copy.
#pragma once

//
// Not under ThreadSanitizer: an ifunc resolver runs while the program is being
// relocated, before TSan's runtime is up, and the instrumented resolver then
// crashes the process before main (SIGSEGV, no report). The sanitized build
// checks memory and threads, not which ISA clone was picked.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define RSDP_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define RSDP_CLONES
#endif
#define RSDP_AI inline __attribute__((always_inline))
