"""``torch_rsdp.plan`` over torch's stock backends: every strategy without the rsdp backend.

A representative selection over gloo (the whole plan matrix runs on rsdp in test_plan.py and
its neighbours; the ring is the only part that differs, and tests/rsdp/
test_rsdp_stock_backends.py compares it with rsdp's bit for bit):

* at 3 ranks, each strategy alone and the seven-way mix train like one process under torch's
  own ``clip_grad_norm_`` (norms and parameters), and ``plan.auto`` plans, verifies and
  trains under a budget; with ``RSDP_TEST_FULL_STOCK=1`` also ``torch.compile`` of ``rotate``
  and a Hugging Face Llama plan (they pass over gloo; CI leaves them to the rsdp runs of
  test_plan.py, which prove the same layers, to keep its time);
* a checkpoint written with ``torch.distributed.checkpoint`` under gloo loads under another
  plan on the rsdp backend and training goes on as if it had never stopped;
* compression, which needs the rsdp backend, refuses on gloo naming the feature.
"""
from __future__ import annotations

import os

import pytest
import torch

from plan.test_plan_checkpoint import _build, _full, _reference, _steps
from support import plan_cases as pc
from support.harness import launch

TIGHT = 2e-5


def _strategies_worker(ctx):
    import torch.distributed as dist

    import torch_rsdp.plan as plan

    W, r = ctx.world_size, ctx.rank
    assert dist.get_backend() == "gloo"
    out = {}
    for p in pc.ALONE + ["mix"]:
        want_norms, got_norms = [], []
        want = pc.reference(pc.make_net(), "adamw", W, 3, clip=0.05, norms=want_norms)
        model = plan.apply(pc.make_net(seed=r), pc.MIX if p == "mix" else p)  # rank 0's wins
        pc.train(model, pc.plan_optim(model, "adamw"), r, W, 3, clip=0.05, norms=got_norms)
        assert min(want_norms) > 0.05, f"clipping never acted: {want_norms}"
        worst = max(abs(a - b) / b for a, b in zip(got_norms, want_norms))
        assert worst <= 1e-5, f"{p}: norms {got_norms} vs one process {want_norms}"
        pc.assert_close_sd(plan.full_state_dict(model, rank0_only=False), want, TIGHT, p)
        out[p] = got_norms
    if os.environ.get("RSDP_TEST_FULL_STOCK"):  # CI's time: see the module docstring
        # torch.compile breaks its graph at the ring steps and compiles the rest
        want = pc.reference(pc.make_net(), "adamw", W, 2)
        model = plan.apply(pc.make_net(), "rotate")
        pc.train(torch.compile(model), pc.plan_optim(model, "adamw"), r, W, 2)
        pc.assert_close_sd(plan.full_state_dict(model, rank0_only=False), want, 1e-4,
                           "compiled")
        # a Hugging Face Llama under a mixed plan
        want = pc.reference(pc.make_llama(0), "adamw", W, 3)
        model = plan.apply(pc.make_llama(0), pc.LLAMA_PLAN)
        pc.train(model, pc.plan_optim(model, "adamw"), r, W, 3)
        pc.assert_close_sd(plan.full_state_dict(model, rank0_only=False), want, TIGHT,
                           "llama")
    # the planner: measures, plans under a budget, verifies its prediction, trains
    model = pc.make_net()
    x, _ = pc.batch(0, W)
    auto = plan.auto(model, x[r * pc.PER_RANK:(r + 1) * pc.PER_RANK], memory_budget="1GiB",
                     verify=1, verify_steps=2)
    want = pc.reference(pc.make_net(), "adamw", W, 2)
    planned = plan.apply(pc.make_net(), auto)  # an AutoPlan is a Plan
    pc.train(planned, pc.plan_optim(planned, "adamw"), r, W, 2)
    pc.assert_close_sd(plan.full_state_dict(planned, rank0_only=False), want, TIGHT, "auto")
    out["auto"] = auto.explain()
    # compression needs rsdp: one clear refusal, nothing silently exact
    for how in ({"plan": "full_shard+int8"}, {"plan": "rotate", "compression": "int8"}):
        with pytest.raises(TypeError) as e:
            plan.apply(pc.make_net(), **how)
        assert "compression" in str(e.value) and "gloo" in str(e.value), e.value
    return out


def test_every_strategy_on_gloo():
    res = launch(_strategies_worker, 3, backend="gloo", allow_exit_abort=True, deadline=600,
                 pg_timeout=120)
    for r in range(3):
        assert set(pc.ALONE + ["mix"]) <= set(res[r])
        assert res[r]["rotate"] == res[0]["rotate"], "ranks clipped with different norms"


def _save_on_gloo(ctx, root):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.set_num_threads(1)
    for name in ("mix", "rotate"):
        model, opt = _build(name, ctx.rank)
        _steps(model, opt, ctx.rank, ctx.world_size, 0, 2)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(root, name))


def _load_on_rsdp(ctx, root):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import torch_rsdp.plan as plan

    assert dist.get_backend() == "rsdp"
    torch.set_num_threads(1)
    want = _reference(5)
    out = {}
    for name, into in (("mix", "rotate"), ("rotate", "full_shard")):
        model, opt = _build(into, 7 + ctx.rank)
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=plan.CheckpointReader(os.path.join(root, name)))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        _steps(model, opt, ctx.rank, ctx.world_size, 2, 5)
        got = _full(model)
        out[f"{name} -> {into}"] = max((got[k] - want[k]).abs().max().item() for k in want)
    return out


def test_checkpoint_written_on_gloo_loads_on_rsdp(tmp_path):
    launch(_save_on_gloo, 2, (str(tmp_path),), backend="gloo", allow_exit_abort=True,
           deadline=300)
    res = launch(_load_on_rsdp, 2, (str(tmp_path),), backend="rsdp", deadline=300)
    for r in range(2):
        assert len(res[r]) == 2
        bad = {k: v for k, v in res[r].items() if not v <= 1e-5}
        assert not bad, f"rank {r}: resumed runs differ from the uninterrupted one: {bad}"
