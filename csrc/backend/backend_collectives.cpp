// BackendRSDP's collectives: validate on the calling thread, then queue the
// algorithm. Non-contiguous tensors run on a contiguous copy that is written
// back afterwards.
#include <numeric>

#include "algorithms/collectives.h"
#include "backend/backend_rsdp.h"

namespace rsdp {
namespace {

void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

// Several prepared collectives as one queued op: all were validated before
// any was queued, and the one Work fails if any of them fails.
BackendRSDP::Body sequence(std::vector<BackendRSDP::Body> bodies) {
  return [bodies = std::move(bodies)](GroupComm& comm) {
    for (const auto& b : bodies) b(comm);
  };
}

}  // namespace

using Work = c10::intrusive_ptr<c10d::Work>;

Work BackendRSDP::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("broadcast");
    check_one(c, tensors, "tensor");
    check_rank(c, opts.rootRank, getSize(), "root rank");
    at::Tensor t = tensors[0], d = dense(t);
    DType dt = to_dtype(c, t);
    int root = static_cast<int>(opts.rootRank);
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::BROADCAST, "rsdp:broadcast", tensors, [=](GroupComm& comm) {
      coll::broadcast(comm, ptr(d), d.numel(), dt, root, timeout);
      write_back(t, d);
    }, opts.asyncOp, t.device());
  });
}

Work BackendRSDP::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("all_reduce");
    RSDP_CHECK(tensors.size() == 1, "rsdp rank ", global_rank_,
               ": all_reduce: expects exactly one tensor, got ", tensors.size());
    if (tensors[0].defined() && tensors[0].layout() == at::kSparse)
      return allreduce_sparse(tensors, opts);
    check_one(c, tensors, "tensor");
    at::Tensor t = tensors[0], d = dense(t);
    DType dt = to_dtype(c, t);
    RedOp op = to_redop(c, opts.reduceOp, dt, t.is_cuda());
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::ALLREDUCE, "rsdp:all_reduce", tensors, [=](GroupComm& comm) {
      coll::allreduce(comm, ptr(d), d.numel(), dt, op, timeout);
      write_back(t, d);
    }, opts.asyncOp, t.device());
  });
}

Work BackendRSDP::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                      const c10d::AllreduceCoalescedOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("all_reduce_coalesced");
    RSDP_CHECK(!tensors.empty(), "rsdp rank ", global_rank_, ": all_reduce_coalesced: no tensors");
    check_same_dtype(c, tensors[0], tensors, "tensors");
    DType dt = to_dtype(c, tensors[0]);
    RedOp op = to_redop(c, opts.reduceOp, dt, tensors[0].is_cuda());
    auto timeout = op_timeout(opts.timeout);
    std::vector<at::Tensor> ts = tensors;
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "rsdp:all_reduce_coalesced", tensors,
                   [=](GroupComm& comm) {
                     // One flat buffer: one op, one set of synchronisations.
                     std::vector<at::Tensor> flat;
                     for (const auto& t : ts) flat.push_back(t.reshape({-1}));
                     at::Tensor buf = at::cat(flat);
                     coll::allreduce(comm, ptr(buf), buf.numel(), dt, op, timeout);
                     int64_t off = 0;
                     for (const auto& t : ts) {
                       t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
                       off += t.numel();
                     }
                   }, opts.asyncOp, ts[0].device());
  });
}

Work BackendRSDP::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("reduce");
    check_one(c, tensors, "tensor");
    check_rank(c, opts.rootRank, getSize(), "root rank");
    at::Tensor t = tensors[0], d = dense(t);
    DType dt = to_dtype(c, t);
    RedOp op = to_redop(c, opts.reduceOp, dt, t.is_cuda());
    int root = static_cast<int>(opts.rootRank);
    auto timeout = op_timeout(opts.timeout);
    bool is_root = getRank() == root;
    return enqueue(c10d::OpType::REDUCE, "rsdp:reduce", tensors, [=](GroupComm& comm) {
      coll::reduce(comm, ptr(d), d.numel(), dt, op, root, timeout);
      if (is_root) write_back(t, d);
    }, opts.asyncOp, t.device());
  });
}

