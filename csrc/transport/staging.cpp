#include "transport/staging.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace rsdp {
void Staging::reduce(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                     RedOp op, int divisor, void* scratch) {
  if (count == 0 || nsrc <= 0) return;
  const int most = std::max(2, max_reduce_srcs());
  // Errors name the rank and the op.
  auto who = [&] { return group().me() + ": " + desc().describe(); };
  auto pass = [&](void* out, const void* const* in, int k, RedOp o) {
    try {
      reduce_pass(out, in, k, count, dt, o, divisor);
    } catch (const Error& e) {
      throw Error(e.kind(), detail::cat(who(), ", reducing ", k, " x ", count,
                                        " elements: ", e.what()));
    }
  };
  if (nsrc <= most) return pass(dst, srcs, nsrc, op);
  void* out = dst;
  for (int k = most; k < nsrc; ++k)
    if (srcs[k] == dst) {
      RSDP_CHECK_KIND(ErrorKind::kSystem, scratch != nullptr, who(),
                      ": internal error: the reduction's output aliases its source ", k, " of ",
                      nsrc, " and no scratch space was given");
      out = scratch;
      break;
    }
  // AVG: sum in every round, divide once in the last.
  const RedOp partial = op == RedOp::kAvg ? RedOp::kSum : op;
  int done = most;
  pass(out, srcs, done, partial);
  std::vector<const void*> round(most);
  while (done < nsrc) {
    const int take = std::min(nsrc - done, most - 1);
    round[0] = out;
    std::copy(srcs + done, srcs + done + take, round.begin() + 1);
    done += take;
    pass(out, round.data(), take + 1, done == nsrc ? op : partial);
  }
  if (out != dst) copy(dst, out, count * dtype_size(dt));
}

}  // namespace rsdp
