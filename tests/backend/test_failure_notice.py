"""A broken group tells everyone: every survivor raises within a second of a failure.

A rank is SIGKILLed in a stream of collectives under a LONG group timeout (30 s), so only the
failure notice (csrc/core/notice.h: the node's shared-memory block, UCX messages between
nodes) can make the survivors raise in time: each must raise within NOTICE_S of the kill,
naming the dead rank, and its next collective must fail at once. Every victim position: each
rank of one node (3 ranks), a leader and a non-leader on each of 2 emulated nodes x 2
(RSDP_NODE_ID on the loopback), and a whole node. A rank that aborts a group tells the others
at once. A rank frozen with SIGSTOP is found by the (short) timeout: once the first survivor
times out, the others raise within NOTICE_S.

One launch per case, a few seconds each. Each case prints its worst notice time
(docs/failures.md's "When a rank fails" table comes from
`pytest -s tests/backend/test_failure_notice.py`).
"""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

from backend.test_faults import names_rank
from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="the failure notice is the rsdp backend's (gloo waits)")

LONG_TIMEOUT = 30.0  # the survivors must not be saved by their own timeout
NOTICE_S = 1.0
KILL_ITER = 20
FROZEN_TIMEOUT = 2.0


def _stream(ctx, i: int) -> None:
    """One step of a stream of collectives: small and large all-reduces, an all-gather."""
    W = ctx.world_size
    n = (1, 1 << 18, 1000)[i % 3]  # the small path, the pipelined large path
    t = torch.full((n,), float(ctx.rank + 1))
    if i % 3 == 2:
        out = torch.empty(W * n)
        dist.all_gather_into_tensor(out, t)
    else:
        dist.all_reduce(t)
        assert bool((t == W * (W + 1) / 2).all()), f"step {i}: {t[:3].tolist()}"


def _stream_until_broken(ctx, before_step):
    """Runs the stream, calling ``before_step(i)`` before step ``i``, until a step raises:
    ``(i, when it raised, the message)``, or None if none did."""
    for i in range(10_000):
        before_step(i)
        try:
            _stream(ctx, i)
        except RuntimeError as e:
            return i, time.time(), str(e)
    return None


