"""Ranks the kernel stacks on one CPU, with more ranks than CPUs, move themselves off it
([Note: ranks the kernel stacks] in csrc/transport/shm/rank_spread.cpp): each rank is confined
to two CPUs (so four ranks outnumber them on any machine), three are put on one CPU, and the
group is expected to move one, to get every result right meanwhile, and to leave every thread's
CPU mask as it found it; with ``RSDP_SPREAD_MS=0`` it moves none.
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


def _stack_and_run(ctx, group, cpus, tries=10):
    """Puts ranks 0-2 on cpus[0] and rank 3 on cpus[1] (then gives each its two CPUs back) and
    runs all-reduces; returns (moves, results right) after up to `tries` stackings, the
    stacking repeated while the group has not moved a rank."""
    import torch_rsdp
    r = ctx.rank
    ok = True
    for _ in range(tries):
        os.sched_setaffinity(0, {cpus[0] if r < 3 else cpus[1]})
        os.sched_setaffinity(0, set(cpus))
        for i in range(64):  # the first look comes at collective 16
            t = torch.full((1024,), float(r + i))
            dist.all_reduce(t, group=group)
            ok = ok and bool((t == float(6 + 4 * i)).all())
        moves = torch.tensor([torch_rsdp.topology(group)["spread_moves"]])
        dist.all_reduce(moves, group=group)
        if moves.item() > 0:
            break
        time.sleep(0.005)  # past RSDP_SPREAD_MS before the next look; the kernel may have
        # spread the ranks itself before this try's first look
    return int(moves.item()), ok


def _spread(ctx):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    out = {}
    before = _thread_masks()
    # Groups made while confined to two CPUs: four ranks outnumber them.
    os.sched_setaffinity(0, set(cpus))
    os.environ["RSDP_SPREAD_MS"] = "0"
    still = dist.new_group(list(range(4)))
    os.environ.pop("RSDP_SPREAD_MS")
    spread = dist.new_group(list(range(4)))
    out["still"] = _stack_and_run(ctx, still, cpus, tries=1)
    out["spread"] = _stack_and_run(ctx, spread, cpus)
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
