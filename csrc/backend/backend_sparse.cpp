// all_reduce of sparse COO tensors, as gloo does it (DDP relies on it for
// nn.Embedding(sparse=True) gradients).
//
// Ranks hold different index sets, so there is nothing to reduce element by
// element. Instead, on the worker:
//   1. coalesce the input (sorted, unique indices);
//   2. all-gather fixed-size metadata: sparse_dim, dense_dim, ndim, dtype, nnz
//      (every rank checks the others agree, so all raise the same error);
//   3. all-gather the sizes (ndim int64 each), checked the same way;
//   4. all-gather the indices (sparse_dim x nnz_r int64 from rank r) and the
//      values (nnz_r x dense elements) with the uneven all-gather;
//   5. sum the N sparse tensors, coalesce, divide by N for AVG, and copy the
//      result into the caller's tensor (a sparse copy_ resizes it), which is
//      also what the Work's future holds.
// Bytes: every rank receives every other rank's indices and values, as gloo.
#include <ATen/core/grad_mode.h>

#include "algorithms/collectives.h"
#include "backend/backend_rsdp.h"

namespace rsdp {
namespace {

void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

// All-gather `mine` (int64, same length on every rank) into n rows.
at::Tensor allgather_int64(GroupComm& comm, const at::Tensor& mine, int n,
                           std::chrono::milliseconds timeout) {
  at::Tensor all = at::empty({n, mine.numel()}, mine.options());
  std::vector<void*> ptrs;
  std::vector<uint64_t> counts(n, mine.numel());
  for (int r = 0; r < n; ++r) ptrs.push_back(ptr(all[r]));
  coll::allgather(comm, ptr(mine), ptrs.data(), counts.data(), DType::kInt64, timeout);
  return all;
}

// Uneven all-gather: rank r contributes counts[r] elements; returns one flat
// tensor per rank.
std::vector<at::Tensor> allgatherv(GroupComm& comm, const at::Tensor& mine,
                                   const std::vector<int64_t>& counts, DType dt,
                                   std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> outs;
  std::vector<void*> ptrs;
  std::vector<uint64_t> ucounts;
  for (int64_t c : counts) {
    outs.push_back(at::empty({c}, mine.options()));
    ptrs.push_back(ptr(outs.back()));
    ucounts.push_back(static_cast<uint64_t>(c));
  }
  coll::allgather(comm, ptr(mine), ptrs.data(), ucounts.data(), dt, timeout);
  return outs;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> BackendRSDP::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  auto c = ctx("all_reduce");
  at::Tensor t = tensors[0];
  RSDP_CHECK(t.device().is_cpu(), "rsdp rank ", global_rank_, ": all_reduce: sparse tensor ",
             describe(t), " is on ", t.device().str(), "; sparse tensors are served on CPU only");
  DType dt = to_dtype(c, t);
  RedOp op = to_redop(c, opts.reduceOp, dt, t.is_cuda());
  RSDP_CHECK(op == RedOp::kSum || op == RedOp::kAvg, "rsdp rank ", global_rank_,
             ": all_reduce: sparse tensor ", describe(t), ": reduce op ", redop_name(op),
             " is not defined for sparse tensors (SUM and AVG are)");
  const bool avg = op == RedOp::kAvg;
  auto timeout = op_timeout(opts.timeout);
  const int n = getSize();
  const int me = getRank();
  const int grank = global_rank_;
  auto body = [=](GroupComm& comm) {
    // The worker handles gradients: no autograd bookkeeping (as gloo).
    at::AutoDispatchBelowAutograd guard;
    at::Tensor in = t.coalesce();
    at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
    const auto i64 = at::TensorOptions().dtype(at::kLong);
    at::Tensor meta = at::tensor({in.sparse_dim(), in.dense_dim(), in.dim(),
                                  static_cast<int64_t>(in.scalar_type()), in._nnz()}, i64);
    at::Tensor metas = allgather_int64(comm, meta, n, timeout);
    auto m = metas.accessor<int64_t, 2>();
    for (int r = 0; r < n; ++r)
      for (int k = 0; k < 4; ++k)
        RSDP_CHECK(m[r][k] == m[me][k], "rsdp rank ", grank, ": all_reduce: sparse tensor ",
                   describe(in), " (sparse_dim ", m[me][0], ", dense_dim ", m[me][1],
                   ") does not match group rank ", r, "'s (dtype code ", m[r][3], ", sparse_dim ",
                   m[r][0], ", dense_dim ", m[r][1], ", ", m[r][2], " dims)");
    at::Tensor sizes = at::tensor(in.sizes().vec(), i64);
    at::Tensor all_sizes = allgather_int64(comm, sizes, n, timeout);
    for (int r = 0; r < n; ++r)
      RSDP_CHECK(all_sizes[r].equal(sizes), "rsdp rank ", grank, ": all_reduce: sparse tensor ",
                 describe(in), " does not match group rank ", r, "'s sizes ",
                 all_sizes[r].sizes(), " = ", c10::IntArrayRef(all_sizes[r].data_ptr<int64_t>(),
                                                                all_sizes[r].numel()));
    const int64_t sparse_dim = in.sparse_dim();
    int64_t dense_numel = 1;
    for (int64_t d = sparse_dim; d < in.dim(); ++d) dense_numel *= in.size(d);
    std::vector<int64_t> idx_counts, val_counts;
    for (int r = 0; r < n; ++r) {
      idx_counts.push_back(sparse_dim * m[r][4]);
      val_counts.push_back(dense_numel * m[r][4]);
    }
    auto idxs = allgatherv(comm, idx.reshape({-1}), idx_counts, DType::kInt64, timeout);
    auto vals = allgatherv(comm, val.reshape({-1}), val_counts, dt, timeout);
    std::vector<int64_t> val_shape = val.sizes().vec();
    at::Tensor out;
    for (int r = 0; r < n; ++r) {
      val_shape[0] = m[r][4];
      at::Tensor s = at::sparse_coo_tensor(idxs[r].view({sparse_dim, m[r][4]}),
                                           vals[r].view(val_shape), in.sizes(), in.options());
      out = r == 0 ? s : out + s;
    }
    out = out.coalesce();
    if (avg) {  // divide the values: the indices of a coalesced tensor stay as they are
      at::Tensor v = out._values();
      // integers as NCCL averages them (host_redop_supported): truncating toward zero
      v = v.is_floating_point() || v.is_complex() ? v / n : at::div(v, n, "trunc");
      out = at::sparse_coo_tensor(out._indices(), v, out.sizes(), out.options())._coalesced_(true);
    }
    t.copy_(out);
  };
  return enqueue(c10d::OpType::ALLREDUCE, "rsdp:all_reduce", tensors, std::move(body),
                 opts.asyncOp, t.device());
}

}  // namespace rsdp