BackendRSDP::Body BackendRSDP::prepare_allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::AllgatherOptions& opts) {
  {
    auto c = ctx("all_gather");
    check_one(c, inputs, "input");
    RSDP_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "rsdp rank ",
               global_rank_, ": all_gather: expects one output list of ", getSize(),
               " tensors (one per rank)");
    at::Tensor in = dense(inputs[0]);
    check_same_dtype(c, in, outputs[0], "output");
    RSDP_CHECK(outputs[0][getRank()].numel() == in.numel(), "rsdp rank ", global_rank_,
               ": all_gather: output[", getRank(), "] is ", describe(outputs[0][getRank()]),
               " but the input is ", describe(in), "; this rank's output must match its input");
    DType dt = to_dtype(c, in);
    std::vector<at::Tensor> outs = outputs[0], dense_outs;
    std::vector<uint64_t> counts;
    for (const auto& o : outs) {
      dense_outs.push_back(o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous));
      counts.push_back(o.numel());
    }
    auto timeout = op_timeout(opts.timeout);
    return [=](GroupComm& comm) {
      std::vector<void*> ptrs;
      for (const auto& o : dense_outs) ptrs.push_back(ptr(o));
      coll::allgather(comm, ptr(in), ptrs.data(), counts.data(), dt, timeout);
      for (size_t i = 0; i < outs.size(); ++i) write_back(outs[i], dense_outs[i]);
    };
  }
}

Work BackendRSDP::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                            std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return translate_errors([&] {
    Body body = prepare_allgather(outputs, inputs, opts);
    return enqueue(c10d::OpType::ALLGATHER, "rsdp:all_gather", outputs[0], std::move(body), opts.asyncOp,
                   inputs[0].device());
  });
}

BackendRSDP::Body BackendRSDP::prepare_allgather_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::AllgatherOptions& opts) {
  auto c = ctx("all_gather_into_tensor");
  check_tensor(c, input, "input");
  check_same_dtype(c, input, {output}, "output");
  RSDP_CHECK(output.numel() == input.numel() * getSize(), "rsdp rank ", global_rank_,
             ": all_gather_into_tensor: output ", describe(output), " must have world size (",
             getSize(), ") x input ", describe(input), " = ", input.numel() * getSize(),
             " elements");
  at::Tensor in = dense(input), out = output, dout = dense(output);
  DType dt = to_dtype(c, in);
  auto timeout = op_timeout(opts.timeout);
  int n = getSize();
  return [=](GroupComm& comm) {
    std::vector<void*> ptrs;
    std::vector<uint64_t> counts(n, in.numel());
    char* base = static_cast<char*>(ptr(dout));
    for (int p = 0; p < n; ++p) ptrs.push_back(base ? base + p * in.nbytes() : nullptr);
    coll::allgather(comm, ptr(in), ptrs.data(), counts.data(), dt, timeout);
    write_back(out, dout);
  };
}

Work BackendRSDP::_allgather_base(at::Tensor& output, at::Tensor& input,
                                  const c10d::AllgatherOptions& opts) {
  return translate_errors([&] {
    return enqueue(c10d::OpType::_ALLGATHER_BASE, "rsdp:all_gather_into_tensor", {output},
                   prepare_allgather_base(output, input, opts), opts.asyncOp, input.device());
  });
}

Work BackendRSDP::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                      std::vector<at::Tensor>& inputs,
                                      const c10d::AllgatherOptions& opts) {
  return translate_errors([&] {
    // torch's layout (its docstring, gloo): outputs[r][i] receives input i of
    // rank r, so there is one output list per rank, each as long as inputs.
    const int n = getSize();
    RSDP_CHECK(!inputs.empty(), "rsdp rank ", global_rank_, ": all_gather_coalesced: no inputs");
    RSDP_CHECK(static_cast<int>(outputs.size()) == n, "rsdp rank ", global_rank_,
               ": all_gather_coalesced: expects one output list per rank (", n, "), got ",
               outputs.size(), " lists");
    for (int r = 0; r < n; ++r)
      RSDP_CHECK(outputs[r].size() == inputs.size(), "rsdp rank ", global_rank_,
                 ": all_gather_coalesced: output list ", r, " has ", outputs[r].size(),
                 " tensors for ", inputs.size(), " inputs (outputs[rank][i] receives input i)");
    std::vector<Body> bodies;
    std::vector<at::Tensor> all_outputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> o(1);
      for (int r = 0; r < n; ++r) {
        RSDP_CHECK(outputs[r][i].numel() == inputs[i].numel(), "rsdp rank ", global_rank_,
                   ": all_gather_coalesced: outputs[", r, "][", i, "] is ",
                   describe(outputs[r][i]), " but input ", i, " is ", describe(inputs[i]),
                   "; they must have the same number of elements");
        o[0].push_back(outputs[r][i]);
      }
      std::vector<at::Tensor> in{inputs[i]};
      bodies.push_back(prepare_allgather(o, in, opts));
    }
    for (const auto& l : outputs) all_outputs.insert(all_outputs.end(), l.begin(), l.end());
    return enqueue(c10d::OpType::ALLGATHER_COALESCED, "rsdp:all_gather_coalesced", all_outputs,
                   sequence(std::move(bodies)), opts.asyncOp, inputs[0].device());
  });
}

