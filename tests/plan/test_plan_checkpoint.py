"""torch.distributed.checkpoint over planned models, as users call it.

``get_state_dict`` -> ``dcp.save`` at 4 ranks on 2 emulated nodes x 2 under every strategy and
the seven-way mix; then, at 2 ranks on one node, under another plan: ``get_state_dict`` ->
``dcp.load`` -> ``set_state_dict`` and three more steps, which must equal one process trained
on the same global batches throughout (the run that never stopped). Also: ``async_save``, a
full state dict (``full_state_dict=True, cpu_offload=True`` on rank 0, loaded with
``full_state_dict=True``), each rank writing only its shards, and bad checkpoints (another
model, a wrong shape, a missing or truncated file, no metadata) raising on every rank with the
model and optimizer unchanged.
"""
from __future__ import annotations

import glob
import os

import pytest
import torch

from support import plan_cases as pc
from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="emulated nodes use rsdp's topology")

NODE_OF = (0, 0, 1, 1)
GLOBAL = 12          # samples per step, on any world size that divides it
TOL = 1e-5
SAVED = pc.ALONE + ["mix", "rsdp.shard"]
#: the plan each checkpoint is loaded under (always another one; "rsdp.shard": the model
#: sharded by torch_rsdp.rsdp.shard alone, with a plain torch.optim optimizer)
LOAD_AS = {"no_shard": "rotate", "shard_optim": "split:3", "full_shard": "rsdp.shard",
           "shard_grad_op": "mix", "hybrid_shard": "no_shard", "rotate": "full_shard",
           "split:3": "hybrid_shard", "mix": "rotate", "rsdp.shard": "shard_optim"}


def _build(name, seed):
    """(model, optimizer) under plan ``name``."""
    if name == "rsdp.shard":
        import torch_rsdp.rsdp as rsdp
        model = rsdp.shard(pc.make_net(seed=seed))
        return model, pc.make_optim("adamw", model.parameters())
    import torch_rsdp.plan as plan
    model = plan.apply(pc.make_net(seed=seed), pc.MIX if name == "mix" else name)
    return model, pc.plan_optim(model, "adamw")


def _full(model):
    import torch_rsdp.plan as plan
    return plan.full_state_dict(model, rank0_only=False)  # planned or rsdp.shard alike


def _steps(model, opt, rank, world, start, stop):
    n = GLOBAL // world
    for step in range(start, stop):
        x, y = pc.batch(step, GLOBAL // pc.PER_RANK)
        pc.loss_of(model, x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]).backward()
        opt.step()
        opt.zero_grad()


def _reference(steps):
    return pc.reference(pc.make_net(), "adamw", GLOBAL // pc.PER_RANK, steps)


def save_worker(ctx, root):
    """Trains 2 steps under each plan and saves it (rank r writes its shards only)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    torch.set_num_threads(1)
    r, W = ctx.rank, ctx.world_size
    sizes = {}
    for name in SAVED:
        model, opt = _build(name, r)
        _steps(model, opt, r, W, 0, 2)
        msd, osd = get_state_dict(model, opt)
        path = os.path.join(root, name.replace(":", "_"))
        if name == "rotate":
            dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path).result()
        else:
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        if name == "mix":
            full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
            if r == 0:
                torch.save({"model": full[0], "optim": full[1]}, os.path.join(root, "mix.pt"))
        sizes[name] = os.path.getsize(glob.glob(os.path.join(path, f"__{r}_*.distcp"))[0])
    return sizes


def load_worker(ctx, root):
    """Each checkpoint under another plan at this world size, then 3 more steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    import torch_rsdp.plan as plan
    torch.set_num_threads(1)
    r, W = ctx.rank, ctx.world_size
    want = _reference(5)
    out = {}
    for name in SAVED + ["mix.pt"]:
        into = "shard_optim" if name == "mix.pt" else LOAD_AS[name]
        model, opt = _build(into, 7 + r)
        if name == "mix.pt":
            sd = torch.load(os.path.join(root, name), weights_only=False)
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                           options=StateDictOptions(full_state_dict=True))
        else:
            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, storage_reader=plan.CheckpointReader(
                os.path.join(root, name.replace(":", "_"))))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        _steps(model, opt, r, W, 2, 5)
        got = _full(model)
        out[f"{name} -> {into}"] = max((got[k] - want[k]).abs().max().item() for k in want)
    return out


def test_checkpoint_reshards_across_plans_and_world_sizes(nodes, tmp_path):
    saved = launch(save_worker, len(NODE_OF), (str(tmp_path),), node_of=NODE_OF, netns=nodes,
                   deadline=500, pg_timeout=120)
    # each rank writes about its share: replicated tensors are written once, by one rank
    for name in ("full_shard", "rotate", "split:3", "mix", "rsdp.shard"):
        per_rank = [saved[r][name] for r in range(len(NODE_OF))]
        assert max(per_rank) <= 0.5 * sum(per_rank), (name, per_rank)
    res = launch(load_worker, 2, (str(tmp_path),), deadline=500, pg_timeout=120)
    for r in (0, 1):
        bad = {k: v for k, v in res[r].items() if not v <= TOL}
        assert not bad, f"rank {r}: resumed runs differ from the uninterrupted one: {bad}"
        assert len(res[r]) == len(SAVED) + 1


