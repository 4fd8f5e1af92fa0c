"""The collective families of the correctness matrix, importable by any test module.

A family is ``fam_x(ctx, rec)``: it runs many cases of one collective inside one process
group (see harness.run_families) and checks each exactly against values.py. The element
counts, dtypes and reduce ops default to the full matrix (values.COUNTS, ALL_DTYPES,
ops_for); a worker can narrow them for a run by setting ``ctx.counts``, ``ctx.dtypes`` or
``ctx.ops`` (a set of op names) before calling run_families (use_reduced_matrix: the
4-rank batch of test_collectives.py and every emulated-node batch of test_multinode.py).

Every tensor a family creates (inputs, output buffers, expected values) comes from torch's
factory functions without an explicit device, so the families run on whatever device the
worker made the default: tests/cuda/test_cuda.py calls ``torch.set_default_device("cuda:<i>")``
and runs them on GPU tensors.
"""

from __future__ import annotations

import time

import torch

# Reduced matrix: one dtype per kernel family (float, half float, integer, bool -- also an
# odd byte count --, complex) and the ops that take different code paths (plain sum, AVG's
# division, a comparison, a bitwise op). Counts stay complete: 0, 1, 7 (fewer elements than
# ranks: empty chunks) and one above the staging size. The full dtype x op matrix runs at 1, 2
# and 3 ranks on one node (test_collectives.py, 2 and 3 also under ASan); the kernels are the
# same whatever the number of ranks or nodes, so larger groups and emulated nodes, which
# change how the buffers are cut and sent, run this one.
REDUCED = {"dtypes": ("float32", "bfloat16", "int64", "bool", "complex64"),
           "ops": ("SUM", "AVG", "MAX", "BXOR")}


def use_reduced_matrix(ctx) -> None:
    """Narrows a worker's run_families to REDUCED."""
    ctx.dtypes = tuple(getattr(torch, d) for d in REDUCED["dtypes"])
    ctx.ops = set(REDUCED["ops"])
import torch.distributed as dist

from .values import (
    ALL_DTYPES,
    COMPLEX,
    COUNTS,
    LARGE,
    OP_NAMES,
    check_equal,
    dname,
    garbage,
    make,
    make_for_op,
    ops_for,
    reduce_ref,
)


def dtypes(ctx) -> tuple:
    return getattr(ctx, "dtypes", None) or ALL_DTYPES


def counts(ctx) -> tuple:
    return getattr(ctx, "counts", None) or COUNTS


def ops(ctx, dtype) -> list[str]:
    chosen = getattr(ctx, "ops", None)
    # the device kernels and NCCL's path do not average integers (CUDA tensors refuse it)
    device_int_avg = str(getattr(ctx, "device", "cpu")).startswith("cuda") and not (
        dtype.is_floating_point or dtype.is_complex)
    return [op for op in ops_for(dtype) if (chosen is None or op in chosen)
            and not (op == "AVG" and device_int_avg)]


def _split(src: int, dst: int, n: int) -> int:
    """Uneven all_to_all split sizes; includes zero-size splits."""
    return (n * ((src + 2 * dst) % 3)) // 2


# --------------------------------------------------------------------------------------------
# Families (run inside workers)
# --------------------------------------------------------------------------------------------


