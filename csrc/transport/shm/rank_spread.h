// Spreading a node's ranks over its CPUs when they outnumber them: which rank
// moves to which CPU, decided alike by every rank from where each ran its
// last collective ([Note: ranks the kernel stacks] in rank_spread.cpp).
#pragma once

#include <vector>

namespace rsdp {

// cpus[r]: the CPU rank r ran its last collective on (-1: not known yet);
// allowed: the CPUs this rank may run on, ascending. Returns the CPU rank `me`
// should move to, or -1 to stay. Ranks beyond an even share of a CPU (the
// first ceil(n / allowed) ranks on it, in rank order, stay) move to the CPUs
// below that share, both taken in ascending order, so every rank reading the
// same cpus picks a different target and no two pick the same slot.
int spread_target(const std::vector<int>& cpus, int me, const std::vector<int>& allowed);

}  // namespace rsdp
