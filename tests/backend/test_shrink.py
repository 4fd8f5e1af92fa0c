"""Going on after a lost rank: ``torch.distributed.shrink_group`` on the rsdp backend.

A rank is SIGKILLed in the middle of a collective or of training, or frozen past the timeout;
the survivors see the failure (the backend names the rank), call ``dist.shrink_group`` as torch
documents it, and the smaller group must then be exact: all-reduce, all-gather, reduce-scatter,
broadcast, FSDP2 (``full_shard``) and the seven-strategy mix (tests/support/plan_cases.py) trained
against the one-process reference. Also: both shrink flags, a non-default group, two emulated
nodes losing a node leader, torch's documented errors, and ten kill-and-shrink cycles in one
process without a leak.
"""
from __future__ import annotations

import datetime
import gc
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT

from backend.test_faults import names_rank
from backend.test_leaks import RSS_SLACK_KB, measure, settled
from support import plan_cases as pc
from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="shrink_group is the rsdp backend's (gloo cannot)")

TIGHT = 2e-5


def _exact_collectives(tag: str) -> dict:
    """Collectives on the (shrunk) default group, checked exactly; returns what was seen."""
    r, W = dist.get_rank(), dist.get_world_size()
    x = torch.full((100_003,), float(r + 1))
    dist.all_reduce(x)
    assert bool((x == W * (W + 1) / 2).all()), f"{tag}: all_reduce gave {x[:3].tolist()}"
    out = torch.empty(W * 5, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.full((5,), r, dtype=torch.int64))
    assert out.tolist() == [q for q in range(W) for _ in range(5)], f"{tag}: all_gather {out.tolist()}"
    inp = torch.arange(W * 7, dtype=torch.float64) * (r + 1)
    rs = torch.empty(7, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, inp)
    want = torch.arange(r * 7, (r + 1) * 7, dtype=torch.float64) * (W * (W + 1) / 2)
    assert torch.equal(rs, want), f"{tag}: reduce_scatter {rs.tolist()} != {want.tolist()}"
    b = torch.full((9,), 7.0) if r == 0 else torch.zeros(9)
    dist.broadcast(b, src=0)
    assert bool((b == 7).all()), f"{tag}: broadcast {b.tolist()}"
    import torch_rsdp
    torch_rsdp.monitored_barrier(timeout=datetime.timedelta(seconds=20))
    return {"rank": r, "size": W, "topology": torch_rsdp.topology()["nodes"]}


def _train_exact(tag: str) -> None:
    """FSDP2 and the seven-strategy mix on the current default group equal one process.

    hybrid_shard needs nodes of equal size; a group left with nodes of 2 and 1 ranks must
    say so, and trains the mix with full_shard in its place."""
    import torch_rsdp
    import torch_rsdp.plan as plan
    r, W = dist.get_rank(), dist.get_world_size()
    mix = dict(pc.MIX)
    if len({len(n) for n in torch_rsdp.topology()["nodes"]}) > 1:
        with pytest.raises(ValueError, match="hybrid_shard needs nodes of equal size"):
            plan.apply(pc.make_net(), mix)
        mix = {k: "full_shard" if v == "hybrid_shard" else v for k, v in mix.items()}
    for p in ("full_shard", "mix"):
        want = pc.reference(pc.make_net(), "adamw", W, 2)
        model = plan.apply(pc.make_net(), mix if p == "mix" else p)
        pc.train(model, pc.plan_optim(model, "adamw"), r, W, 2)
        pc.assert_close_sd(plan.full_state_dict(model, rank0_only=False), want, TIGHT,
                           f"{tag}: {p} after shrinking")