def _kill_worker(ctx, victims):
    """The lowest victim SIGKILLs the other victims, then itself, at a step that depends on
    who dies, so that the survivors wait in different collectives from case to case."""
    import torch_rsdp
    r = ctx.rank
    pids = [int(p) for p in ctx.store_sync("pid", str(os.getpid()).encode())]
    kill_at = KILL_ITER + sum(victims) % 3

    def kill(i):
        if r == min(victims) and i == kill_at:
            ctx.store.set("killed_at", repr(time.time()))
            for v in victims:
                if v != r:
                    os.kill(pids[v], signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    broken = _stream_until_broken(ctx, kill)
    if broken is None:
        return {"outcome": "no failure seen"}
    i, raised, msg = broken
    t0 = time.monotonic()
    try:
        _stream(ctx, i + 1)
        nxt = "completed"
    except RuntimeError as e:
        nxt = str(e)
    next_s = time.monotonic() - t0
    killed = float(ctx.store.get("killed_at"))
    # Alive until every survivor raised: a survivor that exits early would tell the others
    # by its death, not by its notice.
    ctx.store_sync("raised", ranks=[q for q in range(ctx.world_size) if q not in victims])
    return {"outcome": "raised", "iter": i, "after_kill_s": raised - killed, "msg": msg[:1500],
            "next": nxt[:500], "next_s": next_s, "error": str(torch_rsdp.group_error())}


CASES = {
    # one node, 3 ranks: each rank in turn
    "1x3-rank0": (3, None, [0]),
    "1x3-rank1": (3, None, [1]),
    "1x3-rank2": (3, None, [2]),
    # 2 emulated nodes x 2: a leader and a non-leader on each node, and a whole node
    "2x2-leader-node0": (4, [0, 0, 1, 1], [0]),
    "2x2-nonleader-node0": (4, [0, 0, 1, 1], [1]),
    "2x2-leader-node1": (4, [0, 0, 1, 1], [2]),
    "2x2-nonleader-node1": (4, [0, 0, 1, 1], [3]),
    "2x2-whole-node1": (4, [0, 0, 1, 1], [2, 3]),
    # a 3-node ring: the middle node's only rank; a leader of the last node of three
    "3x1-node1": (3, [0, 1, 2], [1]),
    "3x2-leader-node2": (6, [0, 0, 1, 1, 2, 2], [4]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_survivor_hears_within_a_second(case):
    W, node_of, victims = CASES[case]
    res = launch(_kill_worker, W, (victims,), pg_timeout=LONG_TIMEOUT, deadline=120,
                 expect_killed=victims, node_of=node_of)
    survivors = [r for r in range(W) if r not in victims]
    worst = max(res[r]["after_kill_s"] for r in survivors if "after_kill_s" in res[r])
    print(f"\n[notice] {case}: killed {victims}; survivors raised after "
          + ", ".join(f"rank {r} {res[r].get('after_kill_s', float('nan')):.3f}s"
                      for r in survivors) + f"; worst {worst:.3f}s")
    for r in survivors:
        o = res[r]
        assert o["outcome"] == "raised", f"{case}: survivor rank {r}: {o}"
        assert o["after_kill_s"] <= NOTICE_S, (
            f"{case}: rank {r} raised {o['after_kill_s']:.2f}s after the kill (the group's "
            f"timeout is {LONG_TIMEOUT}s): {o['msg'][:400]}")
        assert any(names_rank(o["msg"], v) for v in victims), (
            f"{case}: rank {r}'s error names none of {victims}: {o['msg'][:600]}")
        assert o["next"] != "completed" and o["next_s"] <= NOTICE_S, (
            f"{case}: rank {r}'s next collective: {o['next'][:300]} after {o['next_s']:.2f}s")
        assert o["error"] == "ErrorType.REMOTE_ERROR", f"{case}: rank {r}: {o['error']}"


def _abort_tells(ctx, aborter):
    """`aborter` aborts a group of every rank while the others wait in an all-reduce on it;
    returns (seconds from the abort to the raise, the message) on the others."""
    r = ctx.rank
    sub = dist.new_group(list(range(ctx.world_size)))
    dist.all_reduce(torch.ones(8), group=sub)
    if r == aborter:
        time.sleep(0.5)
        ctx.store.set("aborted_at", repr(time.time()))
        dist.distributed_c10d._abort_process_group(sub)
        return None
    try:
        dist.all_reduce(torch.ones(1 << 18), group=sub)
        return {"after_abort_s": None, "msg": "completed"}
    except RuntimeError as e:
        raised = time.time()
        msg = str(e)
    dist.destroy_process_group(sub)
    return {"after_abort_s": raised - float(ctx.store.get("aborted_at")), "msg": msg[:1000]}


def _frozen_worker(ctx, victim, stopper):
    """First an abort that tells the others; then `stopper` freezes `victim` (SIGSTOP) in the
    stream, and the others time out or hear of it."""
    import torch_rsdp
    r = ctx.rank
    aborted = _abort_tells(ctx, victim)
    pids = [int(p) for p in ctx.store_sync("pid", str(os.getpid()).encode())]

    def stop(i):
        if r == stopper and i == KILL_ITER:
            os.kill(pids[victim], signal.SIGSTOP)

    broken = _stream_until_broken(ctx, stop)
    if broken is None:
        return {"outcome": "no failure seen"}
    i, raised, msg = broken
    error = str(torch_rsdp.group_error())
    survivors = [q for q in range(ctx.world_size) if q != victim]
    ctx.store_sync("raised", ranks=survivors)
    if r == stopper:
        os.kill(pids[victim], signal.SIGKILL)
    return {"outcome": "raised", "raised": raised, "msg": msg[:1500], "error": error,
            "aborted": aborted}


@pytest.mark.parametrize("victim", [3])
def test_abort_and_frozen_rank_tell_the_rest(victim):
    node_of, W = [0, 0, 1, 1], 4
    res = launch(_frozen_worker, W, (victim, 0), pg_timeout=FROZEN_TIMEOUT, deadline=120,
                 expect_killed=[victim], node_of=node_of)
    survivors = [r for r in range(W) if r != victim]
    # the abort (same launch, before the freeze): rank `victim` aborted a group of all ranks
    told = [res[r]["aborted"] for r in survivors]
    print(f"\n[notice] 2x2-abort-rank{victim}: the others raised after "
          + ", ".join(f"rank {r} {o['after_abort_s']:.3f}s" for r, o in zip(survivors, told)
                      if o["after_abort_s"] is not None))
    for r, o in zip(survivors, told):
        assert o["after_abort_s"] is not None and o["after_abort_s"] <= NOTICE_S, (
            f"rank {r} after rank {victim}'s abort: {o}")
        assert "aborted" in o["msg"] and names_rank(o["msg"], victim), f"rank {r}: {o['msg']}"
    for r in survivors:
        assert res[r]["outcome"] == "raised", f"rank {r}: {res[r]}"
    first = min(res[r]["raised"] for r in survivors)
    spread = max(res[r]["raised"] for r in survivors) - first
    print(f"\n[notice] 2x2-frozen-rank{victim}: after the first timeout the others raised within "
          + ", ".join(f"rank {r} {res[r]['raised'] - first:.3f}s" for r in survivors)
          + f"; worst {spread:.3f}s")
    for r in survivors:
        o = res[r]
        assert o["raised"] - first <= NOTICE_S, (
            f"rank {r} raised {o['raised'] - first:.2f}s after the first timeout: {o['msg'][:400]}")
        # The first to time out may have waited on a live rank that waited on the frozen one.
        assert re.search("Timed out", o["msg"]), f"rank {r}: {o['msg'][:600]}"

        assert o["error"] == "ErrorType.TIMEOUT", f"rank {r}: {o['error']}"

