"""Ranks the kernel stacks on one CPU, with more ranks than CPUs, move themselves off it
([Note: ranks the kernel stacks] in csrc/transport/shm/rank_spread.cpp): each rank is confined
to two CPUs (so four ranks outnumber them on any machine), three are put on one CPU, and the
group is expected to move one, to get every result right meanwhile, and to leave every thread's
CPU mask as it found it; with ``RSDP_SPREAD_MS=0`` it moves none. Groups over overlapping
ranks, each spreading its own, settle instead of trading ranks back and forth.
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


STEPS = 1500
STACK_EVERY = 300
MAX_MOVES = 64  # per group and rank over the run; looks every 2 ms could make hundreds


def _overlapping_groups(ctx):
    """Six ranks on two CPUs in the world group, a half and an interleaved third, stacked five
    and one every STACK_EVERY steps: each group spreads its own ranks by its own published
    CPUs, so a move one group makes can unbalance another; the rule (the highest ranks beyond
    a CPU's share move) must settle, not trade ranks back and forth at every look (about one
    move per group and stacking was measured)."""
    import torch_rsdp
    r, n = ctx.rank, ctx.world_size
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, set(cpus))
    halves = [dist.new_group(list(range(0, 3))), dist.new_group(list(range(3, 6)))]
    thirds = [dist.new_group(list(range(k, n, 2))) for k in (0, 1)]
    groups = [None, halves[r // 3], thirds[r % 2]]
    ok = True
    for i in range(STEPS):
        if i % STACK_EVERY == 0:  # five ranks on one CPU, then both CPUs given back
            os.sched_setaffinity(0, {cpus[0] if r < 5 else cpus[1]})
            os.sched_setaffinity(0, set(cpus))
        for g in groups:
            t = torch.full((4096,), float(r + i))
            dist.all_reduce(t, group=g)
            ranks = dist.get_process_group_ranks(g) if g is not None else range(n)
            ok = ok and bool((t == float(sum(ranks) + len(ranks) * i)).all())
    return ok, [torch_rsdp.topology(g)["spread_moves"] for g in groups]


def test_overlapping_groups_settle():
    res = launch(_overlapping_groups, 6, pg_timeout=60, deadline=180)
    assert sum(sum(res[r][1]) for r in range(6)) >= 1, "five ranks stacked on one CPU, none moved"
    for r in range(6):
        ok, moves = res[r]
        assert ok, f"rank {r}: a wrong all-reduce while ranks moved"
        assert max(moves) <= MAX_MOVES, f"rank {r}: moves per group {moves}: ranks traded back " \
            f"and forth"
