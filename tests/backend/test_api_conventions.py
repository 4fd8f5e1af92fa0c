"""torch.distributed's argument layouts and conventions, as torch documents them and gloo
behaves (RSDP_TEST_BACKEND=gloo runs the same cases against gloo to validate them).

List-form and coalesced APIs are called with a world size (3) that differs from the list
lengths (1, 2, 4 inputs) and equals one of them (3 inputs), so a transposed or misread layout
cannot pass; every family has an empty-tensor case. Also: sparse COO all_reduce and DDP with a
sparse embedding, futures of every op, group names, and timeouts passed per group and per call
(their messages say "Timed out" as gloo's and NCCL's do). One launch runs every family.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from support.harness import assert_family, backend_under_test, launch, launch_families, run_families

WS = 3


def val(r, i, n, dtype=torch.int64):
    """Input i of rank r: n distinct elements, distinct across (r, i)."""
    return (torch.arange(n, dtype=torch.int64) + 1000 * r + 100 * i).to(dtype)


def eq(got, exp, what):
    assert got.dtype == exp.dtype and got.shape == exp.shape and torch.equal(got, exp), (
        f"{what}: got {got.dtype}{list(got.shape)} {got.flatten()[:8].tolist()}, "
        f"expected {exp.dtype}{list(exp.shape)} {exp.flatten()[:8].tolist()}")


# --------------------------------------------------------------------------------------------
# families (each runs on every rank; rec.case records failures without stopping the launch)
# --------------------------------------------------------------------------------------------

def fam_all_gather_coalesced(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    # outputs[q][i] receives input i of rank q (torch's docstring, gloo).
    for sizes in ([5], [4, 2], [3, 1, 6], [2, 0, 7, 1], [0]):
        with rec.case(f"inputs={sizes}"):
            ins = [val(r, i, n) for i, n in enumerate(sizes)]
            outs = [[torch.full((n,), -1, dtype=torch.int64) for n in sizes] for _ in range(W)]
            dist.all_gather_coalesced(outs, ins)
            for q in range(W):
                for i, n in enumerate(sizes):
                    eq(outs[q][i], val(q, i, n), f"outputs[{q}][{i}]")
    with rec.case("one list per input is refused"):
        # The layout this API does not take: [inputs][ranks]. Every rank raises at the call.
        ins = [val(r, 0, 2)]
        outs = [[torch.zeros(2, dtype=torch.int64) for _ in range(W)]]
        try:
            dist.all_gather_coalesced(outs, ins)
        except (ValueError, RuntimeError) as e:
            if backend_under_test() == "rsdp":
                assert f"rank {r}" in str(e) and "all_gather_coalesced" in str(e), str(e)
        else:
            raise AssertionError("a [inputs][ranks] layout was accepted")
    with rec.case("async future"):
        ins = [val(r, 0, 3), val(r, 1, 2)]
        outs = [[torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)]
                for _ in range(W)]
        w = dist.all_gather_coalesced(outs, ins, async_op=True)
        w.wait()
        for q in range(W):
            eq(outs[q][1], val(q, 1, 2), f"outputs[{q}][1]")


def fam_gather_scatter(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    for root in (1, W - 1):
        for n in (4, 0):
            with rec.case(f"gather root={root} n={n}"):
                outs = [torch.zeros(n, dtype=torch.int64) for _ in range(W)] if r == root else None
                dist.gather(val(r, 0, n), outs, dst=root)
                if r == root:
                    for q in range(W):
                        eq(outs[q], val(q, 0, n), f"gather_list[{q}]")
            with rec.case(f"scatter root={root} n={n}"):
                ins = [val(q, 1, n) for q in range(W)] if r == root else None
                out = torch.full((n,), -1, dtype=torch.int64)
                dist.scatter(out, ins, src=root)
                eq(out, val(r, 1, n), "scatter output")


def fam_reduce_scatter_list(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    # input_list[q] is this rank's contribution to rank q's output.
    for n in (5, 0):
        with rec.case(f"n={n}"):
            ins = [val(r, q, n, torch.float32) for q in range(W)]
            out = torch.full((n,), -1.0)
            dist.reduce_scatter(out, ins)
            exp = sum(val(s, r, n, torch.float32) for s in range(W)) if n else torch.zeros(0)
            eq(out, exp, "reduce_scatter output")


def fam_all_to_all_lists(ctx, rec):
    r, W = ctx.rank, ctx.world_size

    def size(src, dst):  # uneven and sometimes empty: src sends size(src, dst) to dst
        return (src + 2 * dst) % 4

    with rec.case("equal sizes"):
        ins = [val(r, q, 3) for q in range(W)]
        outs = [torch.full((3,), -1, dtype=torch.int64) for q in range(W)]
        dist.all_to_all(outs, ins)
        for q in range(W):
            eq(outs[q], val(q, r, 3), f"output_tensor_list[{q}]")
    if backend_under_test() == "gloo":
        return  # gloo refuses tensors of different sizes; torch's docs (and NCCL) allow them
    with rec.case("uneven"):
        ins = [val(r, q, size(r, q)) for q in range(W)]
        outs = [torch.full((size(q, r),), -1, dtype=torch.int64) for q in range(W)]
        dist.all_to_all(outs, ins)
        for q in range(W):
            eq(outs[q], val(q, r, size(q, r)), f"output_tensor_list[{q}]")
    with rec.case("all empty"):
        outs = [torch.zeros(0) for _ in range(W)]
        dist.all_to_all(outs, [torch.zeros(0) for _ in range(W)])


def fam_tensor_coalesced(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    sizes = (3, 0, 5, 1)  # 4 tensors for 3 ranks
    with rec.case("all_gather_into_tensor coalesced"):
        outs = [torch.full((W * n,), -1, dtype=torch.int64) for n in sizes]
        with dist._coalescing_manager(async_ops=True) as cm:
            for i, n in enumerate(sizes):
                dist.all_gather_into_tensor(outs[i], val(r, i, n))
        cm.wait()
        for i, n in enumerate(sizes):
            eq(outs[i], torch.cat([val(q, i, n) for q in range(W)]), f"output {i}")
    with rec.case("reduce_scatter_tensor coalesced"):
        outs = [torch.full((n,), -1.0) for n in sizes]
        with dist._coalescing_manager(async_ops=True) as cm:
            for i, n in enumerate(sizes):
                inp = torch.cat([val(r, 10 * i + q, n, torch.float32) for q in range(W)])
                dist.reduce_scatter_tensor(outs[i], inp)
        cm.wait()
        for i, n in enumerate(sizes):
            exp = sum(val(s, 10 * i + r, n, torch.float32) for s in range(W))
            eq(outs[i], exp if n else torch.zeros(0), f"output {i}")


def fam_tensor_shapes(ctx, rec):
    """torch's docs: the big tensor is the inputs concatenated along dim 0, or (not on gloo,
    which refuses it; NCCL takes it) stacked along a new dim 0."""
    r, W = ctx.rank, ctx.world_size
    layouts = {"concatenated": torch.cat, "stacked": torch.stack}
    if backend_under_test() == "gloo":
        del layouts["stacked"]
    for name, join in layouts.items():
        with rec.case(f"all_gather_into_tensor {name}"):
            exp = join([val(q, 0, 6).view(2, 3) for q in range(W)])
            out = torch.full(exp.shape, -1, dtype=torch.int64)
            dist.all_gather_into_tensor(out, val(r, 0, 6).view(2, 3))
            eq(out, exp, "output")
        with rec.case(f"reduce_scatter_tensor {name}"):
            out = torch.full((2, 3), -1.0)
            inp = join([val(r, q, 6, torch.float32).view(2, 3) for q in range(W)])
            dist.reduce_scatter_tensor(out, inp)
            eq(out, sum(val(s, r, 6, torch.float32) for s in range(W)).view(2, 3), "output")


def fam_batch_isend_irecv(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    for n in (6, 0):
        with rec.case(f"ring both ways n={n}"):
            nxt, prv = (r + 1) % W, (r - 1) % W
            from_prv = torch.full((n,), -1, dtype=torch.int64)
            from_nxt = torch.full((n,), -1, dtype=torch.int64)
            ops = [dist.P2POp(dist.isend, val(r, 0, n), nxt),
                   dist.P2POp(dist.irecv, from_prv, prv),
                   dist.P2POp(dist.isend, val(r, 1, n), prv),
                   dist.P2POp(dist.irecv, from_nxt, nxt)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            eq(from_prv, val(prv, 0, n), "from predecessor")
            eq(from_nxt, val(nxt, 1, n), "from successor")


def fam_object_collectives(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    with rec.case("all_gather_object"):
        got = [None] * W
        dist.all_gather_object(got, {"rank": r, "pad": "x" * (r * 50)})
        assert got == [{"rank": q, "pad": "x" * (q * 50)} for q in range(W)], got
    with rec.case("gather_object"):
        got = [None] * W if r == 1 else None
        dist.gather_object(("g", r), got, dst=1)
        if r == 1:
            assert got == [("g", q) for q in range(W)], got
    with rec.case("broadcast_object_list"):
        objs = [1, "two", [3]] if r == 2 else [None, None, None]
        dist.broadcast_object_list(objs, src=2)
        assert objs == [1, "two", [3]], objs
    with rec.case("scatter_object_list"):
        out = [None]
        dist.scatter_object_list(out, [f"to{q}" for q in range(W)] if r == 0 else None, src=0)
        assert out == [f"to{r}"], out


def fam_futures(ctx, rec):
    """get_future() of every op completes with the op's output tensors."""
    r, W = ctx.rank, ctx.world_size
    with rec.case("barrier"):
        dist.barrier(async_op=True).get_future().wait()
    with rec.case("all_reduce"):
        t = val(r, 0, 4)
        fut = dist.all_reduce(t, async_op=True).get_future()
        exp = sum(val(q, 0, 4) for q in range(W))
        eq(fut.wait()[0], exp, "future value")
    with rec.case("broadcast"):
        t = val(r, 0, 3)
        eq(dist.broadcast(t, src=1, async_op=True).get_future().wait()[0], val(1, 0, 3), "value")
    with rec.case("all_gather"):
        outs = [torch.zeros(2, dtype=torch.int64) for _ in range(W)]
        got = dist.all_gather(outs, val(r, 0, 2), async_op=True).get_future().wait()
        assert len(got) == W, len(got)
        for q in range(W):
            eq(got[q], val(q, 0, 2), f"value[{q}]")
    # gloo's future of all_gather_into_tensor holds the input, and gloo has no future for
    # reduce_scatter_tensor or send/recv; NCCL's hold the outputs, as ours do.
    if backend_under_test() == "gloo":
        return
    with rec.case("all_gather_into_tensor"):
        out = torch.zeros(2 * W, dtype=torch.int64)
        got = dist.all_gather_into_tensor(out, val(r, 0, 2), async_op=True).get_future().wait()
        eq(got[0], torch.cat([val(q, 0, 2) for q in range(W)]), "value")
    with rec.case("reduce_scatter_tensor"):
        out = torch.zeros(2)
        inp = torch.cat([val(r, q, 2, torch.float32) for q in range(W)])
        got = dist.reduce_scatter_tensor(out, inp, async_op=True).get_future().wait()
        eq(got[0], sum(val(s, r, 2, torch.float32) for s in range(W)), "value")
    with rec.case("all_to_all_single"):
        out = torch.zeros(W, dtype=torch.int64)
        inp = torch.arange(W, dtype=torch.int64) + 10 * r
        got = dist.all_to_all_single(out, inp, async_op=True).get_future().wait()
        eq(got[0], torch.arange(W, dtype=torch.int64) * 10 + r, "value")
    with rec.case("send/recv"):
        if r == 0:
            dist.isend(val(0, 0, 3), 1).get_future().wait()
        elif r == 1:
            t = torch.zeros(3, dtype=torch.int64)
            eq(dist.irecv(t, 0).get_future().wait()[0], val(0, 0, 3), "recv future value")