def bad_input_worker(ctx, root):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import torch_rsdp.plan as plan
    torch.set_num_threads(1)
    r, W = ctx.rank, ctx.world_size
    path = os.path.join(root, "ck")
    model = plan.apply(pc.make_net(), pc.MIX)
    opt = pc.plan_optim(model, "adamw")
    _steps(model, opt, r, W, 0, 1)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    files = sorted(glob.glob(os.path.join(path, "*.distcp")))
    out = {}

    def attempt(case, net, strict=True):
        m = plan.apply(net, pc.MIX, strict=strict)
        o = pc.plan_optim(m, "adamw")
        _steps(m, o, r, W, 3, 4)
        before = plan.full_state_dict(m, rank0_only=False)
        ostate = {i: {k: pc.loc(v).clone() for k, v in s.items() if torch.is_tensor(v)}
                  for i, s in enumerate(o.state.values())}
        msd, osd = get_state_dict(m, o)
        sd = {"model": msd, "optim": osd}
        try:
            dcp.load(sd, storage_reader=plan.CheckpointReader(path))
            set_state_dict(m, o, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            err = None
        except BaseException as e:  # DCP raises CheckpointException, a BaseException
            err = str(e)
        after = plan.full_state_dict(m, rank0_only=False)
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        changed += [f"optimizer state {i}" for i, s in enumerate(o.state.values())
                    if any(not torch.equal(pc.loc(v), ostate[i][k]) for k, v in s.items()
                           if torch.is_tensor(v))]
        out[case] = (err, changed)

    wide = pc.make_net(seed=1)
    wide.blocks[0].fc1 = nn.Linear(pc.DIM, 2 * pc.DIM + 2)
    wide.blocks[0].fc2 = nn.Linear(2 * pc.DIM + 2, pc.DIM)
    attempt("wrong shape", wide)
    extra = pc.make_net(seed=1)
    extra.extra = nn.Linear(3, 3)
    attempt("missing key", extra)
    fewer = pc.make_net(seed=1)
    fewer.blocks = fewer.blocks[:6]
    attempt("extra keys", fewer, strict=False)
    dist.barrier()
    if r == 0:
        os.rename(files[1], files[1] + ".away")
    dist.barrier()
    attempt("missing file", pc.make_net(seed=1))
    dist.barrier()
    if r == 0:
        os.rename(files[1] + ".away", files[1])
        with open(files[1], "r+b") as f:
            f.truncate(os.path.getsize(files[1]) // 2)
    dist.barrier()
    attempt("truncated file", pc.make_net(seed=1))
    dist.barrier()
    if r == 0:
        os.remove(os.path.join(path, ".metadata"))
    dist.barrier()
    attempt("no metadata", pc.make_net(seed=1))
    return out


def test_checkpoint_bad_input(tmp_path):
    res = launch(bad_input_worker, 2, (str(tmp_path),), deadline=400, pg_timeout=120)
    expect = {"wrong shape": "model.blocks.0.fc1.weight", "missing key": "model.extra.weight",
              "extra keys": "blocks.6", "missing file": "__1_0.distcp",
              "truncated file": "is truncated", "no metadata": "has no .metadata"}
    for r in (0, 1):
        for case, needle in expect.items():
            err, changed = res[r][case]
            assert err is not None and needle in err, (r, case, (err or "")[-600:])
            assert not changed, (r, case, changed)


def async_worker(ctx, root):
    """``dcp.async_save`` with ``plan.CopyOnceStager``: training goes on (weights and
    optimizer state change in place) while the checkpoint is written; what was written is the
    state at the call, and resuming from it continues as the run that never stopped."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import torch_rsdp.plan as plan
    import torch.distributed as dist
    r, W = ctx.rank, ctx.world_size
    # DCP plans the save with collectives from its background thread: on a group of their
    # own, so they never interleave with training's
    ckpt_group = dist.new_group()
    out = {}
    for name in ("rotate", "mix", "shard_optim"):
        path = os.path.join(root, name)
        model, opt = _build(name, 0)
        _steps(model, opt, r, W, 0, 2)
        msd, osd = get_state_dict(model, opt)
        fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path,
                             async_stager=plan.CopyOnceStager(), process_group=ckpt_group)
        _steps(model, opt, r, W, 2, 5)  # while it writes
        fut.result()
        want = _full(model)
        model, opt = _build(name, 1)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, storage_reader=plan.CheckpointReader(path))
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        _steps(model, opt, r, W, 2, 5)
        got = _full(model)
        out[name] = max((got[k] - want[k]).abs().max().item() for k in want)
    return out


def test_async_save_copies_once(tmp_path):
    res = launch(async_worker, 2, (str(tmp_path),), deadline=400, pg_timeout=120)
    for r in (0, 1):
        for name, diff in res[r].items():
            assert diff <= TOL, f"rank {r}, {name}: resumed from the async save, off by {diff}"
