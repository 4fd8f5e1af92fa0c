// Process-shared futex wait/wake on a 32-bit word that lives in shared memory.
// Waiters spin briefly first (see transport/shm/shm_wait.h); the futex is the
// fallback that lets oversubscribed ranks (more ranks than cores) sleep.
#pragma once

#include <atomic>
#include <cstdint>

namespace rsdp {

// Sleeps while *word == expected, at most timeout_us microseconds. Returns
// early on wake-up, signal, or when *word already differs.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_us);

// Wakes every process/thread sleeping on word.
void futex_wake_all(std::atomic<uint32_t>* word);

// CPU hint for spin loops.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace rsdp