def fam_group_names(ctx, rec):
    r, W = ctx.rank, ctx.world_size
    with rec.case("default group"):
        pg = dist.group.WORLD
        assert isinstance(pg.group_name, str) and pg.group_name, pg.group_name
        # torch's ProcessGroup.name() says "custom" for every backend registered by a plugin;
        # the backend object itself carries the name.
        assert pg.name() in (backend_under_test(), "custom"), pg.name()
        assert pg._get_backend(torch.device("cpu")).name() == backend_under_test()
        assert dist.get_backend(pg) == backend_under_test(), dist.get_backend(pg)
    with rec.case("subgroups named apart"):
        a = dist.new_group([0, 1])
        b = dist.new_group(list(range(W)), group_desc="everyone")
        if r in (0, 1):
            assert a.group_name != b.group_name, (a.group_name, b.group_name)
            assert a.size() == 2 and a.rank() == r
        assert b.group_desc == "everyone", b.group_desc
        t = torch.ones(2)
        dist.all_reduce(t, group=b)
        eq(t, torch.full((2,), float(W)), "all_reduce on the subgroup")
        for g in (a, b):
            dist.destroy_process_group(g)


def fam_monitored_barrier(ctx, rec):
    """torch documents monitored_barrier for gloo only and refuses other backends itself."""
    with rec.case("all ranks"):
        if backend_under_test() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
        else:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
            except ValueError as e:
                assert "GLOO" in str(e), str(e)
            else:
                raise AssertionError("torch ran monitored_barrier on a backend other than gloo")


