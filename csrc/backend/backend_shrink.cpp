// BackendRSDP::shrink: the survivors of a failure go on in a new group.
//
// Nothing of the old group is reused: the new backend joins through a fresh
// namespace of the same store, so it gets new shared memory, new network
// endpoints and a topology computed anew (a node may now hold one rank, or
// have lost its leader). The old backend is left as it is; torch destroys it
// right after (shrink_group), and with SHRINK_ABORT it is aborted first, so
// ops still queued on it fail at once instead of draining.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <sstream>

#include "algorithms/group_comm.h"
#include "backend/backend_rsdp.h"

namespace rsdp {

namespace {
constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT
}

c10::intrusive_ptr<c10d::Backend> BackendRSDP::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts_override) {
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Backend> {
    const int me = getRank(), n = getSize();
    // torch's shrink_group checks these in Python; a direct call gets the
    // same answers (ValueError; RuntimeError for an excluded caller).
    RSDP_CHECK(!ranks_to_exclude.empty(), "rsdp rank ", global_rank_,
               ": shrink: ranks_to_exclude is empty");
    RSDP_CHECK(shrink_flags == 0 || shrink_flags == kShrinkAbort, "rsdp rank ", global_rank_,
               ": shrink: invalid shrink_flags ", shrink_flags,
               " (SHRINK_DEFAULT 0 or SHRINK_ABORT 1)");
    std::vector<bool> out(n, false);
    for (int64_t r : ranks_to_exclude) {
      RSDP_CHECK(r >= 0 && r < n, "rsdp rank ", global_rank_, ": shrink: rank ", r,
                 " is out of bounds for group size ", n);
      RSDP_CHECK(!out[r], "rsdp rank ", global_rank_, ": shrink: rank ", r,
                 " is excluded twice");
      out[r] = true;
    }
    RSDP_CHECK(static_cast<int>(ranks_to_exclude.size()) < n, "rsdp rank ", global_rank_,
               ": shrink: cannot exclude all ", n, " ranks");
    RSDP_CHECK_KIND(ErrorKind::kSystem, !out[me], "rsdp rank ", global_rank_,
                    ": shrink: this rank (group rank ", me,
                    ") is excluded and must not call shrink");
    RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_,
               ": shrink called after the process group was shut down");

    // The survivors keep their order (torch renumbers them the same way)
    // and their global ranks, which name them in errors.
    std::vector<int> global;
    int new_rank = 0;
    for (int r = 0; r < n; ++r) {
      if (out[r]) continue;
      if (r == me) new_rank = static_cast<int>(global.size());
      global.push_back(comm_->group.global(r));
    }
    // A namespace every survivor derives alike and no other group uses:
    // this group's own prefix (and incarnation), extended by who left.
    std::ostringstream tag;
    tag << "rsdp-shrink/" << comm_->group.generation << "/without";
    for (int r = 0, k = 0; r < n; ++r)
      if (out[r]) tag << (k++ ? "," : "-") << r;
    tag << "/";

    if (shrink_flags & kShrinkAbort) abort();

    auto store = c10::make_intrusive<c10d::PrefixStore>(tag.str(), store_);
    auto timeout = opts_override && opts_override->timeout.count() > 0 ? opts_override->timeout
                                                                          : this->timeout();
    auto shrunk = c10::make_intrusive<BackendRSDP>(store, new_rank,
                                                   static_cast<int>(global.size()), timeout,
                                                   std::move(global), group_name_ + ":shrunk");
    return shrunk;
  });
}

}  // namespace rsdp