Work BackendRSDP::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::AllgatherOptions& opts) {
  return translate_errors([&] {
    RSDP_CHECK(outputs.size() == inputs.size(), "rsdp rank ", global_rank_,
               ": all_gather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
               inputs.size(), " inputs");
    std::vector<Body> bodies;
    for (size_t i = 0; i < inputs.size(); ++i)
      bodies.push_back(prepare_allgather_base(outputs[i], inputs[i], opts));
    return enqueue(c10d::OpType::COALESCED, "rsdp:all_gather_into_tensor_coalesced", outputs,
                   sequence(std::move(bodies)), opts.asyncOp, inputs[0].device());
  });
}

Work BackendRSDP::gather(std::vector<std::vector<at::Tensor>>& outputs,
                         std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("gather");
    check_one(c, inputs, "input");
    check_rank(c, opts.rootRank, getSize(), "root rank");
    int root = static_cast<int>(opts.rootRank);
    at::Tensor in = dense(inputs[0]);
    std::vector<at::Tensor> outs, dense_outs;
    if (getRank() == root) {
      RSDP_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                 "rsdp rank ", global_rank_, ": gather: the root expects one output list of ",
                 getSize(), " tensors");
      check_same_dtype(c, in, outputs[0], "output");
      for (const auto& o : outputs[0]) {
        RSDP_CHECK(o.numel() == in.numel(), "rsdp rank ", global_rank_, ": gather: output ",
                   describe(o), " does not match input ", describe(in));
        outs.push_back(o);
        dense_outs.push_back(dense(o));
      }
    } else {
      RSDP_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "rsdp rank ",
                 global_rank_, ": gather: only the root (rank ", root, ") takes output tensors");
    }
    DType dt = to_dtype(c, in);
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::GATHER, "rsdp:gather", outs, [=](GroupComm& comm) {
      std::vector<void*> ptrs;
      for (const auto& o : dense_outs) ptrs.push_back(ptr(o));
      coll::gather(comm, ptr(in), ptrs.data(), in.numel(), dt, root, timeout);
      for (size_t i = 0; i < outs.size(); ++i) write_back(outs[i], dense_outs[i]);
    }, opts.asyncOp, in.device());
  });
}

Work BackendRSDP::scatter(std::vector<at::Tensor>& outputs,
                          std::vector<std::vector<at::Tensor>>& inputs,
                          const c10d::ScatterOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("scatter");
    check_one(c, outputs, "output");
    check_rank(c, opts.rootRank, getSize(), "root rank");
    int root = static_cast<int>(opts.rootRank);
    at::Tensor out = outputs[0], dout = dense(out);
    std::vector<at::Tensor> ins;
    if (getRank() == root) {
      RSDP_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                 "rsdp rank ", global_rank_, ": scatter: the root expects one input list of ",
                 getSize(), " tensors");
      check_same_dtype(c, out, inputs[0], "input");
      for (const auto& i : inputs[0]) {
        RSDP_CHECK(i.numel() == out.numel(), "rsdp rank ", global_rank_, ": scatter: input ",
                   describe(i), " does not match output ", describe(out));
        ins.push_back(dense(i));
      }
    } else {
      RSDP_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "rsdp rank ",
                 global_rank_, ": scatter: only the root (rank ", root, ") takes input tensors");
    }
    DType dt = to_dtype(c, out);
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::SCATTER, "rsdp:scatter", outputs, [=](GroupComm& comm) {
      std::vector<const void*> ptrs;
      for (const auto& i : ins) ptrs.push_back(ptr(i));
      coll::scatter(comm, ptrs.data(), ptr(dout), dout.numel(), dt, root, timeout);
      write_back(out, dout);
    }, opts.asyncOp, out.device());
  });
}

