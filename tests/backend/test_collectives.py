"""Collective correctness for the backend under test (RSDP_TEST_BACKEND, default "rsdp").

Every collective x world size {1, 2, 3, 4} x element count {0, 1, 7, LARGE} x dtype x op is
checked exactly against a closed form (see values.py; at 4 ranks the reduced dtype x op set of
collective_families.REDUCED); the families themselves live in
collective_families.py (shared with test_multinode.py).  To keep the suite fast, one launch per
world size runs every selected "family" of cases inside one process group; each family is
then reported as its own pytest test (test_collective[<family>-ws<W>]).  RSDP_SHM_BYTES is
65536 (harness default), so LARGE (100_003 elements) streams through many segments.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from support.collective_families import (FAMILIES, MIN_WORLD, _rs_expected, _rs_inputs,
                                         use_reduced_matrix)
from support.harness import (assert_family, families_needed, launch, launch_families,
                             run_families)
from support.values import LARGE, check_equal, garbage, make, reduce_ref

WORLD_SIZES = (1, 2, 3, 4)


def families_worker(ctx, names):
    if ctx.world_size >= 4:  # the 4 ranks share 2 cores; their kernels ran at 1-3 ranks
        use_reduced_matrix(ctx)
    return run_families(ctx, FAMILIES, names)


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------

PARAMS = [pytest.param(ws, fam, id=f"{fam}-ws{ws}")
          for ws in WORLD_SIZES for fam in FAMILIES if ws >= MIN_WORLD.get(fam, 1)]

_BATCH: dict[int, object] = {}
BATCH_DEADLINE = {1: 300, 2: 420, 3: 480, 4: 600}


def _batch(ws, request):
    """Run the selected families for `ws` in as few launches as possible.

    If a launch crashes or hangs, the family that was running (from the workers' progress
    markers) is charged with the launch error and the remaining families run in a new launch,
    so one crashing case does not hide the results of every other family.
    """
    if ws in _BATCH:
        return _BATCH[ws]
    names = families_needed(request.session, "test_collective", "ws", ws, FAMILIES)
    results, errors, _ = launch_families(
        lambda batch: launch(families_worker, ws, (batch,), deadline=BATCH_DEADLINE[ws],
                            pg_timeout=30), names, ws)
    _BATCH[ws] = (results, errors)
    return _BATCH[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_collective(ws, family, request):
    batch, errors = _batch(ws, request)
    assert_family(batch, errors, family, f"world size {ws}")


# --------------------------------------------------------------------------------------------
# TORCH_DISTRIBUTED_DEBUG=DETAIL (wraps the backend; needs sequence numbers)
# --------------------------------------------------------------------------------------------


def _debug_detail_worker(ctx):
    W, r = ctx.world_size, ctx.rank
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL, dist.get_debug_level()
    for k in range(3):
        t = make("sum", r, LARGE if k == 1 else 7, torch.float32, W, salt=k)
        dist.all_reduce(t)
        check_equal(t, reduce_ref("SUM", [make("sum", q, t.numel(), torch.float32, W, salt=k)
                                          for q in range(W)]), "all_reduce under DETAIL")
    exp = make("move", 1, 99, torch.int64, W)
    t = exp.clone() if r == 1 else garbage(99, torch.int64)
    dist.broadcast(t, src=1)
    check_equal(t, exp, "broadcast under DETAIL")
    out = garbage(W * 5, torch.float64)
    dist.all_gather_into_tensor(out, make("move", r, 5, torch.float64, W))
    check_equal(out, torch.cat([make("move", q, 5, torch.float64, W) for q in range(W)]),
                "all_gather_into_tensor under DETAIL")
    rs = garbage(11, torch.int32)
    dist.reduce_scatter_tensor(rs, torch.cat(_rs_inputs("SUM", r, 11, torch.int32, W)))
    check_equal(rs, _rs_expected("SUM", r, 11, torch.int32, W), "reduce_scatter_tensor under DETAIL")
    dist.barrier()
    # The wrapper must catch a collective mismatch (it compares fingerprints incl. sequence
    # numbers through its helper group) and raise on every rank instead of running it.
    t = torch.ones(8)
    try:
        if r == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("ws", [2, 3])
def test_debug_detail(ws):
    res = launch(_debug_detail_worker, ws, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                 deadline=120, pg_timeout=20)
    for r in range(ws):
        msg = res[r]
        assert msg is not None, f"rank {r}: mismatched all_reduce/broadcast was not detected"
        assert "mismatch" in msg.lower(), f"rank {r}: {msg[:500]}"