def fam_sequence_numbers(ctx, rec):
    """The backend's _get_sequence_number_for_group counts the group's collectives; a new
    group starts at 0 (torch calls _set_sequence_number_for_group on gloo's). torch's
    ProcessGroup forwards these to gloo/NCCL/UCC only, so ask the backend object."""
    r, W = ctx.rank, ctx.world_size

    def seq(pg):
        return pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()

    with rec.case("counts collectives"):
        pg = dist.group.WORLD
        before = seq(pg)
        for _ in range(3):
            dist.all_reduce(torch.ones(2))
        dist.broadcast(torch.ones(2), src=0)
        after = seq(pg)
        assert after - before == 4, (before, after)
        got = [None] * W
        dist.all_gather_object(got, after)  # all ranks agree
        assert got == [got[0]] * W, got
    with rec.case("new group starts at 0"):
        sub = dist.new_group(list(range(W)))
        assert seq(sub) == 0, seq(sub)
        dist.all_reduce(torch.ones(1), group=sub)
        assert seq(sub) == 1, seq(sub)
        dist.destroy_process_group(sub)


def _expect_timeout(budget_s, fn, what):
    t0 = time.monotonic()
    try:
        fn()
    except RuntimeError as e:
        dt = time.monotonic() - t0
        msg = str(e)
        assert "Timed out" in msg or "timeout" in msg, f"{what}: not a timeout: {msg[:600]}"
        if backend_under_test() == "rsdp":
            assert "Timed out waiting" in msg and "timeout" in msg and "barrier" in msg, msg
            assert "rank 0" in msg and "collective #" in msg, msg
        assert budget_s * 0.9 <= dt < budget_s + 10, f"{what}: raised after {dt:.2f}s: {msg}"
        return msg
    raise AssertionError(f"{what}: did not raise")


