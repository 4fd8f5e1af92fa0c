"""The hand-off probe runs again while a group lives (csrc/transport/shm/handoff_probe.h): the
host can move the vCPUs under a running group, so the group probes again on group rank 0's clock
(RSDP_REPROBE_MS, 1 s by default; 50 ms here) and adopts the mode it measures
(`topology()["handoff"]["probes"]` counts the probes). Rank 0 alone decides ([Note: re-probing
on rank 0's clock]): ranks whose settings differ still probe together, as rank 0's says. The
probe is no collective of the user's: results stay exact across it, and a later error still
names the user's collective by its own number (#301 is the user's 301st, probes not counted).
A forced RSDP_SHM_STORES setting survives the re-probe; left to choose, the group streams
exactly when its probe's hand-off was clearly faster with streaming stores. 2 ranks (a core
each on a 2-core machine, so the probe measures); a few seconds.
"""

from __future__ import annotations

import pytest

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp", reason="rsdp's own probe")
INTERVAL_MS = 50
OPS = 300


def _run(ctx, group):
    """OPS exact all-reduces with two pauses past the interval; the probe counts around them."""
    import time

    import torch
    import torch.distributed as dist

    import torch_rsdp

    first = torch_rsdp.topology(group)["handoff"]
    t = torch.ones(16)
    for i in range(OPS):
        t.fill_(ctx.rank + 1)
        dist.all_reduce(t, group=group)
        if t[0].item() != 3.0:
            raise AssertionError(f"rank {ctx.rank}: all_reduce #{i + 1} gave {t[0].item()}")
        if i in (99, 199):  # rank 0's interval passes: it asks for a probe
            time.sleep(3 * INTERVAL_MS / 1000)
    return first, torch_rsdp.topology(group)["handoff"]


def _worker(ctx):
    import os

    import torch
    import torch.distributed as dist

    first, after = _run(ctx, None)
    # The user's collective #301: mismatched sizes.
    bad = torch.ones(4 + ctx.rank)
    try:
        dist.all_reduce(bad)
        error = None
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        error = str(exc)
    # Settings that differ between the ranks: rank 0's decides, for both ranks.
    decided = {}
    for name, rank0 in (("rank 0 off", "0"), ("rank 0 on", str(INTERVAL_MS))):
        other = str(INTERVAL_MS) if rank0 == "0" else "0"
        os.environ["RSDP_REPROBE_MS"] = rank0 if ctx.rank == 0 else other
        group = dist.new_group(backend="rsdp")
        decided[name] = _run(ctx, group)[1]["probes"]
        dist.destroy_process_group(group)
    return {"first": first, "after": after, "error": error, "decided": decided}


@pytest.mark.parametrize("stores", [None, "streaming"], ids=["auto", "forced-streaming"])
def test_the_group_probes_again_and_keeps_counting_the_users_collectives(stores):
    res = launch(_worker, 2, env={"RSDP_SHM_STORES": stores, "RSDP_REPROBE_MS": INTERVAL_MS},
                 deadline=180, pg_timeout=30, raise_on_error=True)
    for rank, out in enumerate(res.values()):
        first, after = out["first"], out["after"]
        assert first["mode"] in ("near", "far") and first["probes"] == 1, (rank, first)
        # At least the two that the pauses asked for (more where a slow machine let the
        # interval pass between collectives too).
        assert after["mode"] in ("near", "far") and after["probes"] >= 3, (rank, after)
        for h in (first, after):
            assert h["cached_gbps"] > 0 and h["streamed_gbps"] > 0, (rank, h)
        if stores:
            assert first["stores"] == after["stores"] == stores, (rank, first, after)
        else:  # auto: streaming only where the probe's hand-off was >= 15% faster with it
            for h in (first, after):
                faster = h["streamed_gbps"] * 0.85 > h["cached_gbps"]
                assert h["stores"] == ("streaming" if faster else "cached"), (rank, h)
        error = out["error"] or ""
        assert "collective mismatch" in error and f"collective #{OPS + 1}" in error, \
            (rank, error)
        assert out["decided"]["rank 0 off"] == 1, (rank, out["decided"])
        assert out["decided"]["rank 0 on"] >= 3, (rank, out["decided"])
    assert res[0]["after"]["probes"] == res[1]["after"]["probes"], res
    assert res[0]["decided"] == res[1]["decided"], res


