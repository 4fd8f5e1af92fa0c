// BackendRSDP::set_compression: which collectives cross nodes block-
// quantised (core/compression.h). The setting travels through the worker
// queue, so it takes effect between ops, in issue order, like a collective.
#include "algorithms/collectives.h"
#include "algorithms/group_comm.h"
#include "backend/backend_rsdp.h"
#include "backend/op_queue.h"

namespace rsdp {
namespace {

QuantBits parse_bits(const std::string& s, const char* what, bool int4_ok, int rank) {
  if (s == "none" || s.empty()) return QuantBits::kNone;
  if (s == "int8") return QuantBits::kInt8;
  if (s == "int4" && int4_ok) return QuantBits::kInt4;
  RSDP_FAIL(ErrorKind::kValue, "rsdp rank ", rank, ": set_compression: ", what, "='", s,
            "' is not one of ", int4_ok ? "'none', 'int8', 'int4'" : "'none', 'int8'",
            int4_ok ? "" : " (int4 is for reductions)");
}

}  // namespace

void BackendRSDP::set_compression(const std::string& all_gather,
                                  const std::string& reduce_scatter,
                                  const std::string& all_reduce, int64_t block,
                                  const std::string& ring_shift,
                                  const std::string& ring_shift_reduce) {
  translate_errors([&] {
    Compression c;
    c.all_gather = parse_bits(all_gather, "all_gather", false, global_rank_);
    c.reduce_scatter = parse_bits(reduce_scatter, "reduce_scatter", true, global_rank_);
    c.all_reduce = parse_bits(all_reduce, "all_reduce", true, global_rank_);
    c.ring_shift = parse_bits(ring_shift, "ring_shift", false, global_rank_);
    c.ring_shift_reduce = parse_bits(ring_shift_reduce, "ring_shift_reduce", true, global_rank_);
    RSDP_CHECK(block >= 32 && block <= (1 << 20) && block % 2 == 0, "rsdp rank ", global_rank_,
               ": set_compression: block=", block,
               " must be an even number of elements in [32, 1048576]");
    c.block = static_cast<size_t>(block);
    RSDP_CHECK(!shut_down_, "rsdp rank ", global_rank_,
               ": set_compression called after the process group was shut down");
    {
      std::lock_guard<std::mutex> g(compression_mu_);
      compression_ = c;
    }
    GroupComm* comm = comm_.get();
    OpQueue::Task task = [comm, c](bool run) {
      if (run) comm->compression = c;
    };
    if (!queue_->run_inline_if_idle(task)) queue_->push(std::move(task));
  });
}

std::unordered_map<std::string, std::string> BackendRSDP::compression() const {
  std::lock_guard<std::mutex> g(compression_mu_);
  return {{"all_gather", quant_name(compression_.all_gather)},
          {"reduce_scatter", quant_name(compression_.reduce_scatter)},
          {"all_reduce", quant_name(compression_.all_reduce)},
          {"ring_shift", quant_name(compression_.ring_shift)},
          {"ring_shift_reduce", quant_name(compression_.ring_shift_reduce)},
          {"block", std::to_string(compression_.block)}};
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::reduce_scatter_feedback(const at::Tensor& output,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& residual,
                                                                   bool average, bool async_op) {
  return translate_errors([&] {
    auto c = ctx("reduce_scatter_feedback");
    check_tensor(c, output, "output");
    check_same_dtype(c, output, {input}, "input");
    const int n = getSize();
    RSDP_CHECK(input.numel() == output.numel() * n, "rsdp rank ", global_rank_,
               ": reduce_scatter_feedback: input ", describe(input), " must have world size (",
               n, ") x output ", describe(output), " elements");
    // The residual holds one region of the output's size per node: the partial sums this
    // rank quantises are those of its rail (one rank per node), so that is all it can lose.
    const int nodes = topology().num_nodes();
    RSDP_CHECK(residual.defined() && residual.is_cpu() && residual.is_contiguous() &&
                   residual.scalar_type() == at::kFloat &&
                   residual.numel() == output.numel() * nodes,
               "rsdp rank ", global_rank_, ": reduce_scatter_feedback: residual ",
               residual.defined() ? describe(residual) : std::string("undefined"),
               " must be a contiguous float32 CPU tensor of nodes (", nodes, ") x output (",
               output.numel(), ") elements");
    DType dt = to_dtype(c, output);
    RSDP_CHECK(compressible(dt), "rsdp rank ", global_rank_,
               ": reduce_scatter_feedback: dtype ", describe(output),
               " is not float32, bfloat16 or float16");
    const RedOp op = average ? RedOp::kAvg : RedOp::kSum;
    at::Tensor out = output, dout = dense(output);
    at::Tensor in =
        input.is_contiguous() && !input.is_alias_of(output) ? input : input.contiguous().clone();
    at::Tensor res = residual;
    auto timeout = op_timeout(c10d::kUnsetTimeout);
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "rsdp:reduce_scatter_feedback", {output},
                   [=](GroupComm& comm) {
                     std::vector<const void*> ptrs;
                     std::vector<float*> rptrs;
                     std::vector<uint64_t> counts(n, out.numel());
                     const char* base = static_cast<const char*>(in.numel() ? in.data_ptr()
                                                                            : nullptr);
                     float* rbase = res.numel() ? res.data_ptr<float>() : nullptr;
                     for (int p = 0; p < n; ++p)
                       ptrs.push_back(base ? base + p * out.nbytes() : nullptr);
                     // Region m of the residual belongs to the rail member on node m.
                     rptrs.assign(n, nullptr);
                     if (rbase) {
                       const Topology& t = comm.topo;
                       for (int p : t.rail(t.local_rank()))
                         rptrs[p] = rbase + t.node_of[p] * out.numel();
                     }
                     coll::reduce_scatter(comm, ptrs.data(),
                                          dout.numel() ? dout.data_ptr() : nullptr,
                                          counts.data(), dt, op, timeout, rptrs.data());
                     write_back(out, dout);
                   },
                   async_op, output.device());
  });
}

}  // namespace rsdp