Work BackendRSDP::reduce_scatter(std::vector<at::Tensor>& outputs,
                                 std::vector<std::vector<at::Tensor>>& inputs,
                                 const c10d::ReduceScatterOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("reduce_scatter");
    check_one(c, outputs, "output");
    RSDP_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "rsdp rank ",
               global_rank_, ": reduce_scatter: expects one input list of ", getSize(),
               " tensors (one per rank)");
    at::Tensor out = outputs[0], dout = dense(out);
    check_same_dtype(c, out, inputs[0], "input");
    RSDP_CHECK(inputs[0][getRank()].numel() == out.numel(), "rsdp rank ", global_rank_,
               ": reduce_scatter: input[", getRank(), "] is ", describe(inputs[0][getRank()]),
               " but the output is ", describe(out), "; they must have the same number of elements");
    DType dt = to_dtype(c, out);
    RedOp op = to_redop(c, opts.reduceOp, dt, out.is_cuda());
    std::vector<at::Tensor> ins;
    std::vector<uint64_t> counts;
    for (const auto& i : inputs[0]) {
      // The output may alias an input; copy inputs that overlap it.
      ins.push_back(i.is_contiguous() && !i.is_alias_of(out) ? i : i.contiguous().clone());
      counts.push_back(i.numel());
    }
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::REDUCE_SCATTER, "rsdp:reduce_scatter", outputs,
                   [=](GroupComm& comm) {
                     std::vector<const void*> ptrs;
                     for (const auto& i : ins) ptrs.push_back(ptr(i));
                     coll::reduce_scatter(comm, ptrs.data(), ptr(dout), counts.data(), dt, op,
                                          timeout);
                     write_back(out, dout);
                   }, opts.asyncOp, out.device());
  });
}

BackendRSDP::Body BackendRSDP::prepare_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  auto c = ctx("reduce_scatter_tensor");
  check_tensor(c, output, "output");
  check_same_dtype(c, output, {input}, "input");
  RSDP_CHECK(input.numel() == output.numel() * getSize(), "rsdp rank ", global_rank_,
             ": reduce_scatter_tensor: input ", describe(input), " must have world size (",
             getSize(), ") x output ", describe(output), " = ", output.numel() * getSize(),
             " elements");
  DType dt = to_dtype(c, output);
  RedOp op = to_redop(c, opts.reduceOp, dt, output.is_cuda());
  at::Tensor out = output, dout = dense(output);
  at::Tensor in =
      input.is_contiguous() && !input.is_alias_of(output) ? input : input.contiguous().clone();
  auto timeout = op_timeout(opts.timeout);
  int n = getSize();
  return [=](GroupComm& comm) {
    std::vector<const void*> ptrs;
    std::vector<uint64_t> counts(n, out.numel());
    const char* base = static_cast<const char*>(ptr(in));
    for (int p = 0; p < n; ++p) ptrs.push_back(base ? base + p * out.nbytes() : nullptr);
    coll::reduce_scatter(comm, ptrs.data(), ptr(dout), counts.data(), dt, op, timeout);
    write_back(out, dout);
  };
}

Work BackendRSDP::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                       const c10d::ReduceScatterOptions& opts) {
  return translate_errors([&] {
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "rsdp:reduce_scatter_tensor", {output},
                   prepare_reduce_scatter_base(output, input, opts), opts.asyncOp, output.device());
  });
}

Work BackendRSDP::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                  std::vector<at::Tensor>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) {
  return translate_errors([&] {
    RSDP_CHECK(outputs.size() == inputs.size(), "rsdp rank ", global_rank_,
               ": reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
               inputs.size(), " inputs");
    std::vector<Body> bodies;
    for (size_t i = 0; i < inputs.size(); ++i)
      bodies.push_back(prepare_reduce_scatter_base(outputs[i], inputs[i], opts));
    return enqueue(c10d::OpType::COALESCED,  // torch 2.11 has no finer type
                   "rsdp:reduce_scatter_tensor_coalesced", outputs, sequence(std::move(bodies)), opts.asyncOp,
                   outputs.empty() ? c10::Device(c10::kCPU) : outputs[0].device());
  });
}

