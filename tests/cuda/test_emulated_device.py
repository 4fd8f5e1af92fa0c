"""The CUDA-IPC algorithms on the emulated device, in CPU CI (``RSDP_TEST_EMULATE_DEVICE``).

The emulated device (csrc/transport/emu) implements the staging interface as CUDA IPC does, over
host memory: each rank's staging buffer is a segment its peers map, a stream thread per rank runs
the queued copies and reductions later than the calls and in queue order, with random jitter,
and IPC events are flags that a wait captures when it is queued, as cudaStreamWaitEvent
does. The backend then serves a one-node group's CPU tensors through the device path: the same
algorithms, selection table and ring shift that CUDA IPC runs. A missing or misplaced wait shows
as a wrong result here (the jitter sees to that), and a stream stuck on a peer as a timeout.

* ``test_emulated_collective[<family>-<batch>]``: the device matrix of test_cuda.py
  (support/device_families.py: every collective family that takes the device path, ring_shift,
  ring_shift_reduce; float32/bfloat16/float16/int64/bool; counts 0 ... 1 500 007) at 2, 3 and 4
  ranks with 1 MiB of staging (the largest messages take many steps), and at 2 ranks with the
  default staging; plus ``emulated_paths`` (the group really runs on the emulated device).
* ``test_emulated_rsdp_parity``: RSDP's forward/backward families on the emulated device.
* ``test_stuck_stream_fails_every_rank``: a rank whose stream hangs mid-op (a planted kernel
  that never ends) makes every rank's op fail with a timeout within the deadline, and the
  processes tear down without waiting on the stuck stream.
* ``test_forced_algorithm_governs_device_ops``: ``RSDP_ALGO_ALLREDUCE`` chooses the device
  all-reduce through the same table as on the host (ranks that force different ones fail
  together with a mismatch naming both).

What it cannot catch: it runs no kernel, maps no IPC handle and calls no NCCL; the host waits
for the stream at the end of every op, so the torch-side stream glue (the caller's stream,
``work.wait()`` not blocking the host, CUDA futures) is not exercised (tests/cuda/test_cuda.py
covers those on a GPU).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from support.device_families import (DEVICE_COUNTS, DEVICE_DTYPES, STAGING_SMALL,
                                     device_families, device_min_world)
from support.harness import (assert_family, backend_under_test, families_needed, launch,
                             launch_families, run_families)
from support.values import check_equal

if backend_under_test() != "rsdp":
    pytest.skip("the emulated device is part of the rsdp backend", allow_module_level=True)

EMULATE = "jitter=20"


def fam_emulated_paths(ctx, rec):
    """The group's collectives really run on the emulated device."""
    import torch_rsdp

    W, r = ctx.world_size, ctx.rank
    with rec.case("first all_reduce"):
        t = torch.full((1000,), float(r + 1))
        dist.all_reduce(t)
        check_equal(t, torch.full((1000,), float(W * (W + 1) // 2)), "all_reduce output")
    with rec.case("cuda_paths names the emulated device"):
        paths = torch_rsdp.cuda_paths()
        assert "emulated device" in paths, f"cuda_paths() = {paths!r}"


# send/recv and the barrier do not take the device path; the CPU matrix proves them.
FAMILIES = device_families({"emulated_paths": fam_emulated_paths},
                           leave_out=("send_recv", "isend_irecv", "barrier"))
MIN_WORLD = device_min_world()

# batch -> (world size, extra environment, deadline in seconds)
BATCHES = {
    "ws2": (2, {"RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}, 600),
    "ws3": (3, {"RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}, 600),
    # No 4-rank batch: the CUDA-IPC algorithms have no power-of-two path (2 ranks are the even
    # case, 3 the uneven one), and 4 ranks time-slicing 2 cores cost CI ~2 minutes for no new
    # proof; tests/cuda/test_cuda.py runs 4 ranks on a real GPU.
    "ws2-staging-default": (2, {}, 600),
}
PARAMS = [pytest.param(batch, fam, id=f"{fam}-{batch}")
          for batch, (ws, _, _) in BATCHES.items() for fam in FAMILIES
          if ws >= MIN_WORLD.get(fam, 1)]
_BATCH: dict = {}


def _worker(ctx, names):
    ctx.device = torch.device("cpu")
    ctx.dtypes = DEVICE_DTYPES
    ctx.counts = DEVICE_COUNTS
    return run_families(ctx, FAMILIES, names)


def _batch(batch, request):
    if batch not in _BATCH:
        ws, env, deadline = BATCHES[batch]
        names = families_needed(request.session, "test_emulated_collective", "batch", batch,
                                FAMILIES)
        env = dict(env, RSDP_TEST_EMULATE_DEVICE=EMULATE)
        _BATCH[batch] = launch_families(
            lambda b: launch(_worker, ws, (b,), deadline=deadline, pg_timeout=60, env=env),
            names, ws)[:2]
    return _BATCH[batch]


@pytest.mark.parametrize("batch,family", PARAMS)
def test_emulated_collective(batch, family, request):
    results, errors = _batch(batch, request)
    ws, env, _ = BATCHES[batch]
    assert_family(results, errors, family, f"{ws} ranks on the emulated device, {env or 'default staging'}")


# --------------------------------------------------------------------------------------------
# RSDP parity
# --------------------------------------------------------------------------------------------

RSDP_FAMILIES = ("linear", "embedding", "attention", "transformer")
_RSDP: dict = {}


def _rsdp_worker(ctx, names):
    from rsdp import test_rsdp

    return run_families(ctx, {k: test_rsdp.FAMILIES[k] for k in names}, names)


@pytest.mark.parametrize("ws,family", [pytest.param(ws, f, id=f"{f}-ws{ws}")
                                       for ws in (2, 3) for f in RSDP_FAMILIES])
def test_emulated_rsdp_parity(ws, family):
    if ws not in _RSDP:
        env = {"RSDP_TEST_EMULATE_DEVICE": EMULATE, "RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}
        _RSDP[ws] = launch_families(
            lambda b: launch(_rsdp_worker, ws, (b,), deadline=300, pg_timeout=60, env=env),
            list(RSDP_FAMILIES), ws)[:2]
    results, errors = _RSDP[ws]
    assert_family(results, errors, family, f"RSDP on {ws} ranks on the emulated device")


# --------------------------------------------------------------------------------------------
# A stuck stream
# --------------------------------------------------------------------------------------------

STALL_TIMEOUT = 3.0


def _stall_worker(ctx):
    import torch_rsdp  # noqa: F401

    r = ctx.rank
    out = {"warm": None, "stuck": None}
    t = torch.full((1000,), float(r + 1))
    dist.all_reduce(t)  # op #1 (numbered from 1): runs
    out["warm"] = t[0].item()
    start = time.monotonic()
    try:
        big = torch.full((3_000_000,), 1.0)
        dist.all_reduce(big)  # op #2: rank 1's stream hangs in it
        out["stuck"] = "returned"
    except Exception as e:  # noqa: BLE001
        out["stuck"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - start
    return out


def test_stuck_stream_fails_every_rank():
    ws = 2
    env = {"RSDP_TEST_EMULATE_DEVICE": f"{EMULATE},stall=1@2",
           "RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}
    start = time.monotonic()
    res = launch(_stall_worker, ws, deadline=90, pg_timeout=STALL_TIMEOUT, env=env)
    took = time.monotonic() - start
    for r in range(ws):
        o = res[r]
        assert o["warm"] == 3.0, f"rank {r}: the first all_reduce gave {o['warm']}"
        assert o["stuck"] != "returned", f"rank {r}: the all_reduce with a stuck stream returned"
        assert "imed out" in o["stuck"] or "timeout" in o["stuck"].lower(), (
            f"rank {r}: expected a timeout, got {o['stuck'][:600]}")
        assert f"rank {r}" in o["stuck"], f"rank {r}: the error does not name the rank: {o['stuck'][:600]}"
        assert o["seconds"] < 4 * STALL_TIMEOUT, f"rank {r}: took {o['seconds']:.1f}s to fail"
    assert took < 60, f"the launch took {took:.0f}s: teardown waited on the stuck stream"


# --------------------------------------------------------------------------------------------
# The algorithm table selects for device buffers too
# --------------------------------------------------------------------------------------------


def _forced_algo_worker(ctx, per_rank):
    """Each rank forces its own RSDP_ALGO_ALLREDUCE before the group exists (the options are
    read then), then all-reduces a small message on the emulated device."""
    import os

    os.environ["RSDP_ALGO_ALLREDUCE"] = per_rank[ctx.rank]
    ctx.init_pg()
    try:
        t = torch.full((1000,), float(ctx.rank + 1))
        dist.all_reduce(t)
        return {"value": t[0].item(), "error": None}
    except Exception as e:  # noqa: BLE001
        return {"value": None, "error": f"{type(e).__name__}: {e}"}


@pytest.mark.parametrize("per_rank", [("rs_ag", "rs_ag"), ("oneshot", "rs_ag")],
                         ids=["both-rs_ag", "oneshot-vs-rs_ag"])
def test_forced_algorithm_governs_device_ops(per_rank):
    env = {"RSDP_TEST_EMULATE_DEVICE": EMULATE}
    res = launch(_forced_algo_worker, 2, (per_rank,), init=False, deadline=120, pg_timeout=10,
                 env=env)
    for r in range(2):
        o = res[r]
        if per_rank[0] == per_rank[1]:
            # 4000 bytes would be one-shot without the override; forced, it runs rs_ag.
            assert o["error"] is None and o["value"] == 3.0, f"rank {r}: {o}"
        else:
            # The choice is part of the op's descriptor: ranks that chose differently on
            # device buffers must fail together, naming both algorithms.
            assert o["error"] is not None, f"rank {r}: different algorithms were not noticed"
            assert "mismatch" in o["error"] and "one-shot" in o["error"] \
                and "reduce-scatter+all-gather" in o["error"], f"rank {r}: {o['error'][:600]}"
