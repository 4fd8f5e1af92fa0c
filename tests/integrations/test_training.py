"""End-to-end training over the backend under test.

DDP (SGD with momentum, Adam, and DDP with the default allreduce comm hook) must give the same
parameters as the same run over gloo, and as a single-process reference trained on the
concatenated batch.  FSDP2 (fully_shard on a 1-D CPU device mesh) must match the
single-process reference too.  Ranks start from *different* initial weights so that DDP's
initial parameter broadcast is exercised (the reference starts from rank 0's weights).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from support.harness import backend_under_test, launch

STEPS = 5
BATCH = 6
D_IN, D_HID, D_OUT = 12, 40, 5


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(D_IN, D_HID), nn.Tanh(),
        nn.Linear(D_HID, D_HID), nn.Tanh(),
        nn.Linear(D_HID, D_OUT),
    )


def batch_for(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    y = torch.randn(BATCH, D_OUT, generator=g)
    return x, y


def make_opt(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    raise AssertionError(name)


def reference_params(world: int, opt_name: str, steps: int = STEPS,
                     device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Single process, rank 0's initial weights, mean loss over the concatenated batch.

    device: train there (tests/cuda/test_cuda.py: on the GPU); the result is on the CPU."""
    model = make_model(seed=0)
    if device is not None:
        model.to(device)
    opt = make_opt(opt_name, model.parameters())
    for step in range(steps):
        xs, ys = zip(*[batch_for(r, step) for r in range(world)])
        x, y = torch.cat(xs), torch.cat(ys)
        if device is not None:
            x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}


def _ddp_worker(ctx):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, W = ctx.rank, ctx.world_size
    dev = getattr(ctx, "device", None)  # tests/cuda/test_cuda.py sets a GPU; None: CPU
    out = {}
    for variant in ("sgd", "adam", "sgd+allreduce_hook"):
        opt_name = variant.split("+")[0]
        model = make_model(seed=r)  # different on every rank: DDP must broadcast rank 0's
        if dev is not None:
            model.to(dev)
        # tiny buckets: several async all_reduces per backward
        ddp = DDP(model, bucket_cap_mb=0.002, broadcast_buffers=True,
                  device_ids=[dev.index] if dev is not None and dev.type == "cuda" else None)
        if variant.endswith("allreduce_hook"):
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        opt = make_opt(opt_name, ddp.parameters())
        for step in range(STEPS):
            x, y = batch_for(r, step)
            if dev is not None:
                x, y = x.to(dev), y.to(dev)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        params = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
        # every rank must hold identical parameters
        gathered = [None] * W
        dist.all_gather_object(gathered, params)
        for q in range(W):
            for k in params:
                assert torch.equal(gathered[q][k], params[k]), (
                    f"{variant}: rank {q} parameter {k} differs from rank {r}'s")
        out[variant] = params
    return out


def _fsdp2_worker(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    r, W = ctx.rank, ctx.world_size
    mesh = init_device_mesh("cpu", (W,))
    out = {}
    for opt_name in ("sgd", "adam"):
        model = make_model(seed=0)  # FSDP2 does not broadcast: start from the same weights
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = make_opt(opt_name, model.parameters())
        for step in range(STEPS):
            x, y = batch_for(r, step)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        params = {}
        for k, v in model.state_dict().items():
            params[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
        out[opt_name] = params
    return out


def _compare(got: dict, exp: dict, rtol: float, atol: float, what: str) -> None:
    assert got.keys() == exp.keys(), f"{what}: keys {sorted(got)} vs {sorted(exp)}"
    for k in exp:
        g, e = got[k], exp[k]
        assert g.shape == e.shape, f"{what}: {k} shape {tuple(g.shape)} vs {tuple(e.shape)}"
        if not torch.allclose(g, e, rtol=rtol, atol=atol):
            diff = (g - e).abs().max().item()
            raise AssertionError(f"{what}: parameter {k} differs, max abs diff {diff:.3e} "
                                 f"(rtol={rtol}, atol={atol})")


def _train_worker(ctx, with_fsdp2: bool):
    out = {"ddp": _ddp_worker(ctx)}
    if with_fsdp2:
        out["fsdp2"] = _fsdp2_worker(ctx)
    return out


_RUNS: dict = {}


def _run(ws: int, backend: str, with_fsdp2: bool):
    """One launch per (world size, backend); DDP and FSDP2 share it."""
    key = (ws, backend)
    if key not in _RUNS:
        try:
            # The gloo reference run may abort in gloo's own teardown; rsdp runs may not.
            _RUNS[key] = launch(_train_worker, ws, (with_fsdp2,), backend=backend, deadline=300,
                                allow_exit_abort=(backend == "gloo" != backend_under_test()))
        except AssertionError as e:
            _RUNS[key] = e
    if isinstance(_RUNS[key], Exception):
        raise AssertionError(f"training launch ({backend}, ws={ws}) failed:\n{_RUNS[key]}")
    return _RUNS[key]


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 3])
def test_ddp_matches_gloo_and_reference(ws, tmp_path):
    bk = backend_under_test()
    torch.save(_run(ws, bk, True)[0]["ddp"], tmp_path / f"{bk}.pt")
    # the gloo reference (a separate launch unless gloo is the backend under test)
    torch.save(_run(ws, "gloo", bk == "gloo")[0]["ddp"], tmp_path / "gloo.pt")
    got = torch.load(tmp_path / f"{bk}.pt")
    gloo = torch.load(tmp_path / "gloo.pt")
    assert set(got) == {"sgd", "adam", "sgd+allreduce_hook"}, sorted(got)
    for variant in got:
        # sanity: training actually moved the weights
        init = make_model(0).state_dict()
        moved = max((got[variant][k] - init[k]).abs().max().item() for k in init)
        assert moved > 1e-3, f"{variant}: parameters barely changed ({moved:.2e})"
        _compare(got[variant], gloo[variant], rtol=1e-5, atol=1e-6,
                 what=f"DDP {variant} over {bk} vs gloo (ws={ws})")
        _compare(got[variant], reference_params(ws, variant.split("+")[0]), rtol=1e-4, atol=1e-5,
                 what=f"DDP {variant} vs single-process reference (ws={ws})")


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 3])
def test_fsdp2_matches_reference(ws):
    res = _run(ws, backend_under_test(), True)
    for opt_name in ("sgd", "adam"):
        ref = reference_params(ws, opt_name)
        init = make_model(0).state_dict()
        moved = max((ref[k] - init[k]).abs().max().item() for k in init)
        assert moved > 1e-3
        for r in range(ws):
            _compare(res[r]["fsdp2"][opt_name], ref, rtol=1e-4, atol=1e-5,
                     what=f"FSDP2 {opt_name} rank {r} vs single-process reference (ws={ws})")