Work BackendRSDP::alltoall_base(at::Tensor& output, at::Tensor& input,
                                std::vector<int64_t>& output_splits,
                                std::vector<int64_t>& input_splits,
                                const c10d::AllToAllOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("all_to_all_single");
    check_tensor(c, input, "input");
    check_same_dtype(c, input, {output}, "output");
    const int n = getSize();
    auto rows = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* what) {
      int64_t dim0 = t.dim() ? t.size(0) : 1;
      if (splits.empty()) {
        RSDP_CHECK(dim0 % n == 0, "rsdp rank ", global_rank_, ": all_to_all_single: ", what, " ",
                   describe(t), " has ", dim0, " rows, not divisible by the world size ", n,
                   "; pass split sizes");
        splits.assign(n, dim0 / n);
      }
      RSDP_CHECK(static_cast<int>(splits.size()) == n, "rsdp rank ", global_rank_,
                 ": all_to_all_single: ", what, " split sizes have ", splits.size(),
                 " entries for a world size of ", n);
      int64_t sum = 0;
      for (int64_t s : splits) {
        RSDP_CHECK(s >= 0, "rsdp rank ", global_rank_, ": all_to_all_single: negative ", what,
                   " split size ", s);
        sum += s;
      }
      RSDP_CHECK(sum == dim0, "rsdp rank ", global_rank_, ": all_to_all_single: ", what,
                 " split sizes add up to ", sum, " but ", describe(t), " has ", dim0, " rows");
      int64_t row_bytes = dim0 ? static_cast<int64_t>(t.nbytes()) / dim0 : 0;
      std::vector<uint64_t> bytes, offs;
      int64_t off = 0;
      for (int64_t s : splits) {
        bytes.push_back(s * row_bytes);
        offs.push_back(off * row_bytes);
        off += s;
      }
      return std::make_pair(bytes, offs);
    };
    auto [sbytes, soffs] = rows(input, input_splits, "input");
    auto [rbytes, roffs] = rows(output, output_splits, "output");
    at::Tensor in = dense(input), out = output, dout = dense(output);
    DType dt = to_dtype(c, input);
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::ALLTOALL_BASE, "rsdp:all_to_all_single", {output},
                   [=](GroupComm& comm) {
                     std::vector<const void*> sp;
                     std::vector<void*> rp;
                     const char* ib = static_cast<const char*>(ptr(in));
                     char* ob = static_cast<char*>(ptr(dout));
                     for (int p = 0; p < n; ++p) {
                       sp.push_back(ib ? ib + soffs[p] : nullptr);
                       rp.push_back(ob ? ob + roffs[p] : nullptr);
                     }
                     coll::alltoall(comm, sp.data(), sbytes.data(), rp.data(), rbytes.data(), dt,
                                    timeout);
                     write_back(out, dout);
                   }, opts.asyncOp, out.device());
  });
}

Work BackendRSDP::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                           const c10d::AllToAllOptions& opts) {
  return translate_errors([&] {
    auto c = ctx("all_to_all");
    const int n = getSize();
    RSDP_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
               "rsdp rank ", global_rank_, ": all_to_all: expects ", n,
               " input and output tensors, got ", inputs.size(), " and ", outputs.size());
    check_tensor(c, inputs[0], "input");
    check_same_dtype(c, inputs[0], inputs, "input");
    check_same_dtype(c, inputs[0], outputs, "output");
    std::vector<at::Tensor> ins, outs = outputs, douts;
    std::vector<uint64_t> sbytes, rbytes;
    for (int p = 0; p < n; ++p) {
      ins.push_back(dense(inputs[p]));
      douts.push_back(dense(outputs[p]));
      sbytes.push_back(inputs[p].nbytes());
      rbytes.push_back(outputs[p].nbytes());
    }
    DType dt = to_dtype(c, inputs[0]);
    auto timeout = op_timeout(opts.timeout);
    return enqueue(c10d::OpType::ALLTOALL, "rsdp:all_to_all", outputs, [=](GroupComm& comm) {
      std::vector<const void*> sp;
      std::vector<void*> rp;
      for (int p = 0; p < n; ++p) {
        sp.push_back(ptr(ins[p]));
        rp.push_back(ptr(douts[p]));
      }
      coll::alltoall(comm, sp.data(), sbytes.data(), rp.data(), rbytes.data(), dt, timeout);
      for (int p = 0; p < n; ++p) write_back(outs[p], douts[p]);
    }, opts.asyncOp, inputs[0].device());
  });
}

}  // namespace rsdp
