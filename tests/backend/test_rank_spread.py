"""Ranks stacked on one CPU, with more ranks than CPUs, move themselves off it ([Note: ranks
the kernel stacks] in csrc/transport/shm/rank_spread.cpp): each rank is confined to two CPUs
(so four ranks outnumber them on any machine), three state that they run on one CPU and the
fourth on the other (RSDP_TEST_PLACEMENT's on_cpu, until a rank moves), and the group is
expected to move one, to get every result right meanwhile, and to leave every thread's CPU
mask as it found it; with ``RSDP_SPREAD_MS=0`` it moves none.

The stacking is stated rather than made with CPU masks: whether the kernel leaves ranks
stacked long enough for the group to look is the host's scheduler's business. Which rank
moves where, and that groups over overlapping ranks settle rather than trade ranks back and
forth, is the rule's, checked in tests/native/test_rank_spread.cpp.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from support.harness import backend_under_test, launch

pytestmark = [
    pytest.mark.skipif(backend_under_test() != "rsdp", reason="the rsdp backend's own placement"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to spread over"),
]


def _thread_masks() -> dict:
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            masks[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
        except OSError:  # the thread ended meanwhile
            pass
    return masks


def _run(ctx, group, steps=64):
    """`steps` all-reduces (the first look comes at collective 16, then one every 16 at
    most RSDP_SPREAD_MS apart); returns (moves over the group, results right)."""
    import torch_rsdp
    r, ok = ctx.rank, True
    for i in range(steps):
        t = torch.full((1024,), float(r + i))
        dist.all_reduce(t, group=group)
        ok = ok and bool((t == float(6 + 4 * i)).all())
        time.sleep(0.0002)  # a look every 16 collectives, RSDP_SPREAD_MS (2 ms) apart at most
    moves = torch.tensor([torch_rsdp.topology(group)["spread_moves"]])
    dist.all_reduce(moves, group=group)
    return int(moves.item()), ok


def _spread(ctx):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    out = {}
    before = _thread_masks()
    # Groups made while confined to two CPUs: four ranks outnumber them. Ranks 0-2 state
    # that they run on the first, rank 3 on the second.
    os.sched_setaffinity(0, set(cpus))
    os.environ["RSDP_TEST_PLACEMENT"] = f"on_cpu={cpus[0] if ctx.rank < 3 else cpus[1]}"
    os.environ["RSDP_SPREAD_MS"] = "0"
    still = dist.new_group(list(range(4)))
    os.environ.pop("RSDP_SPREAD_MS")
    spread = dist.new_group(list(range(4)))
    os.environ.pop("RSDP_TEST_PLACEMENT")
    out["still"] = _run(ctx, still)
    out["spread"] = _run(ctx, spread)
    # Every thread this rank had, and the ones the groups started, keep their masks: the
    # moves put the mask back.
    after = _thread_masks()
    out["masks_kept"] = all(after[t] == m for t, m in before.items() if t in after and t !=
                            os.getpid())
    out["main_mask"] = sorted(os.sched_getaffinity(0)) == cpus
    out["new_threads"] = sorted({len(m) for t, m in after.items() if t not in before})
    return out


def test_stacked_ranks_move_and_masks_stay():
    res = launch(_spread, 4, pg_timeout=60, deadline=180)
    for r in range(4):
        o = res[r]
        assert o["still"] == (0, True), f"rank {r}: RSDP_SPREAD_MS=0 gave {o['still']}"
        moves, ok = o["spread"]
        assert ok, f"rank {r}: a wrong all-reduce while ranks moved"
        assert moves >= 1, f"rank {r}: three ranks stacked on one CPU, none moved"
        assert o["main_mask"], f"rank {r}: the main thread's mask changed"
        assert o["masks_kept"], f"rank {r}: a thread's CPU mask changed"
        assert all(n >= 2 for n in o["new_threads"]), f"rank {r}: a thread left pinned"
