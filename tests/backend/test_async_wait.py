"""Waiting on async ops: the waiter may run its op itself ([Note: waiting runs the op] in
csrc/backend/work_rsdp.cpp), so every order of issuing and waiting must still give each op its
own result, run the ops in issue order, and keep ``wait(timeout)`` to its timeout.
"""
from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="the rsdp backend's own wait path")


def _orders(ctx):
    r, W = ctx.rank, ctx.world_size
    out = {}

    # Many async ops of different kinds in flight, waited for last to first: waiting on the
    # last runs every op queued before it, in issue order.
    ts = [torch.full((1000 + i,), float(r + i)) for i in range(24)]
    gs = [torch.empty(W * 7) for _ in range(8)]
    works = []
    for i, t in enumerate(ts):
        works.append(dist.all_reduce(t, async_op=True))
        if i % 3 == 0:
            g = gs[i // 3]
            works.append(dist.all_gather_into_tensor(g, torch.full((7,), float(r * 100 + i)),
                                                     async_op=True))
    for w in reversed(works):
        w.wait()
    out["reverse"] = [t[0].item() for t in ts] + [t[-1].item() for t in ts]
    out["gathered"] = [g.tolist() for g in gs]
    out["all_done"] = all(w.is_completed() for w in works)

    # A blocking op issued behind queued async ops, then the async ops' futures.
    a = [torch.full((4096,), float(r)) for _ in range(6)]
    ws = [dist.all_reduce(t, async_op=True) for t in a]
    b = torch.full((10,), 1.0)
    dist.all_reduce(b)
    out["blocking_behind"] = b.tolist()
    out["futures"] = [w.get_future().wait()[0][0].item() for w in ws]

    # Two threads wait at once, on the same Work and on a later one; a then() callback
    # (run on whichever thread completes the op) sees the result.
    c = [torch.full((2048,), float(r + 1)) for _ in range(4)]
    ws = [dist.all_reduce(t, async_op=True) for t in c]
    chained = ws[1].get_future().then(lambda f: f.value()[0].sum().item())
    errors = []

    def waiter(w):
        try:
            w.wait()
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=waiter, args=(w,)) for w in (ws[3], ws[1], ws[3])]
    for th in threads:
        th.start()
    ws[2].wait()
    for th in threads:
        th.join(timeout=60)
    out["threads_alive"] = [th.is_alive() for th in threads]
    out["thread_errors"] = errors
    out["threaded"] = [t[0].item() for t in c]
    out["chained"] = chained.wait()

    # wait(timeout) keeps to its timeout while the op cannot finish (rank W-1 comes late),
    # and a later wait() still gets the result.
    t = torch.full((64,), float(r))
    if r == W - 1:
        time.sleep(2.5)
    t0 = time.monotonic()
    w = dist.all_reduce(t, async_op=True)
    if r != W - 1:
        try:
            w.wait(timeout=datetime.timedelta(seconds=0.3))
            out["timed"] = "returned"
        except RuntimeError as exc:
            out["timed"] = str(exc).splitlines()[0]
        out["timed_s"] = time.monotonic() - t0
    w.wait()
    out["late"] = t[0].item()
    return out


def test_async_ops_waited_in_any_order():
    W = 3
    res = launch(_orders, W, pg_timeout=60, deadline=180)
    total = sum(range(W))
    for r in range(W):
        o = res[r]
        want = [float(total + W * i) for i in range(24)]
        assert o["reverse"] == want + want, f"rank {r}: {o['reverse']}"
        for k, g in enumerate(o["gathered"]):
            i = 3 * k
            assert g == [float(q * 100 + i) for q in range(W) for _ in range(7)], (r, k, g)
        assert o["all_done"], f"rank {r}: a Work was not complete after its wait()"
        assert o["blocking_behind"] == [float(W)] * 10, o["blocking_behind"]
        assert o["futures"] == [float(total)] * 6, o["futures"]
        assert o["threads_alive"] == [False] * 3, f"rank {r}: a waiting thread hung"
        assert o["thread_errors"] == [], o["thread_errors"]
        assert o["threaded"] == [float(total + W)] * 4, o["threaded"]
        assert o["chained"] == 2048 * float(total + W), o["chained"]
        assert o["late"] == float(total), o["late"]
    for r in range(W - 1):
        o = res[r]
        assert "timed out" in o["timed"], f"rank {r}: wait(0.3 s) gave {o['timed']!r}"
        assert 0.25 <= o["timed_s"] <= 1.5, f"rank {r}: wait(0.3 s) took {o['timed_s']:.2f} s"