def _dies_before_the_probe(ctx):
    import os
    import signal
    import time

    import torch
    import torch.distributed as dist

    t = torch.ones(16)
    for i in range(1, 6):
        # Pauses past rank 0's interval before #2 and #4: whatever it scheduled earlier has
        # run by #3, and starting #4 it names #5 for the probe.
        if i in (2, 4):
            time.sleep(3 * INTERVAL_MS / 1000)
        if i == 5 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t)
        except Exception as exc:  # noqa: BLE001 - the message is what is checked
            return i, str(exc)
    return None


def test_a_rank_that_dies_before_the_probe_is_named_with_it():
    """Rank 0 runs the probe before the user's #5 and rank 1 is gone: the error names the
    probe and the collective it came before, not a barrier the user never called."""
    res = launch(_dies_before_the_probe, 2, env={"RSDP_REPROBE_MS": INTERVAL_MS},
                 expect_killed=[1], deadline=120, pg_timeout=30, raise_on_error=True)
    op, error = res[0]
    assert op == 5, (op, error)
    assert "rank 1" in error and "exited during the hand-off probe before collective #5" \
        in error, error


SLOW_OPS = 100  # per phase


def _slowed(ctx):
    """1 MiB all-reduces that group rank 0 times as steady, then as 4x slower from the
    collective RSDP_TEST_PLACEMENT names on, then more of those; the early probes group rank
    0 asked for after each phase."""
    import time

    import torch
    import torch.distributed as dist

    import torch_rsdp

    t = torch.empty(1 << 18)
    counts = []
    for phase in ("steady", "slowed", "slowed still"):
        for i in range(SLOW_OPS):
            t.fill_(ctx.rank + 1)
            dist.all_reduce(t)
            if t[0].item() != 3.0 or t[-1].item() != 3.0:
                raise AssertionError(f"rank {ctx.rank}: {phase} all_reduce #{i} wrong")
        counts.append(torch_rsdp.topology()["handoff"]["early_probes"])
        # An early probe comes at least 50 ms after the last (ShmComm::kEarlyReprobeGap): a
        # fast machine runs the phases in less.
        time.sleep(0.1)
    return counts, torch_rsdp.topology()["handoff"]["probes"]


def test_collectives_that_slow_ask_for_an_early_probe():
    """[Note: a placement that changes under a group]: with the periodic re-probe out of reach
    (RSDP_REPROBE_MS 10 min), group rank 0's collectives slow 4x from the first of the second
    phase on, and it asks for a probe (`early_probes`) without waiting for its clock; the
    slower time is the new normal after it. The other rank counts none: rank 0 decides.

    The slowdown is stated (RSDP_TEST_PLACEMENT's slow_from: rank 0 times its collectives as
    1 ns a byte, then 4), not made by crowding the ranks onto one CPU: how much that slows a
    collective is the host's business (1.3x to 3x across the hosts seen), and the rule that
    judges measured times is tests/native/test_slow_watch.cpp's. What this checks is the
    wiring: rank 0 times each collective, the watch asks, the probe runs on every rank before
    the same collective, the watch restarts, and results stay exact."""
    res = launch(_slowed, 2, env={"RSDP_REPROBE_MS": 600_000,
                                  "RSDP_TEST_PLACEMENT": f"slow_from={SLOW_OPS + 1}"},
                 deadline=180, pg_timeout=30, raise_on_error=True)
    (steady, slowed, again), probes = res[0]
    assert steady == 0, f"an early probe while nothing changed: {res[0]}"
    assert slowed == 1, f"not one early probe after the collectives slowed: {res[0]}"
    assert again == slowed, f"the slower time never became the normal: {res[0]}"
    assert probes == 1 + again, res
    assert res[1][0] == [0, 0, 0] and res[1][1] == probes, res
