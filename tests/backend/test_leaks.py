"""Resource leaks: memory, file descriptors, threads and /dev/shm entries stay flat.

10,000 small collectives on 2 ranks: measured after a warm-up of 1,000 and at the end,
RSS may grow by less than 8 MiB; open fds, threads and /dev/shm entries containing "rsdp"
must be exactly equal.  Init/destroy of 5 process groups in a row in one process: fds,
threads and /dev/shm stay flat (baseline taken after the first cycle).
"""

from __future__ import annotations

import gc
import os
import time

import pytest
import torch
import torch.distributed as dist

from support.harness import launch, own_shm_entries

RSS_SLACK_KB = 8 * 1024
TOTAL, WARMUP = 10_000, 1_000


def _fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return sorted(out)


def measure() -> dict:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    return {
        "rss_kb": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
        "fds": len(os.listdir("/proc/self/fd")),
        "fd_targets": _fd_targets(),
        # ours (held by this process) or orphaned; entries of other jobs on the machine are ignored
        "shm": sorted(own_shm_entries([os.getpid()])),
    }


def settled(baseline: dict, timeout: float = 3.0) -> dict:
    """Measure again until fds/threads/shm match the baseline or `timeout` passes (threads and
    fds of a destroyed group may take a moment to go away)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        m = measure()
        same = all(m[k] == baseline[k] for k in ("fds", "threads", "shm"))
        if same or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def _one(i: int, r: int, W: int) -> None:
    k = i % 3
    if k == 0:
        t = torch.full((17,), float(r + i % 5))
        dist.all_reduce(t)
        exp = float(sum(q + i % 5 for q in range(W)))
        if not bool((t == exp).all()):
            raise AssertionError(f"op {i}: all_reduce gave {t[:3].tolist()}, expected {exp}")
    elif k == 1:
        out = [torch.empty(5, dtype=torch.int64) for _ in range(W)]
        dist.all_gather(out, torch.full((5,), r * 1000 + i % 1000, dtype=torch.int64))
        for q in range(W):
            if not bool((out[q] == q * 1000 + i % 1000).all()):
                raise AssertionError(f"op {i}: all_gather[{q}] = {out[q].tolist()}")
    else:
        root = i % W
        t = torch.full((33,), i % 251, dtype=torch.uint8) if r == root else torch.zeros(33, dtype=torch.uint8)
        dist.broadcast(t, src=root)
        if not bool((t == i % 251).all()):
            raise AssertionError(f"op {i}: broadcast from {root} gave {t[:3].tolist()}")


def _many_collectives_worker(ctx):
    r, W = ctx.rank, ctx.world_size
    for i in range(WARMUP):
        _one(i, r, W)
    dist.barrier()
    time.sleep(1.0)  # let lazily-closed resources of the warm-up settle
    gc.collect()
    m0 = measure()
    t0 = time.monotonic()
    for i in range(WARMUP, TOTAL):
        _one(i, r, W)
    elapsed = time.monotonic() - t0
    dist.barrier()
    m1 = settled(m0)
    return {"warm": m0, "end": m1, "elapsed": elapsed}


@pytest.mark.slow
def test_many_small_collectives_flat():
    res = launch(_many_collectives_worker, 2, deadline=420, pg_timeout=60)
    for r in range(2):
        m0, m1 = res[r]["warm"], res[r]["end"]
        growth = m1["rss_kb"] - m0["rss_kb"]
        assert growth < RSS_SLACK_KB, f"rank {r}: RSS grew by {growth} KiB over {TOTAL - WARMUP} collectives"
        assert m1["fds"] == m0["fds"], (
            f"rank {r}: open fds {m0['fds']} -> {m1['fds']}; only before: "
            f"{sorted(set(m0['fd_targets']) - set(m1['fd_targets']))}, only after: "
            f"{sorted(set(m1['fd_targets']) - set(m0['fd_targets']))}")
        assert m1["threads"] == m0["threads"], f"rank {r}: threads {m0['threads']} -> {m1['threads']}"
        assert m1["shm"] == m0["shm"], f"rank {r}: /dev/shm rsdp entries {m0['shm']} -> {m1['shm']}"


def _init_destroy_worker(ctx, cycles):
    r, W = ctx.rank, ctx.world_size
    ms = []
    for c in range(cycles):
        ctx.init_pg(tag=f"cycle{c}")
        t = torch.full((100_003,), float(r))
        dist.all_reduce(t)
        assert bool((t == W * (W - 1) / 2).all()), f"cycle {c}: all_reduce wrong"
        out = torch.empty(W * 3, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.full((3,), r, dtype=torch.int64))
        assert out.tolist() == [q for q in range(W) for _ in range(3)], f"cycle {c}: {out.tolist()}"
        dist.destroy_process_group()
        assert not dist.is_initialized()
        ms.append(settled(ms[0]) if ms else (gc.collect(), measure())[1])
    return ms


@pytest.mark.slow
def test_init_destroy_cycles_flat():
    cycles = 5
    res = launch(_init_destroy_worker, 2, (cycles,), init=False, deadline=240)
    for r in range(2):
        ms = res[r]
        assert len(ms) == cycles
        base = ms[0]
        for c, m in enumerate(ms[1:], start=2):
            assert m["fds"] == base["fds"], (
                f"rank {r}: fds after cycle 1: {base['fds']}, after cycle {c}: {m['fds']}; only before: "
                f"{sorted(set(base['fd_targets']) - set(m['fd_targets']))}, only after: "
                f"{sorted(set(m['fd_targets']) - set(base['fd_targets']))}")
            assert m["threads"] == base["threads"], (
                f"rank {r}: threads after cycle 1: {base['threads']}, after cycle {c}: {m['threads']}")
            assert m["shm"] == base["shm"], f"rank {r}: /dev/shm {base['shm']} -> {m['shm']} (cycle {c})"
            growth = m["rss_kb"] - base["rss_kb"]
            assert growth < RSS_SLACK_KB, f"rank {r}: RSS grew {growth} KiB by cycle {c}"
