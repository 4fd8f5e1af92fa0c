// monitoredBarrier as ProcessGroupGloo's: non-zero ranks report to rank 0,
// which waits for each within the timeout and names those that did not come
// ("Rank 2 failed to pass monitoredBarrier in 1000 ms"), the first one or,
// with wait_all_ranks, all of them. The meeting place is the group's store,
// not its transport, so a broken transport does not hide which rank is
// missing. Rank 0 also posts its verdict, so the others fail with the names
// at once rather than each at its own timeout.
#include <sstream>

#include "algorithms/group_comm.h"
#include "backend/backend_rsdp.h"
#include "backend/store_bootstrap.h"
#include "core/store_records.h"

namespace rsdp {

void BackendRSDP::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  translate_errors([&] {
    RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_,
               ": monitored_barrier called after the process group was shut down");
    using Clock = std::chrono::steady_clock;
    const auto timeout = op_timeout(opts.timeout);
    const Group& g = comm_->group;
    // Every rank numbers its calls alike, so the n-th call of each meets.
    const std::string at = "monitored_barrier/" + std::to_string(++monitored_barriers_) + "/";
    const std::string verdict = g.key(at + "verdict");
    const int me = getRank(), n = getSize();
    auto name = [&](int r) {
      std::string s = std::to_string(r);
      if (g.global(r) != r) s += " (global rank " + std::to_string(g.global(r)) + ")";
      return s;
    };
    if (me != 0) {
      boot_->set(g.key(at + "arrived/" + std::to_string(me)), "1");
      // Rank 0 may take the whole timeout to give up on a missing rank and
      // then post its verdict: wait for that a second timeout long.
      RSDP_CHECK_KIND(ErrorKind::kTimeout, boot_->wait({verdict}, 2 * timeout), g.me(),
                      ": monitored_barrier: Rank ", me,
                      " reached monitoredBarrier, but rank 0 did not answer within ",
                      2 * timeout.count(), " ms (", timed_out_waiting(2 * timeout.count()),
                      ")");
      records::Verdict v;
      const std::string err = records::decode_verdict(boot_->get(verdict),
                                                      {verdict, 0, g.who(0)}, v);
      RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), g.me(), ": monitored_barrier: ", err);
      RSDP_CHECK_KIND(ErrorKind::kTimeout, v.ok, g.me(), ": monitored_barrier failed on rank 0: ",
                      v.text);
      return;
    }
    const auto deadline = Clock::now() + timeout;
    std::vector<int> missing;
    for (int r = 1; r < n; ++r) {
      const std::string key = g.key(at + "arrived/" + std::to_string(r));
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      // Past the deadline only a check: the ranks still missing are late too.
      bool came = left.count() > 0 ? boot_->wait({key}, left) : boot_->check(key);
      if (came) continue;
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
    if (missing.empty()) {
      boot_->set(verdict, records::encode_verdict({}));
      return;
    }
    std::ostringstream msg;
    msg << (missing.size() == 1 ? "Rank " : "Ranks ");
    for (size_t i = 0; i < missing.size(); ++i) msg << (i ? ", " : "") << name(missing[i]);
    msg << " failed to pass monitoredBarrier in " << timeout.count() << " ms";
    boot_->set(verdict, records::encode_verdict({false, msg.str()}));
    RSDP_FAIL(ErrorKind::kTimeout, g.me(), ": monitored_barrier: ", msg.str());
  });
}

}  // namespace rsdp