def fam_timeouts(ctx, rec):
    """Timeouts given to new_group(), to one call, and to init_process_group()."""
    r = ctx.rank
    sub = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    with rec.case("new_group(timeout=1s): rank 0 alone in barrier", ranks=[0]):
        if r == 0:
            _expect_timeout(1.0, lambda: dist.barrier(group=sub), "new_group timeout")
    ctx.store_sync("timeouts/sub")
    dist.destroy_process_group(sub)
    # A per-call timeout overrides a large group timeout (torch's test_barrier_timeout_arg).
    sub = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=300))
    with rec.case("barrier(timeout=0.5s) in a 300 s group", ranks=[0]):
        if r == 0:
            _expect_timeout(0.5, lambda: dist.barrier(group=sub,
                                                      timeout=datetime.timedelta(seconds=0.5)),
                            "per-call timeout")
    ctx.store_sync("timeouts/call")
    dist.destroy_process_group(sub)
    sub = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=300))
    with rec.case("barrier(timeout=1ms): torch's test_barrier_timeout_arg", ranks=[0]):
        if r == 0:
            msg = _expect_timeout(0.001, lambda: dist.barrier(
                group=sub, timeout=datetime.timedelta(seconds=0.001)), "1 ms timeout")
            assert "Timed out waiting 1ms" in msg, msg
    ctx.store_sync("timeouts/call1ms")
    dist.destroy_process_group(sub)
    # init_process_group(timeout=): the default group's own timeout.
    ctx.reinit(timeout=datetime.timedelta(seconds=1.5))
    with rec.case("init_process_group(timeout=1.5s): rank 0 alone in barrier", ranks=[0]):
        if r == 0:
            _expect_timeout(1.5, dist.barrier, "init_process_group timeout")
    ctx.store_sync("timeouts/init")
    ctx.reinit()


