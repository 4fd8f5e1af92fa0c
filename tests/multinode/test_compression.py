"""Compressed inter-node collectives (torch_rsdp.set_compression).

The kernels alone (hypothesis): every element within half a step of its block's scale, NaN
and ±Inf exact, odd sizes, bfloat16 and float16. Then on 2 emulated nodes x 2 ranks: int8
all-gather, int8/int4 reduce-scatter and all-reduce within the stated error of the exact
result, identical on every rank where they must be, a quarter of the bytes across nodes;
exact fallbacks (integers, MAX, a single node) bit for bit; ring shifts quantised on their
cross-node hops only; a rank that did not set the same compression raises a mismatch on every
rank.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="compression is the rsdp backend's")

LEVELS = {"int8": 126, "int4": 6}


def _block_bound(x: torch.Tensor, block: int, levels: int) -> torch.Tensor:
    """Per element: half a quantisation step of its block (+ float32 rounding)."""
    xf = x.float()
    finite = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf))
    pad = (-len(xf)) % block
    m = torch.nn.functional.pad(finite, (0, pad)).view(-1, block).amax(1)
    scale = torch.where(m / levels < torch.finfo(torch.float32).tiny, torch.zeros_like(m),
                        m / levels)
    per = scale.repeat_interleave(block)[:len(xf)]
    # below float32's normal range a block rounds to zero: its magnitude is the bound
    per = torch.where(per == 0, m.repeat_interleave(block)[:len(xf)], per / 2)
    return per * (1 + 1e-5) + 1e-30


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), block=st.sampled_from([32, 34, 512, 1000]),
       bits=st.sampled_from(["int8", "int4"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       scale=st.sampled_from([1e-20, 1e-3, 1.0, 1e4]), seed=st.integers(0, 2**31 - 1),
       specials=st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), max_size=3))
@example(n=485, block=34, bits="int8", dtype=torch.float16, scale=1e-3, seed=38599,
         specials=[])  # float16 subnormals among the outputs
def test_quantisation_error_per_block(n, block, bits, dtype, scale, seed, specials):
    from torch_rsdp._compression import quantize_roundtrip
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g) * scale).to(dtype)
    where = torch.randint(0, n, (len(specials),), generator=g)
    for i, v in zip(where.tolist(), specials):
        x[i] = v
    y, nbytes = quantize_roundtrip(x, bits, block)
    assert y.dtype == dtype and y.shape == x.shape
    nblocks = -(-n // block)
    assert nbytes == 4 * nblocks + (n if bits == "int8" else -(-n // 2))
    xf, yf = x.float(), y.float()
    special = ~torch.isfinite(xf)
    assert torch.equal(xf[special].isnan(), yf[special].isnan())
    both = special & ~xf.isnan()
    assert torch.equal(xf[both], yf[both]), "±Inf must arrive exactly"
    ok = ~special
    bound = _block_bound(x, block, LEVELS[bits])
    if dtype != torch.float32:  # the dequantised value is rounded to the dtype once more:
        # relative to it, or below the dtype's normal range by its subnormal spacing
        fi = torch.finfo(dtype)
        bound = bound + yf.abs() * fi.eps + fi.smallest_normal * fi.eps
    err = (yf - xf).abs()
    assert bool((err[ok] <= bound[ok]).all()), (
        f"max error {err[ok].max().item():.3g} over bound {(err - bound)[ok].max().item():.3g}")


def test_quantisation_bad_input():
    from torch_rsdp._compression import quantize_roundtrip
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        quantize_roundtrip(torch.ones(4, dtype=torch.int64))


# --------------------------------------------------------------------------------------------
# collectives on 2 emulated nodes x 2 ranks
# --------------------------------------------------------------------------------------------

NODES = [0, 0, 1, 1]


def _inputs(r, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + r)
    return (torch.randn(n, generator=g) * (1 + r)).to(dtype)


def _compressed(ctx):
    import torch_rsdp
    r, W = ctx.rank, ctx.world_size
    node = [q // 2 for q in range(W)]
    out = {}
    torch_rsdp.set_compression(all_gather="int8", reduce_scatter="int8", all_reduce="int8")
    assert torch_rsdp.get_compression()["all_gather"] == "int8"
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 1001, 100_003):
            # all-gather: every block within its bound, every rank identical
            x = _inputs(r, n, dtype)
            ag = torch.empty(W * n, dtype=dtype)
            torch_rsdp.reset_comm_stats()
            dist.all_gather_into_tensor(ag, x)
            sent = torch_rsdp.comm_stats()["inter_node_bytes"]
            for q in range(W):
                want = _inputs(q, n, dtype).float()
                err = (ag[q * n:(q + 1) * n].float() - want).abs()
                bound = want.abs().max() / (2 * 126) * (1 + 1e-5) + want.abs() * 2 ** -7
                assert bool((err <= bound).all()), (
                    f"all_gather {dtype} n={n}: block of rank {q} off by {err.max().item()}")
            gathered = [torch.empty_like(ag) for _ in range(W)]
            dist.all_gather(gathered, ag)
            assert all(torch.equal(gathered[0], t) for t in gathered), "ranks differ"
            out[f"ag {dtype} {n}"] = sent
            # reduce-scatter: the other node's partial sum quantised once
            ins = [_inputs(q, W * n, dtype, seed=1).float() for q in range(W)]
            rs = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(rs, _inputs(r, W * n, dtype, seed=1))
            mine = slice(r * n, (r + 1) * n)
            exact = sum(i[mine] for i in ins)
            other = sum(ins[q][mine] for q in range(W) if node[q] != node[r])
            # + the dtype's rounding of each node's partial sum and of the result (bf16)
            partials = [sum(ins[q][mine] for q in range(W) if node[q] == m) for m in (0, 1)]
            rounding = 0 if dtype == torch.float32 else (
                (partials[0].abs() + partials[1].abs() + exact.abs()) * 2 ** -8)
            bound = other.abs().max() / (2 * 126) * (1 + 1e-4) + rounding + 1e-5
            err = (rs.float() - exact).abs()
            assert bool((err <= bound).all()), f"reduce_scatter {dtype} n={n}: {err.max().item()}"
    # all-reduce with int4 reductions: quantised sums, identical on every rank
    torch_rsdp.set_compression(all_reduce="int4", reduce_scatter="int4")
    n = 200_003
    x = _inputs(r, n, torch.float32, seed=2)
    dist.all_reduce(x)
    ins = [_inputs(q, n, torch.float32, seed=2) for q in range(W)]
    exact = sum(ins)
    node_sum = [ins[0] + ins[1], ins[2] + ins[3]]
    bound = (max(p.abs().max() for p in node_sum) / (2 * 6) + exact.abs().max() / (2 * 126)
             ) * (1 + 1e-4)
    err = (x - exact).abs().max().item()
    assert err <= bound, f"all_reduce int4: {err} > {bound}"
    gathered = [torch.empty_like(x) for _ in range(W)]
    dist.all_gather(gathered, x)  # exact: compression is for all_reduce/reduce_scatter now
    assert all(torch.equal(gathered[0], t) for t in gathered), "all_reduce results differ"
    out["ar_err_over_bound"] = err / bound
    # NaN / Inf arrive as such
    y = torch.ones(4096) * (r + 1)
    if r == 3:
        y[7], y[100] = math.inf, math.nan
    dist.all_reduce(y)
    out["special"] = (y[7].item(), math.isnan(y[100].item()), y[0].item())
    # exact fallbacks: integers and MAX, bit for bit
    i = torch.arange(10_000, dtype=torch.int64) * (r + 1)
    dist.all_reduce(i)
    assert torch.equal(i, torch.arange(10_000, dtype=torch.int64) * 10)
    m = _inputs(r, 50_000, torch.float32, seed=3)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.equal(m, torch.stack([_inputs(q, 50_000, torch.float32, seed=3)
                                       for q in range(W)]).amax(0))
    # off again: exact, and the bytes of fp32
    torch_rsdp.set_compression()
    x = _inputs(r, 100_003, torch.float32)
    ag = torch.empty(W * 100_003)
    torch_rsdp.reset_comm_stats()
    dist.all_gather_into_tensor(ag, x)
    out["ag exact"] = torch_rsdp.comm_stats()["inter_node_bytes"]
    assert torch.equal(ag[r * 100_003:(r + 1) * 100_003], x)
    assert torch.equal(ag[((r + 2) % 4) * 100_003:((r + 2) % 4 + 1) * 100_003],
                       _inputs((r + 2) % 4, 100_003, torch.float32))
    # bad settings raise ValueError and change nothing
    for bad in (dict(all_gather="int4"), dict(all_reduce="fp8"), dict(block=33)):
        with pytest.raises(ValueError):
            torch_rsdp.set_compression(**bad)
    assert torch_rsdp.get_compression()["all_gather"] == "none"
    return out


@pytest.mark.slow
def test_compressed_collectives_on_two_nodes():
    res = launch(_compressed, 4, node_of=NODES, deadline=300)
    for r in range(4):
        o = res[r]
        ratio = o["ag torch.float32 100003"] / o["ag exact"]
        assert 0.24 <= ratio <= 0.27, f"rank {r}: int8 all-gather sent {ratio:.3f} of fp32's bytes"
        assert o["special"][0] == math.inf and o["special"][1], o["special"]
        assert o["special"][2] == 10.0
        print(f"rank {r}: int8 all-gather bytes across nodes {ratio:.3f} of fp32; int4 "
              f"all-reduce error {o['ar_err_over_bound']:.2f} of its bound")


def _ring_shifts(ctx, steps):
    """ring_shift / ring_shift_reduce with the cross-node hops compressed: exact inside a
    node, within the block bound across, a quarter of the bytes, error feedback on the
    boundary ranks only."""
    import torch_rsdp
    from torch_rsdp._ring import ring_neighbours, ring_shift, ring_shift_reduce
    r, W = ctx.rank, ctx.world_size
    node = [q // 2 for q in range(W)]
    to, frm = ring_neighbours(None, 1)
    n = 100_003
    out = {"remote_send": node[to] != node[r], "remote_recv": node[frm] != node[r]}
    x = _inputs(r, n, torch.float32)
    torch_rsdp.reset_comm_stats()
    exact = ring_shift(x)
    out["exact_bytes"] = torch_rsdp.comm_stats()["inter_node_bytes"]
    assert torch.equal(exact, _inputs(frm, n, torch.float32))
    torch_rsdp.set_compression(ring_shift="int8", ring_shift_reduce="int4")
    for dtype in (torch.float32, torch.bfloat16):
        x = _inputs(r, n, dtype)
        want = _inputs(frm, n, dtype)
        torch_rsdp.reset_comm_stats()
        y = x.clone()
        ring_shift(y, out=y)  # in place
        out[f"bytes {dtype}"] = torch_rsdp.comm_stats()["inter_node_bytes"]
        err = (y.float() - want.float()).abs()
        bound = want.float().abs().max() / (2 * 126) * (1 + 1e-5) + want.float().abs() * 2 ** -7
        out[f"shift {dtype}"] = (bool(torch.equal(y, want)), bool((err <= bound).all()))
    # shift-reduce: the same partial sum sent `steps` times, with and without feedback
    x = _inputs(r, n, torch.float32, seed=5)
    local = _inputs(r, n, torch.float32, seed=6)
    exact = _inputs(frm, n, torch.float32, seed=5) + local
    for mode in ("plain", "feedback"):
        residual = torch.zeros(n) if mode == "feedback" else None
        total = torch.zeros(n)
        for _ in range(steps):
            total += ring_shift_reduce(x, local, residual=residual)
        out[mode] = (total / steps - exact).abs().max().item()
        if residual is not None:
            out["residual"] = residual.abs().max().item()
    with pytest.raises(ValueError, match="ring_shift"):
        torch_rsdp.set_compression(ring_shift="int4")
    torch_rsdp.set_compression()
    return out


@pytest.mark.slow
def test_compressed_ring_shifts_on_two_nodes():
    res = launch(_ring_shifts, 4, (16,), node_of=NODES, deadline=120)
    for r in range(4):
        o = res[r]
        for dtype in (torch.float32, torch.bfloat16):
            same, within = o[f"shift {dtype}"]
            assert within, f"rank {r}: {dtype} shift beyond the block bound"
            assert same != o["remote_recv"], (
                f"rank {r}: a hop inside a node must be exact, across nodes quantised")
        if o["remote_send"]:
            ratio = o["bytes torch.float32"] / o["exact_bytes"]
            assert 0.24 <= ratio <= 0.27, f"rank {r}: int8 hop sent {ratio:.3f} of fp32's bytes"
            assert o["residual"] > 0, f"rank {r}: the boundary rank kept no residual"
        else:
            assert o["bytes torch.float32"] == o["exact_bytes"] == 0
            assert o["residual"] == 0, f"rank {r}: a rank that sends exactly kept a residual"
        if o["remote_recv"]:
            assert o["feedback"] <= o["plain"] / 4, (
                f"rank {r}: mean int4 error with feedback {o['feedback']} vs {o['plain']}")
        else:
            assert o["plain"] == o["feedback"] <= 1e-5, o
        print(f"rank {r}: mean error over 16 int4 hops {o['plain']:.4f} without feedback, "
              f"{o['feedback']:.5f} with")


def _disagree(ctx):
    """Rank 1 forgot set_compression: nobody may compute with a misread payload."""
    import torch_rsdp
    if ctx.rank != 1:
        torch_rsdp.set_compression(all_reduce="int8")
    x = torch.ones(100_000)
    with pytest.raises(RuntimeError) as info:
        dist.all_reduce(x)
    return str(info.value)


@pytest.mark.slow
def test_ranks_that_disagree_raise():
    res = launch(_disagree, 4, node_of=NODES, deadline=120, pg_timeout=20)
    # ranks 1 and 3 share a rail and see the disagreement itself; 0 and 2 then see rank 1 or
    # 3 give up
    for r in (1, 3):
        assert "int8 across nodes" in res[r], res[r]


def _fsdp2_losses(ctx, steps):
    """Plain FSDP2 on the rsdp backend: the same training exact and compressed (int8 weights
    on the all-gather, int8 gradients on the reduce-scatter, also with error feedback through
    FSDP2's custom reduce-scatter)."""
    import torch_rsdp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from support import plan_cases as pc
    r, W = ctx.rank, ctx.world_size
    from torch_rsdp._compression import FeedbackReduceScatter
    curves = {}
    settings = {"exact": {}, "int8": dict(all_gather="int8", reduce_scatter="int8"),
                "int8+feedback": dict(all_gather="int8", reduce_scatter="int8")}
    for mode, setting in settings.items():
        torch_rsdp.set_compression(**setting)
        model = pc.make_net()
        mesh = init_device_mesh("cpu", (W,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if mode.endswith("feedback"):
            for m in [*model.blocks, model]:
                m.set_custom_reduce_scatter(FeedbackReduceScatter())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step in range(steps):
            x, y = pc.batch(0, W)  # one batch again and again: the loss must fall
            x, y = x[r * pc.PER_RANK:(r + 1) * pc.PER_RANK], y[r * pc.PER_RANK:(r + 1) * pc.PER_RANK]
            loss = pc.loss_of(model, x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            t = loss.detach().clone()
            dist.all_reduce(t)
            losses.append(t.item() / W)
        curves[mode] = losses
    return curves


@pytest.mark.slow
def test_fsdp2_trains_alike_with_compression():
    res = launch(_fsdp2_losses, 4, (12,), node_of=NODES, deadline=300)
    exact = res[0]["exact"]
    assert exact[-1] < 0.8 * exact[0], f"the exact run did not learn: {exact[0]} -> {exact[-1]}"
    worst = {m: max(abs(a - b) / a for a, b in zip(exact, res[0][m]))
             for m in ("int8", "int8+feedback")}
    print(f"loss exact {exact[0]:.4f} -> {exact[-1]:.4f}; "
          + ", ".join(f"{m} -> {res[0][m][-1]:.4f} (worst {w:.2%} off)" for m, w in worst.items()))
    assert worst["int8"] <= 0.03, f"int8 training left fp32's loss curve by {worst['int8']:.1%}"
    assert worst["int8+feedback"] <= 0.03, (
        f"int8 with error feedback left fp32's loss curve by {worst['int8+feedback']:.1%}")
    assert res[0]["int8+feedback"] != res[0]["int8"], "error feedback changed nothing"


def _feedback(ctx, steps):
    """The same gradient reduce-scattered `steps` times with int4: without feedback every
    step errs alike; with it, the errors cancel over steps."""
    import torch_rsdp
    from torch_rsdp._compression import reduce_scatter_feedback
    r, W = ctx.rank, ctx.world_size
    torch_rsdp.set_compression(reduce_scatter="int4")
    n = 4099
    x = _inputs(r, W * n, torch.float32, seed=4)
    exact = sum(_inputs(q, W * n, torch.float32, seed=4) for q in range(W))[r * n:(r + 1) * n]
    out = {}
    for mode in ("plain", "feedback"):
        residual = torch.zeros(2 * n)  # 2 nodes
        total = torch.zeros(n)
        for _ in range(steps):
            o = torch.empty(n)
            if mode == "plain":
                dist.reduce_scatter_tensor(o, x)
            else:
                reduce_scatter_feedback(o, x, residual)
            total += o
        out[mode] = ((total / steps - exact).abs().max().item(), residual.abs().max().item())
    torch_rsdp.set_compression()  # off: the residual is left alone, the result exact
    residual = torch.ones(2 * n)
    o = torch.empty(n)
    reduce_scatter_feedback(o, x, residual)
    out["off"] = (bool(torch.allclose(o, exact, rtol=1e-5, atol=1e-5)),
                  bool((residual == 1).all()))
    return out


@pytest.mark.slow
def test_error_feedback_carries_the_error_forward():
    res = launch(_feedback, 4, (16,), node_of=NODES, deadline=120)
    for r in range(4):
        plain, fed = res[r]["plain"][0], res[r]["feedback"][0]
        assert fed <= plain / 4, f"rank {r}: mean error with feedback {fed} vs without {plain}"
        assert res[r]["feedback"][1] > 0, "no residual kept"
        assert res[r]["off"] == (True, True), res[r]["off"]
        print(f"rank {r}: mean error over 16 int4 steps: {plain:.4f} without feedback, "
              f"{fed:.5f} with")


def _plan(ctx):
    """plan.apply(compression="int8") on the seven-strategy mix, a plan naming compression
    per unit, and hybrid_shard: the right units compress (on groups of their own; the
    plan's group stays exact), gradients keep error feedback, training stays near one
    process."""
    import torch_rsdp
    import torch_rsdp.plan as plan
    from torch_rsdp._compression import FeedbackAllReduce, FeedbackReduceScatter
    from torch_rsdp._ring import ring_neighbours

    from support import plan_cases as pc
    r, W = ctx.rank, ctx.world_size
    mix = {k: ("full_shard" if v == "hybrid_shard" else v) for k, v in pc.MIX.items()}
    per_unit = {"blocks.*": "full_shard", "blocks.0": "full_shard+int8",
                "blocks.1": "shard_grad_op+int4", "blocks.4": "shard_optim+int8",
                "head": "no_shard+int4", "emb": "rotate+int8", "blocks.5": "rotate"}
    out = {}
    for name, p, comp in (("mix", mix, "int8"), ("per_unit", per_unit, None),
                          ("hybrid", "hybrid_shard", "int8")):
        want = pc.reference(pc.make_net(), "adamw", W, 3)
        model = plan.apply(pc.make_net(), p, compression=comp)
        st = model._rsdp_plan
        units = {u.name: u for u in st.units.values() if u.params}
        compressed = {n: u.compression["grads"] for n, u in units.items() if u.compression}
        fed = sorted(n for n, u in units.items() if isinstance(u.feedback, FeedbackReduceScatter))
        groups = {n: torch_rsdp.get_compression(st.meshes.group_for(u.compression))
                  for n, u in units.items() if u.compression and not u.strategy.handler.fsdp}
        pc.train(model, pc.plan_optim(model, "adamw"), r, W, 3)
        got = plan.full_state_dict(model, rank0_only=False)
        buckets = [b for b in st.grad_sync.buckets if b.comp is not None] if st.grad_sync else []
        out[name] = {"diff": max((got[k] - want[k]).abs().max().item() for k in want),
                     "compressed": compressed, "fed": fed, "groups": groups,
                     "world": torch_rsdp.get_compression(),
                     "rails": [torch_rsdp.get_compression(
                         st.meshes.hybrid(u.compression).get_group("replicate"))["all_reduce"]
                         for u in units.values()
                         if u.compression and u.strategy.kind == "hybrid_shard"],
                     "bucket_residual": [float(b.feedback.residual.abs().max())
                                         for b in buckets
                                         if isinstance(b.feedback, FeedbackAllReduce)],
                     "unit_residual": {n: float(units[n].feedback.residual.abs().max())
                                       for n in fed},
                     "ring_residual": {k: float(v.abs().max()) for k, v in
                                       plan.feedback_state_dict(model).items()
                                       if ".emb." in k or k.endswith(".emb.residual")},
                     # whether this rank's gradient hops (direction -1) leave its node
                     "ring_sends_across": "emb" in compressed and ring_neighbours(
                         st.meshes.group_for(units["emb"].compression), -1)[0] // 2 != r // 2}
    with pytest.raises(ValueError, match="grads"):
        plan.apply(pc.make_net(), "full_shard", compression={"grads": "fp8"})
    return out


@pytest.mark.slow
def test_plan_apply_with_compression():
    res = launch(_plan, 4, node_of=NODES, deadline=300)
    for r in range(4):
        mix, pu, hy = res[r]["mix"], res[r]["per_unit"], res[r]["hybrid"]
        for case in (mix, pu, hy):
            assert case["world"]["all_gather"] == "none", "the plan's own group was changed"
        # whole model: every unit of a strategy that can compress, no split
        assert set(mix["compressed"]) == {"", "emb", "blocks.0", "blocks.1", "blocks.2",
                                          "blocks.4", "blocks.5", "head"}, mix["compressed"]
        # ("": the default no_shard)
        assert {"blocks.0", "blocks.1", "blocks.2"} <= set(mix["fed"]), mix["fed"]
        assert mix["diff"] <= 0.05, f"rank {r}: the mix differs from one process by {mix['diff']}"
        # per unit: exactly the units named with +int8 / +int4
        assert pu["compressed"] == {"blocks.0": "int8", "blocks.1": "int4", "blocks.4": "int8",
                                    "head": "int4", "emb": "int8"}, pu["compressed"]
        assert pu["fed"] == ["blocks.0", "blocks.1"], pu["fed"]
        assert pu["groups"]["head"]["reduce_scatter"] == "int4", pu["groups"]
        assert pu["groups"]["blocks.4"]["reduce_scatter"] == "int8", pu["groups"]
        # rotate+int8: its ring hops between nodes, weights and gradient sums
        assert (pu["groups"]["emb"]["ring_shift"], pu["groups"]["emb"]["ring_shift_reduce"]
                ) == ("int8", "int8"), pu["groups"]
        if not pu["ring_sends_across"]:  # one rank per node sends its sums across
            assert not pu["ring_residual"], pu["ring_residual"]
        else:
            assert pu["ring_residual"] and all(v > 0 for v in pu["ring_residual"].values()), (
                f"rank {r}: the rotating embedding kept no residual: {pu['ring_residual']}")
        assert len(pu["bucket_residual"]) >= 2 and all(v > 0 for v in pu["bucket_residual"]), (
            f"replicated units kept no residual: {pu['bucket_residual']}")
        assert all(v > 0 for v in pu["unit_residual"].values()), pu["unit_residual"]
        assert pu["diff"] <= 0.05, f"rank {r}: per-unit plan off one process by {pu['diff']}"
        assert hy["rails"] and set(hy["rails"]) == {"int8"}, hy["rails"]  # the rails compress
        assert hy["diff"] <= 0.05, f"rank {r}: hybrid_shard differs from one process by " \
                                   f"{hy['diff']}"
        print(f"rank {r}: off one process: int8 mix {mix['diff']:.2e}, per-unit "
              f"{pu['diff']:.2e}, hybrid_shard {hy['diff']:.2e}")
    # the node-aware ring crosses each node boundary once per direction
    assert sum(res[r]["per_unit"]["ring_sends_across"] for r in range(4)) == 2, res


def test_strategy_suffix_parses_and_rejects():
    """``+int8`` / ``+int4`` round-trip through a Plan; strategies that cannot compress, and
    unknown formats, are refused with the reason."""
    import torch_rsdp.plan as plan
    p = plan.Plan({"a": "full_shard+int8", "b": "no_shard+int4"}, default="shard_optim+int8")
    assert plan.Plan.from_json(p.to_json()) == p
    assert str(p.mapping["a"]) == "full_shard+int8" and p.mapping["a"].exact.kind == "full_shard"
    assert p.digest() != plan.Plan({"a": "full_shard", "b": "no_shard+int4"},
                                   default="shard_optim+int8").digest()
    assert str(plan.Plan({"a": "rotate+int4"}).mapping["a"]) == "rotate+int4"
    with pytest.raises(ValueError, match="split"):
        plan.Plan({"a": "split:2+int4"})
    with pytest.raises(ValueError, match="unknown compression 'fp8'"):
        plan.Plan({"a": "full_shard+fp8"})


def _resume(ctx, path):
    """A compressed plan saved mid-run (model, optimizer and error-feedback residuals, through
    DCP) and resumed in fresh objects continues exactly as the run that never stopped; resumed
    without the residuals it does not (they are state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import torch_rsdp.plan as plan
    from support import plan_cases as pc
    r, W = ctx.rank, ctx.world_size
    spec = {"blocks.*": "full_shard+int4", "blocks.4": "no_shard+int8",
            "blocks.5": "shard_optim+int4", "emb": "rotate+int4"}

    def fresh():
        model = plan.apply(pc.make_net(), spec)
        return model, pc.plan_optim(model, "adamw")

    model, opt = fresh()
    pc.train(model, opt, r, W, 3, micro=2)
    msd, osd = get_state_dict(model, opt)
    saved_fb = plan.feedback_state_dict(model)
    dcp.save({"model": msd, "optim": osd, "feedback": saved_fb}, checkpoint_id=path)
    pc.train(model, opt, r, W, 2, start=3, micro=2)
    want = plan.full_state_dict(model, rank0_only=False)

    out = {"saved_keys": len(saved_fb)}
    for mode in ("with residuals", "without"):
        model, opt = fresh()
        msd, osd = get_state_dict(model, opt)
        reader = plan.CheckpointReader(path, strict=mode == "with residuals")
        state = {"model": msd, "optim": osd}
        if mode == "with residuals":
            state["feedback"] = plan.feedback_state_dict(model, reader.read_metadata(),
                                                         "feedback")
        dcp.load(state, storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        note = plan.set_feedback_state_dict(model, state.get("feedback", {}))
        pc.train(model, opt, r, W, 2, start=3, micro=2)
        got = plan.full_state_dict(model, rank0_only=False)
        out[mode] = (max((got[k] - want[k]).abs().max().item() for k in want), note)
    return out


@pytest.mark.slow
def test_resume_restores_error_feedback(tmp_path):
    res = launch(_resume, 4, (str(tmp_path / "ckpt"),), node_of=NODES, deadline=300)
    for r in range(4):
        with_diff, with_note = res[r]["with residuals"]
        without_diff, without_note = res[r]["without"]
        assert res[r]["saved_keys"] >= 7, res[r]["saved_keys"]  # 7 FSDP units + 2 buckets' two
        assert with_note is None, with_note
        assert with_diff == 0.0, f"rank {r}: resumed run differs by {with_diff}"
        assert without_note and "start at zero" in without_note
        assert without_diff > 0, "the residuals made no difference: are they state at all?"
        print(f"rank {r}: resumed with residuals: identical; without: off by {without_diff:.2e}")