def fam_broadcast(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for root in range(W):
        for dtype in dtypes(ctx):
            for n in counts(ctx):
                with rec.case(f"root={root} {dname(dtype)} n={n}"):
                    exp = make("move", root, n, dtype, W)
                    t = exp.clone() if r == root else garbage(n, dtype)
                    dist.broadcast(t, src=root)
                    check_equal(t, exp, "broadcast output")


def fam_all_reduce(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for op in ops(ctx, dtype):
            for n in counts(ctx):
                with rec.case(f"{dname(dtype)} {op} n={n}"):
                    t = make_for_op(op, r, n, dtype, W)
                    dist.all_reduce(t, op=OP_NAMES[op])
                    exp = reduce_ref(op, [make_for_op(op, q, n, dtype, W) for q in range(W)])
                    check_equal(t, exp, "all_reduce output")


def _coalesced_inputs(op, r, dtype, W):
    shapes = [(7,), (0,), (LARGE,), (1,), (3, 5)]
    return [make_for_op(op, r, int(torch.Size(s).numel()), dtype, W, salt=k).view(s)
            for k, s in enumerate(shapes)]


def _coalesced_expected(op, dtype, W):
    per_rank = [_coalesced_inputs(op, q, dtype, W) for q in range(W)]
    return [reduce_ref(op, [pr[k].reshape(-1) for pr in per_rank]).view(per_rank[0][k].shape)
            for k in range(len(per_rank[0]))]


def fam_all_reduce_coalesced(ctx, rec):
    """dist.all_reduce_coalesced (the public API) on a list of tensors of mixed sizes."""
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for op in ops(ctx, dtype):
            with rec.case(f"{dname(dtype)} {op}"):
                ts = _coalesced_inputs(op, r, dtype, W)
                dist.all_reduce_coalesced(ts, op=OP_NAMES[op])
                for k, (t, e) in enumerate(zip(ts, _coalesced_expected(op, dtype, W))):
                    check_equal(t, e, f"all_reduce_coalesced tensor {k}")


def fam_all_reduce_coalescing_manager(ctx, rec):
    """all_reduce inside dist._coalescing_manager (sync and async) -> allreduce_coalesced."""
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for op in ("SUM", "MAX") if dtype not in COMPLEX else ("SUM",):
            for async_ops in (False, True):
                with rec.case(f"{dname(dtype)} {op} async_ops={async_ops}"):
                    ts = _coalesced_inputs(op, r, dtype, W)
                    with dist._coalescing_manager(async_ops=async_ops) as cm:
                        for t in ts:
                            dist.all_reduce(t, op=OP_NAMES[op])
                    if async_ops:
                        cm.wait()
                    for k, (t, e) in enumerate(zip(ts, _coalesced_expected(op, dtype, W))):
                        check_equal(t, e, f"coalesced all_reduce tensor {k}")


def fam_reduce(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for root in range(W):
        for dtype in dtypes(ctx):
            for op in ops(ctx, dtype):
                for n in counts(ctx):
                    with rec.case(f"root={root} {dname(dtype)} {op} n={n}"):
                        t = make_for_op(op, r, n, dtype, W)
                        dist.reduce(t, dst=root, op=OP_NAMES[op])
                        if r == root:
                            exp = reduce_ref(op, [make_for_op(op, q, n, dtype, W) for q in range(W)])
                            check_equal(t, exp, "reduce output on root")


def fam_all_gather(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            with rec.case(f"{dname(dtype)} n={n}"):
                inp = make("move", r, n, dtype, W)
                out = [garbage(n, dtype) for _ in range(W)]
                dist.all_gather(out, inp)
                for q in range(W):
                    check_equal(out[q], make("move", q, n, dtype, W), f"all_gather output[{q}]")
                check_equal(inp, make("move", r, n, dtype, W), "all_gather input (must be unchanged)")


def fam_all_gather_into_tensor(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            exp = torch.cat([make("move", q, n, dtype, W) for q in range(W)])
            with rec.case(f"{dname(dtype)} n={n} concat"):
                out = garbage(W * n, dtype)
                dist.all_gather_into_tensor(out, make("move", r, n, dtype, W))
                check_equal(out, exp, "all_gather_into_tensor output")
            if n == 0:
                continue
            with rec.case(f"{dname(dtype)} n={n} stacked"):
                out = garbage(W * n, dtype).view(W, n)
                dist.all_gather_into_tensor(out, make("move", r, n, dtype, W))
                check_equal(out, exp.view(W, n), "all_gather_into_tensor stacked output")


def fam_all_gather_into_tensor_coalesced(ctx, rec):
    """all_gather_into_tensor inside _coalescing_manager -> allgather_into_tensor_coalesced."""
    W, r = ctx.world_size, ctx.rank
    ns = (1, 7, LARGE, 0)
    for dtype in dtypes(ctx):
        for async_ops in (False, True):
            with rec.case(f"{dname(dtype)} async_ops={async_ops}"):
                ins = [make("move", r, n, dtype, W, salt=k) for k, n in enumerate(ns)]
                outs = [garbage(W * n, dtype) for n in ns]
                with dist._coalescing_manager(async_ops=async_ops) as cm:
                    for o, i in zip(outs, ins):
                        dist.all_gather_into_tensor(o, i)
                if async_ops:
                    cm.wait()
                for k, n in enumerate(ns):
                    exp = torch.cat([make("move", q, n, dtype, W, salt=k) for q in range(W)])
                    check_equal(outs[k], exp, f"coalesced all_gather_into_tensor output {k}")


def fam_gather(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for root in range(W):
        for dtype in dtypes(ctx):
            for n in counts(ctx):
                with rec.case(f"root={root} {dname(dtype)} n={n}"):
                    gl = [garbage(n, dtype) for _ in range(W)] if r == root else None
                    dist.gather(make("move", r, n, dtype, W), gather_list=gl, dst=root)
                    if r == root:
                        for q in range(W):
                            check_equal(gl[q], make("move", q, n, dtype, W), f"gather_list[{q}]")


def fam_scatter(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for root in range(W):
        for dtype in dtypes(ctx):
            for n in counts(ctx):
                with rec.case(f"root={root} {dname(dtype)} n={n}"):
                    sl = ([make("move", q, n, dtype, W, salt=root) for q in range(W)]
                          if r == root else None)
                    out = garbage(n, dtype)
                    dist.scatter(out, scatter_list=sl, src=root)
                    check_equal(out, make("move", r, n, dtype, W, salt=root), "scatter output")


def _rs_inputs(op, r, n, dtype, W):
    return [make_for_op(op, r, n, dtype, W, salt=j) for j in range(W)]


def _rs_expected(op, r, n, dtype, W):
    return reduce_ref(op, [make_for_op(op, q, n, dtype, W, salt=r) for q in range(W)])


def fam_reduce_scatter(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for op in ops(ctx, dtype):
            for n in counts(ctx):
                with rec.case(f"{dname(dtype)} {op} n={n}"):
                    out = garbage(n, dtype)
                    dist.reduce_scatter(out, _rs_inputs(op, r, n, dtype, W), op=OP_NAMES[op])
                    check_equal(out, _rs_expected(op, r, n, dtype, W), "reduce_scatter output")


def fam_reduce_scatter_tensor(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for op in ops(ctx, dtype):
            for n in counts(ctx):
                with rec.case(f"{dname(dtype)} {op} n={n}"):
                    out = garbage(n, dtype)
                    dist.reduce_scatter_tensor(out, torch.cat(_rs_inputs(op, r, n, dtype, W)),
                                               op=OP_NAMES[op])
                    check_equal(out, _rs_expected(op, r, n, dtype, W), "reduce_scatter_tensor output")
        for n in (7, LARGE):
            with rec.case(f"{dname(dtype)} SUM n={n} stacked input"):
                out = garbage(n, dtype)
                dist.reduce_scatter_tensor(out, torch.stack(_rs_inputs("SUM", r, n, dtype, W)))
                check_equal(out, _rs_expected("SUM", r, n, dtype, W), "reduce_scatter_tensor output")


def fam_reduce_scatter_tensor_coalesced(ctx, rec):
    """reduce_scatter_tensor inside _coalescing_manager -> reduce_scatter_tensor_coalesced."""
    W, r = ctx.world_size, ctx.rank
    ns = (1, 7, LARGE, 0)
    for dtype in dtypes(ctx):
        for op in ("SUM", "MAX") if dtype not in COMPLEX else ("SUM",):
            for async_ops in (False, True):
                with rec.case(f"{dname(dtype)} {op} async_ops={async_ops}"):
                    outs = [garbage(n, dtype) for n in ns]
                    ins = [torch.cat([make_for_op(op, r, n, dtype, W, salt=10 * k + j)
                                      for j in range(W)]) for k, n in enumerate(ns)]
                    with dist._coalescing_manager(async_ops=async_ops) as cm:
                        for o, i in zip(outs, ins):
                            dist.reduce_scatter_tensor(o, i, op=OP_NAMES[op])
                    if async_ops:
                        cm.wait()
                    for k, n in enumerate(ns):
                        exp = reduce_ref(op, [make_for_op(op, q, n, dtype, W, salt=10 * k + r)
                                              for q in range(W)])
                        check_equal(outs[k], exp, f"coalesced reduce_scatter_tensor output {k}")


def fam_all_to_all(ctx, rec):
    """List form; equal and uneven (including zero-size) chunks."""
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            for uneven in (False, True):
                sz = (lambda s, d: _split(s, d, n)) if uneven else (lambda s, d: n)
                with rec.case(f"{dname(dtype)} n={n} uneven={uneven}"):
                    ins = [make("move", r, sz(r, j), dtype, W, salt=j) for j in range(W)]
                    outs = [garbage(sz(j, r), dtype) for j in range(W)]
                    dist.all_to_all(outs, ins)
                    for j in range(W):
                        check_equal(outs[j], make("move", j, sz(j, r), dtype, W, salt=r),
                                    f"all_to_all output[{j}]")


def fam_all_to_all_single(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            for mode in ("equal", "equal-explicit", "uneven"):
                sz = (lambda s, d: _split(s, d, n)) if mode == "uneven" else (lambda s, d: n)
                with rec.case(f"{dname(dtype)} n={n} {mode}"):
                    inp = torch.cat([make("move", r, sz(r, j), dtype, W, salt=j) for j in range(W)])
                    exp = torch.cat([make("move", j, sz(j, r), dtype, W, salt=r) for j in range(W)])
                    out = garbage(exp.numel(), dtype)
                    if mode == "equal":
                        dist.all_to_all_single(out, inp)
                    else:
                        dist.all_to_all_single(out, inp,
                                               output_split_sizes=[sz(j, r) for j in range(W)],
                                               input_split_sizes=[sz(r, j) for j in range(W)])
                    check_equal(out, exp, "all_to_all_single output")


def fam_send_recv(ctx, rec):
    """Every ordered (src, dst) pair, blocking send/recv with explicit src."""
    W, r = ctx.world_size, ctx.rank
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            for src in range(W):
                for dst in range(W):
                    if src == dst or r not in (src, dst):
                        continue
                    with rec.case(f"{dname(dtype)} n={n} {src}->{dst}", ranks=(src, dst)):
                        data = make("move", src, n, dtype, W, salt=dst)
                        if r == src:
                            dist.send(data, dst=dst)
                        else:
                            t = garbage(n, dtype)
                            got = dist.recv(t, src=src)
                            assert got == src, f"recv returned {got}, expected {src}"
                            check_equal(t, data, f"recv from {src}")


def fam_recv_anysource(ctx, rec):
    """dist.recv(t) without src on rank 0 returns the sender rank."""
    W, r = ctx.world_size, ctx.rank
    for n in (1, 7, LARGE, 0):
        for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
            with rec.case(f"{dname(dtype)} n={n}"):
                if r == 0:
                    seen = []
                    for _ in range(W - 1):
                        t = garbage(n, dtype)
                        s = dist.recv(t)
                        assert isinstance(s, int) and 1 <= s < W, f"recv returned sender {s!r}"
                        seen.append(s)
                        check_equal(t, make("move", s, n, dtype, W), f"recv(any) data from {s}")
                    assert sorted(seen) == list(range(1, W)), f"senders seen: {seen}"
                else:
                    dist.send(make("move", r, n, dtype, W), dst=0)
            # keep rounds apart so an any-source recv cannot match the next round's message
            with rec.case(f"{dname(dtype)} n={n} barrier"):
                dist.barrier()


def fam_isend_irecv(ctx, rec):
    """Ring exchange with isend/irecv, then a bidirectional ring with batch_isend_irecv."""
    W, r = ctx.world_size, ctx.rank
    nxt, prv = (r + 1) % W, (r - 1) % W
    for dtype in dtypes(ctx):
        for n in counts(ctx):
            with rec.case(f"isend/irecv {dname(dtype)} n={n}"):
                buf = garbage(n, dtype)
                rr = dist.irecv(buf, src=prv)
                sr = dist.isend(make("move", r, n, dtype, W), dst=nxt)
                sr.wait()
                rr.wait()
                check_equal(buf, make("move", prv, n, dtype, W), "irecv from predecessor")
            with rec.case(f"batch_isend_irecv {dname(dtype)} n={n}"):
                from_prev, from_next = garbage(n, dtype), garbage(n, dtype)
                ops = [
                    dist.P2POp(dist.isend, make("move", r, n, dtype, W, salt=1), nxt),
                    dist.P2POp(dist.irecv, from_prev, prv),
                    dist.P2POp(dist.isend, make("move", r, n, dtype, W, salt=2), prv),
                    dist.P2POp(dist.irecv, from_next, nxt),
                ]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                check_equal(from_prev, make("move", prv, n, dtype, W, salt=1), "from predecessor")
                check_equal(from_next, make("move", nxt, n, dtype, W, salt=2), "from successor")


def fam_barrier(ctx, rec):
    """Nobody leaves a barrier before the last rank entered it."""
    W, r = ctx.world_size, ctx.rank
    for it in range(3):
        late = it % W
        with rec.case(f"barrier late_rank={late}"):
            if r == late:
                time.sleep(0.5)
                entered = time.time()
                ctx.store.set(f"barrier_enter/{it}", repr(entered))
            dist.barrier()
            left = time.time()
            entered = float(ctx.store.get(f"barrier_enter/{it}"))
            assert left >= entered, (
                f"rank {r} left barrier {entered - left:.3f}s before rank {late} entered it")
    with rec.case("many barriers"):
        for _ in range(50):
            dist.barrier()


def fam_objects(ctx, rec):
    W, r = ctx.world_size, ctx.rank

    def obj(q):
        return {"rank": q, "items": list(range(q * 3)), "blob": bytes([q + 1]) * (q * 70_000),
                "nested": ("x" * q, {q: [q] * q})}

    with rec.case("all_gather_object"):
        out = [None] * W
        dist.all_gather_object(out, obj(r))
        for q in range(W):
            assert out[q] == obj(q), f"all_gather_object[{q}] = {str(out[q])[:200]}"
    for root in range(W):
        with rec.case(f"broadcast_object_list root={root}"):
            objs = [obj(root), "s" * 100_001, root] if r == root else [None, None, None]
            dist.broadcast_object_list(objs, src=root)
            assert objs == [obj(root), "s" * 100_001, root], f"got {str(objs)[:200]}"


def fam_noncontiguous(ctx, rec):
    """all_reduce / broadcast on transposed and strided views: results land in the view."""
    W, r = ctx.world_size, ctx.rank
    for dtype in (torch.float32, torch.int32, torch.bfloat16, torch.complex128, torch.uint8):
        op = "SUM"
        for rows, cols in ((5, 7), (317, 331)):  # 331*317 = 104_927 elements > staging
            n = rows * cols
            with rec.case(f"all_reduce transposed {dname(dtype)} {rows}x{cols}"):
                base = make_for_op(op, r, n, dtype, W).view(rows, cols)
                v = base.t()
                assert not v.is_contiguous()
                dist.all_reduce(v, op=OP_NAMES[op])
                exp = reduce_ref(op, [make_for_op(op, q, n, dtype, W) for q in range(W)])
                check_equal(base, exp.view(rows, cols), "base of transposed view after all_reduce")
            with rec.case(f"all_reduce strided {dname(dtype)} {rows}x{cols}"):
                big = make_for_op(op, r, 2 * n, dtype, W)
                v = big[::2]
                dist.all_reduce(v, op=OP_NAMES[op])
                exp = reduce_ref(op, [make_for_op(op, q, 2 * n, dtype, W) for q in range(W)])
                check_equal(big[::2], exp[::2], "strided view after all_reduce")
                check_equal(big[1::2], make_for_op(op, r, 2 * n, dtype, W)[1::2],
                            "elements between the strided view (must be untouched)")
            for root in range(W):
                with rec.case(f"broadcast transposed+strided root={root} {dname(dtype)} {rows}x{cols}"):
                    src_data = make("move", root, n, dtype, W).view(rows, cols)
                    base = garbage(2 * n, dtype).view(rows, 2 * cols)
                    v = base[:, ::2].t()  # transposed and strided
                    if r == root:
                        v.copy_(src_data.t())
                    dist.broadcast(v, src=root)
                    check_equal(base[:, ::2].contiguous(), src_data, "broadcast into view")
                    check_equal(base[:, 1::2].contiguous(), garbage(n, dtype).view(rows, cols),
                                "elements outside the view (must be untouched)")


def fam_async(ctx, rec):
    """Async ops: wait(), is_completed(), get_future(), many outstanding works.

    wait() and is_completed() mean what they mean for the device of the tensors:

    * CPU (gloo's meaning): wait() returns once the op has finished, so is_completed() is
      True right after it.
    * CUDA (ProcessGroupNCCL's meaning): wait() only makes the caller's current stream wait
      for the op and returns at once; is_completed() says whether the GPU has finished, so
      it may still be False right after wait(). Once the GPU is idle
      (torch.cuda.synchronize()) it must turn True shortly: the backend's watchdog polls the
      op's done event.
    """
    W, r = ctx.world_size, ctx.rank
    # How long is_completed() may lag behind torch.cuda.synchronize() on CUDA: the watchdog
    # looks every 200 us, so 5 s is generous even on a loaded machine.
    cuda_completion_s = 5.0

    def assert_completed_after_wait(works, like, what):
        """The works were all waited for; `like` is a tensor of theirs (it names the device)."""
        if like.device.type != "cuda":
            pending = [k for k, w in enumerate(works) if not w.is_completed()]
            assert not pending, (
                f"{what}: is_completed() is False after wait() on CPU tensors for {len(pending)} "
                f"of {len(works)} works (first: {pending[:5]}); on CPU wait() returns only once "
                "the op has finished")
            return
        torch.cuda.synchronize(like.device)
        deadline = time.monotonic() + cuda_completion_s
        while True:
            pending = [k for k, w in enumerate(works) if not w.is_completed()]
            if not pending:
                return
            assert time.monotonic() < deadline, (
                f"{what}: is_completed() still False for {len(pending)} of {len(works)} works "
                f"(first: {pending[:5]}) {cuda_completion_s:g} s after wait() and "
                "torch.cuda.synchronize() on CUDA tensors; with ProcessGroupNCCL's meaning "
                "wait() only orders the current stream, but once the GPU has finished the op "
                "is_completed() must turn True")
            time.sleep(0.001)

    with rec.case("work.wait / is_completed / get_future"):
        t = make("sum", r, LARGE, torch.float32, W)
        work = dist.all_reduce(t, async_op=True)
        assert work is not None
        work.wait()
        assert_completed_after_wait([work], t, "async all_reduce")
        exp = reduce_ref("SUM", [make("sum", q, LARGE, torch.float32, W) for q in range(W)])
        check_equal(t, exp, "async all_reduce output")
        fut_val = work.get_future().wait()
        assert isinstance(fut_val, list) and len(fut_val) >= 1, f"future value {type(fut_val)}"
        check_equal(fut_val[0], exp, "get_future().wait()[0]")
    with rec.case("get_future without wait + then()"):
        t = make("sum", r, 1000, torch.float64, W, salt=3)
        fut = dist.all_reduce(t, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        exp = reduce_ref("SUM", [make("sum", q, 1000, torch.float64, W, salt=3) for q in range(W)])
        check_equal(doubled, exp * 2, "future.then(...) value")
        check_equal(t, exp, "all_reduce output after future completed")
    with rec.case("is_completed becomes true without wait()"):
        t = make("sum", r, 7, torch.int64, W, salt=4)
        work = dist.all_reduce(t, async_op=True)
        deadline = time.monotonic() + 30
        while not work.is_completed():
            assert time.monotonic() < deadline, "is_completed() never became True"
            time.sleep(0.001)
        exp = reduce_ref("SUM", [make("sum", q, 7, torch.int64, W, salt=4) for q in range(W)])
        check_equal(t, exp, "all_reduce output after is_completed()")
        work.wait()
    with rec.case("async broadcast get_future"):
        exp = make("move", 0, 999, torch.int32, W)
        t = exp.clone() if r == 0 else garbage(999, torch.int32)
        v = dist.broadcast(t, src=0, async_op=True).get_future().wait()
        check_equal(t, exp, "async broadcast output")
        check_equal(v[0], exp, "async broadcast future value")
    with rec.case("async all_gather_into_tensor / reduce_scatter_tensor"):
        out = garbage(W * 513, torch.float32)
        w1 = dist.all_gather_into_tensor(out, make("move", r, 513, torch.float32, W), async_op=True)
        rs_out = garbage(513, torch.float32)
        w2 = dist.reduce_scatter_tensor(rs_out, torch.cat(_rs_inputs("SUM", r, 513, torch.float32, W)),
                                        async_op=True)
        w2.wait()
        w1.wait()
        check_equal(out, torch.cat([make("move", q, 513, torch.float32, W) for q in range(W)]),
                    "async all_gather_into_tensor")
        check_equal(rs_out, _rs_expected("SUM", r, 513, torch.float32, W), "async reduce_scatter_tensor")
    with rec.case("1000 outstanding async all_reduces, waited in reverse order"):
        N = 1000
        sizes = [1 + (k * 37) % 301 for k in range(N)]
        ts = [make("sum", r, sizes[k], torch.float32, W, salt=k) for k in range(N)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in reversed(works):
            w.wait()
        bad = []
        for k in range(N):
            exp = reduce_ref("SUM", [make("sum", q, sizes[k], torch.float32, W, salt=k) for q in range(W)])
            if not torch.equal(ts[k], exp):
                bad.append(k)
        assert not bad, f"{len(bad)} of {N} outstanding all_reduces wrong, first: {bad[:10]}"
        assert_completed_after_wait(works, ts[0], f"{N} outstanding all_reduces")


def fam_subgroups(ctx, rec):
    """Several groups alive at once (incl. odd-sized ones) used in interleaved order."""
    W, r = ctx.world_size, ctx.rank
    specs = [list(range(0, W, 2)), list(range(1, W, 2)), list(range(W - 1)), list(range(1, W)),
             list(range(W))]
    specs = [s for s in specs if s]
    groups = []
    with rec.case("new_group"):
        for s in specs:
            groups.append((s, dist.new_group(ranks=s)))
        for s, g in groups:
            if r in s:
                assert dist.get_world_size(g) == len(s), f"group {s} size {dist.get_world_size(g)}"
                assert dist.get_rank(g) == s.index(r), f"group {s} rank {dist.get_rank(g)}"
    for it in range(12):
        order = groups[it % len(groups):] + groups[: it % len(groups)]
        for gi, (s, g) in enumerate(order):
            if r not in s:
                continue
            kind = (it + gi) % 4
            gr, gw = s.index(r), len(s)
            n = (7, 1, LARGE, 33)[(it + gi) % 4]
            salt = 100 * it + gi
            with rec.case(f"it={it} group={s} kind={kind}", ranks=s):
                if kind == 0:
                    t = make("sum", gr, n, torch.float32, gw, salt=salt)
                    dist.all_reduce(t, group=g)
                    exp = reduce_ref("SUM", [make("sum", q, n, torch.float32, gw, salt=salt)
                                             for q in range(gw)])
                    check_equal(t, exp, f"all_reduce on {s}")
                elif kind == 1:
                    root = it % gw
                    exp = make("move", root, n, torch.int64, gw, salt=salt)
                    t = exp.clone() if gr == root else garbage(n, torch.int64)
                    dist.broadcast(t, group=g, group_src=root)
                    check_equal(t, exp, f"broadcast on {s} from group rank {root}")
                elif kind == 2:
                    out = garbage(gw * n, torch.bfloat16)
                    dist.all_gather_into_tensor(out, make("move", gr, n, torch.bfloat16, gw, salt=salt),
                                                group=g)
                    exp = torch.cat([make("move", q, n, torch.bfloat16, gw, salt=salt) for q in range(gw)])
                    check_equal(out, exp, f"all_gather_into_tensor on {s}")
                else:
                    # two async ops on this group and one on the world, waited out of order
                    a = make("sum", gr, n, torch.int32, gw, salt=salt)
                    b = make("sum", r, 5, torch.float64, W, salt=salt)
                    wa = dist.all_reduce(a, group=g, async_op=True)
                    wb = None
                    if s == list(range(W)):
                        wb = dist.all_reduce(b, async_op=True)
                    wa.wait()
                    if wb is not None:
                        wb.wait()
                        check_equal(b, reduce_ref("SUM", [make("sum", q, 5, torch.float64, W, salt=salt)
                                                          for q in range(W)]), "world all_reduce")
                    check_equal(a, reduce_ref("SUM", [make("sum", q, n, torch.int32, gw, salt=salt)
                                                      for q in range(gw)]), f"async all_reduce on {s}")
    with rec.case("destroy subgroups"):
        for _, g in groups:
            if r in _:
                dist.destroy_process_group(g)


def fam_reinit(ctx, rec):
    """destroy_process_group() then a second init_process_group in the same process."""
    W, r = ctx.world_size, ctx.rank
    for round_ in range(2):
        with rec.case(f"destroy + init round {round_}"):
            dist.destroy_process_group()
            assert not dist.is_initialized()
            ctx.init_pg()
            assert dist.get_rank() == r and dist.get_world_size() == W
            assert dist.get_backend() == ctx.backend, dist.get_backend()
        with rec.case(f"collectives after re-init round {round_}"):
            t = make("sum", r, LARGE, torch.float32, W, salt=round_)
            dist.all_reduce(t)
            check_equal(t, reduce_ref("SUM", [make("sum", q, LARGE, torch.float32, W, salt=round_)
                                              for q in range(W)]), "all_reduce after re-init")
            out = garbage(W * 7, torch.int64)
            dist.all_gather_into_tensor(out, make("move", r, 7, torch.int64, W))
            check_equal(out, torch.cat([make("move", q, 7, torch.int64, W) for q in range(W)]),
                        "all_gather_into_tensor after re-init")


FAMILIES = {
    "broadcast": fam_broadcast,
    "all_reduce": fam_all_reduce,
    "all_reduce_coalesced": fam_all_reduce_coalesced,
    "all_reduce_coalescing_manager": fam_all_reduce_coalescing_manager,
    "reduce": fam_reduce,
    "all_gather": fam_all_gather,
    "all_gather_into_tensor": fam_all_gather_into_tensor,
    "all_gather_into_tensor_coalesced": fam_all_gather_into_tensor_coalesced,
    "gather": fam_gather,
    "scatter": fam_scatter,
    "reduce_scatter": fam_reduce_scatter,
    "reduce_scatter_tensor": fam_reduce_scatter_tensor,
    "reduce_scatter_tensor_coalesced": fam_reduce_scatter_tensor_coalesced,
    "all_to_all": fam_all_to_all,
    "all_to_all_single": fam_all_to_all_single,
    "send_recv": fam_send_recv,
    "recv_anysource": fam_recv_anysource,
    "isend_irecv": fam_isend_irecv,
    "barrier": fam_barrier,
    "objects": fam_objects,
    "noncontiguous": fam_noncontiguous,
    "async": fam_async,
    "subgroups": fam_subgroups,
    "reinit": fam_reinit,  # keep last: it replaces the default group
}
MIN_WORLD = {"send_recv": 2, "recv_anysource": 2, "isend_irecv": 2}