def _kill_self(ctx):
    ctx.store.set("killed_at", repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _survive(ctx, victims: list, flags: int, during: str):
    """Runs until the victims die (mid all_reduce or mid training), then shrinks and checks."""
    import torch_rsdp
    import torch_rsdp.plan as plan
    r, W = ctx.rank, ctx.world_size
    try:
        if during == "collective":
            t = torch.empty(1 << 21)  # 8 MiB: a kill lands inside the transfer
            for i in range(1000):
                if r in victims and i == 3:
                    _kill_self(ctx)
                t.fill_(1.0)
                dist.all_reduce(t)
        else:
            model = plan.apply(pc.make_net(), pc.MIX)
            opt = pc.plan_optim(model, "adamw")
            for step in range(100):
                if r in victims and step == 2:
                    _kill_self(ctx)
                pc.train(model, opt, r, W, 1, start=step)
        return {"outcome": "no failure seen"}
    except RuntimeError as e:
        seen = str(e)
    # Mid-training the failure may surface on one of the plan's subgroups first: the default
    # group learns of it at its next collective.
    with pytest.raises(RuntimeError):
        dist.all_reduce(torch.ones(1))
    error = str(torch_rsdp.group_error())
    t0 = time.monotonic()
    new = dist.shrink_group(list(victims), shrink_flags=flags)
    shrink_s = time.monotonic() - t0
    assert new is dist.group.WORLD, "the shrunk default group must become the default group"
    assert dist.get_world_size() == W - len(victims)
    assert dist.get_rank() == r - sum(v < r for v in victims), f"rank {r} -> {dist.get_rank()}"
    after_kill = time.time() - float(ctx.store.get("killed_at"))
    seen_coll = _exact_collectives(f"rank {r}")
    _train_exact(f"rank {r}")
    return {"outcome": "shrunk", "seen": seen[:500], "error": error, "shrink_s": shrink_s,
            "recovered_s": after_kill, **seen_coll}


@pytest.mark.slow
@pytest.mark.parametrize("W,victims,flags,during,node_of,nodes_after", [
    (4, [1], SHRINK_DEFAULT, "collective", None, [[0, 1, 2]]),
    # node 1 loses its leader, and keeps one rank
    (4, [2], SHRINK_ABORT, "training", [0, 0, 1, 1], [[0, 1], [2]]),
    # a whole node is lost: the survivors are one node (shared memory only)
    (4, [2, 3], SHRINK_DEFAULT, "collective", [0, 0, 1, 1], [[0, 1]]),
], ids=["one-node-mid-collective", "two-nodes-leader-mid-training",
        "two-nodes-node-lost-mid-collective"])
def test_survivors_shrink_and_stay_exact(W, victims, flags, during, node_of, nodes_after):
    res = launch(_survive, W, (victims, flags, during), pg_timeout=15, deadline=300,
                 expect_killed=victims, node_of=node_of)
    for r in range(W):
        if r in victims:
            continue
        o = res[r]
        assert o["outcome"] == "shrunk", f"rank {r}: {o}"
        # Across nodes a survivor may first hear of it from a peer that gave up (and name
        # that peer); on the victim's node the dead rank itself is named.
        if node_of is None or node_of[r] in {node_of[v] for v in victims}:
            assert any(names_rank(o["seen"], v) for v in victims), (
                f"rank {r}'s error names none of {victims}: {o['seen']}")
        assert o["error"] == "ErrorType.REMOTE_ERROR", f"rank {r}: group_error {o['error']}"
        assert o["size"] == W - len(victims)
        assert o["topology"] == nodes_after, f"rank {r}: topology not recomputed: {o['topology']}"
        print(f"rank {r}: shrink {o['shrink_s'] * 1000:.0f} ms; kill to shrunk group "
              f"{o['recovered_s']:.2f} s; saw: {o['seen'][:160]}")


def _frozen(ctx, victim: int):
    """`victim` is frozen (SIGSTOP) by rank 0; the others time out, shrink and go on."""
    r = ctx.rank
    pids = [int(p) for p in ctx.store_sync("pid", str(os.getpid()).encode())]
    if r == 0:
        os.kill(pids[victim], signal.SIGSTOP)
    ctx.store_sync("frozen", ranks=[q for q in range(ctx.world_size) if q != victim])
    if r == victim:  # not reached while frozen; resumed only to be killed
        time.sleep(600)
    t = torch.ones(1000)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        dist.all_reduce(t)
    waited = time.monotonic() - t0
    import torch_rsdp
    error = str(torch_rsdp.group_error())
    dist.shrink_group([victim], shrink_flags=SHRINK_ABORT)
    out = _exact_collectives(f"rank {r}")
    if r == 0:
        os.kill(pids[victim], signal.SIGKILL)
    return {"seen": str(info.value)[:500], "waited": waited, "error": error, **out}


@pytest.mark.slow
def test_frozen_peer_past_the_timeout():
    res = launch(_frozen, 3, (2,), pg_timeout=3, deadline=180, expect_killed=[2])
    for r in (0, 1):
        o = res[r]
        assert "Timed out" in o["seen"] and names_rank(o["seen"], 2), f"rank {r}: {o['seen']}"
        assert 2.5 <= o["waited"] <= 15, f"rank {r} waited {o['waited']:.1f}s (timeout 3s)"
        assert o["error"] == "ErrorType.TIMEOUT", f"rank {r}: {o['error']}"
        assert o["size"] == 2


def _subgroup_and_errors(ctx):
    """A non-default group shrinks (the default group is left alone), and bad calls raise
    torch's documented errors."""
    r = ctx.rank
    sub = dist.new_group([1, 2, 3])
    if r == 3:
        _kill_self(ctx)
    if r == 0:  # not in the subgroup: nothing to do
        return {"rank": r}
    t = torch.ones(10)
    with pytest.raises(RuntimeError):
        for _ in range(100):
            dist.all_reduce(t, group=sub)
    errors = {}
    for name, call in {
        "empty": lambda: dist.shrink_group([], group=sub),
        "out of bounds": lambda: dist.shrink_group([3], group=sub),
        "duplicate": lambda: dist.shrink_group([2, 2], group=sub),
        "all": lambda: dist.shrink_group([0, 1, 2], group=sub),
        "self": lambda: dist.shrink_group([r - 1], group=sub),
        "flags": lambda: dist.shrink_group([2], group=sub, shrink_flags=7),
        "direct: duplicate": lambda: sub._get_backend(torch.device("cpu")).shrink([2, 2], 0, None),
        "direct: self": lambda: sub._get_backend(torch.device("cpu")).shrink([r - 1], 0, None),
    }.items():
        try:
            call()
            errors[name] = "no error"
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            kind = ("ValueError" if isinstance(e, ValueError) else
                    "RuntimeError" if isinstance(e, RuntimeError) else type(e).__name__)
            errors[name] = f"{kind}: {e}"
    new = dist.shrink_group([2], group=sub)  # group rank 2 = global rank 3
    assert new is not dist.group.WORLD and dist.get_world_size() == 4
    assert dist.get_process_group_ranks(new) == [1, 2], dist.get_process_group_ranks(new)
    x = torch.full((33,), float(r))
    dist.all_reduce(x, group=new)
    assert bool((x == 3.0).all()), x.tolist()
    out = [torch.empty(2) for _ in range(2)]
    dist.all_gather(out, torch.full((2,), float(r)), group=new)
    assert [o[0].item() for o in out] == [1.0, 2.0]
    return {"rank": r, "errors": errors}


@pytest.mark.slow
def test_shrink_a_subgroup_and_bad_calls():
    res = launch(_subgroup_and_errors, 4, pg_timeout=15, deadline=180, expect_killed=[3])
    for r in (1, 2):
        e = res[r]["errors"]
        for name in ("empty", "out of bounds", "duplicate", "all", "flags"):
            assert e[name].startswith("ValueError"), f"rank {r}, {name}: {e[name]}"
        assert e["self"].startswith("RuntimeError"), f"rank {r}: {e['self']}"
        assert e["direct: duplicate"].startswith("ValueError") and "rank 2" in e["direct: duplicate"]
        assert e["direct: self"].startswith("RuntimeError") and "excluded" in e["direct: self"]


CYCLES = 10


def _cycles(ctx):
    """Every cycle the highest rank dies mid all_reduce and the rest shrink; returns the
    process's fds/threads/shm/RSS after each cycle (survivors only)."""
    r, W = ctx.rank, ctx.world_size
    seen = []
    for c in range(CYCLES):
        n = dist.get_world_size()
        me = dist.get_rank()
        t = torch.empty(1 << 18)
        try:
            for i in range(1000):
                if me == n - 1 and i == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                t.fill_(1.0)
                dist.all_reduce(t)
            raise AssertionError(f"cycle {c}: the death of rank {n - 1} was not seen")
        except RuntimeError:
            pass
        dist.shrink_group([n - 1])
        x = torch.full((1001,), float(dist.get_rank() + 1))
        dist.all_reduce(x)
        m = n - 1
        assert bool((x == m * (m + 1) / 2).all()), f"cycle {c}: {x[:3].tolist()}"
        gc.collect()
        m = settled(seen[0]) if seen else measure()
        seen.append(dict(m, size=dist.get_world_size()))
    return {"rank": r, "cycles": seen}


@pytest.mark.slow
def test_ten_kill_and_shrink_cycles_leak_nothing():
    W = CYCLES + 1
    res = launch(_cycles, W, pg_timeout=20, deadline=400, expect_killed=list(range(1, W)))
    ms = res[0]["cycles"]
    base = ms[0]

    def fds(m):
        """Open fds apart from the pidfds that watch the group's live peers (one each)."""
        pidfds = sum("[pidfd]" in t for t in m["fd_targets"])
        assert pidfds == m["size"] - 1, f"{pidfds} pidfds for {m['size'] - 1} peers"
        return sorted(t.split("->")[1] for t in m["fd_targets"] if "[pidfd]" not in t)

    for c, m in enumerate(ms[1:], start=2):
        assert len(fds(m)) == len(fds(base)), (
            f"fds after cycle 1: {fds(base)}, after cycle {c}: {fds(m)}")
        assert m["threads"] == base["threads"], f"threads {base['threads']} -> {m['threads']} (cycle {c})"
        assert m["shm"] == base["shm"], f"/dev/shm {base['shm']} -> {m['shm']} (cycle {c})"
        growth = m["rss_kb"] - base["rss_kb"]
        assert growth < RSS_SLACK_KB, f"RSS grew {growth} KiB by cycle {c}"