def fam_sparse_all_reduce(ctx, rec):
    r, W = ctx.rank, ctx.world_size

    def sparse_of(q, dense_dim=0):
        # Rank q holds rows {q, q+1, 5} (5 twice: uncoalesced), rank 2 none at all.
        if q == 2:
            idx = torch.zeros((2, 0), dtype=torch.int64)
        else:
            idx = torch.tensor([[q, q + 1, 5, 5], [0, 2, 1, 1]])
        n = idx.shape[1]
        vals = torch.arange(1, n + 1, dtype=torch.float64) * (q + 1)
        if dense_dim:
            vals = vals[:, None] * torch.tensor([1.0, 10.0], dtype=torch.float64)
        shape = (7, 3) + ((2,) if dense_dim else ())
        return torch.sparse_coo_tensor(idx, vals, shape)

    for dense_dim in (0, 1):
        with rec.case(f"SUM dense_dim={dense_dim}"):
            t = sparse_of(r, dense_dim)
            dist.all_reduce(t)
            exp = sum(sparse_of(q, dense_dim).to_dense() for q in range(W))
            assert t.is_sparse and t.is_coalesced(), (t.layout, t.is_coalesced())
            eq(t.to_dense(), exp, "sum")
    with rec.case("SUM async future"):
        t = sparse_of(r)
        got = dist.all_reduce(t, async_op=True).get_future().wait()[0]
        eq(got.to_dense(), sum(sparse_of(q).to_dense() for q in range(W)), "future value")
    if backend_under_test() == "gloo":
        return  # gloo has no AVG, and does not compare the sizes of sparse tensors
    with rec.case("AVG"):
        t = sparse_of(r)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        eq(t.to_dense(), sum(sparse_of(q).to_dense() for q in range(W)) / W, "avg")
    with rec.case("sizes that differ between ranks raise on every rank"):
        t = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.ones(1), (7 + r, 3))
        try:
            dist.all_reduce(t)
        except ValueError as e:
            assert f"rank {r}" in str(e) and "does not match" in str(e), str(e)
        else:
            raise AssertionError("sparse tensors of different sizes were summed")
    with rec.case("MAX is refused"):
        try:
            dist.all_reduce(sparse_of(r), op=dist.ReduceOp.MAX)
        except ValueError as e:
            assert "MAX" in str(e) and "sparse" in str(e), str(e)
        else:
            raise AssertionError("MAX of sparse tensors was accepted")
    with rec.case("the group still works"):
        t = torch.ones(3)
        dist.all_reduce(t)
        eq(t, torch.full((3,), float(W)), "dense all_reduce after the errors")


class _SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(20, 4, sparse=True)
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(self.emb(x)).sum()


def fam_ddp_sparse_embedding(ctx, rec):
    r, W = ctx.rank, ctx.world_size

    def batch(q, step):  # rows differ by rank and overlap partly
        return torch.tensor([(q * 3 + step) % 20, (q + 7) % 20, 11])

    with rec.case("3 SGD steps vs one process"):
        model = torch.nn.parallel.DistributedDataParallel(_SparseNet())
        ref = _SparseNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            model(batch(r, step)).backward()
            opt.step()
            ref_opt.zero_grad()
            for q in range(W):  # DDP averages the ranks' gradients
                (ref(batch(q, step)) / W).backward()
            ref_opt.step()
        for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
            assert torch.allclose(p, q, atol=1e-6), f"{name}: {(p - q).abs().max()}"


FAMILIES = {
    "all_gather_coalesced": fam_all_gather_coalesced,
    "gather_scatter": fam_gather_scatter,
    "reduce_scatter_list": fam_reduce_scatter_list,
    "all_to_all_lists": fam_all_to_all_lists,
    "tensor_coalesced": fam_tensor_coalesced,
    "tensor_shapes": fam_tensor_shapes,
    "batch_isend_irecv": fam_batch_isend_irecv,
    "object_collectives": fam_object_collectives,
    "futures": fam_futures,
    "group_names": fam_group_names,
    "sequence_numbers": fam_sequence_numbers,
    "monitored_barrier": fam_monitored_barrier,
    "sparse_all_reduce": fam_sparse_all_reduce,
    "ddp_sparse_embedding": fam_ddp_sparse_embedding,
    "timeouts": fam_timeouts,  # last: it re-creates the default group
}


def families_worker(ctx, names):
    return run_families(ctx, FAMILIES, names)


_BATCH: dict = {}


@pytest.fixture(scope="module")
def batch():
    if not _BATCH:
        results, errors, _ = launch_families(
            lambda batch: launch(families_worker, WS, (batch,), deadline=240, pg_timeout=30),
            list(FAMILIES), WS)
        _BATCH.update(results=results, errors=errors)
    return _BATCH


@pytest.mark.parametrize("family", list(FAMILIES))
def test_api_convention(batch, family):
    assert_family(batch["results"], batch["errors"], family, f"ws{WS}")
