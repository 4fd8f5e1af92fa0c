"""Shared memory's adaptation to the placement (csrc/transport/shm/adaptation.h).

RSDP_SHM_ADAPT chooses how much of it runs: `off` (no probe, cached stores), `once` (the
hand-off probe when the group is made) or `continuous` (the default: and again once a second
while collectives run, on group rank 0's clock; `topology()["handoff"]["probes"]` counts the
probes). Rank 0's mode decides for the group ([Note: adapting to the placement]): ranks whose
settings differ still probe together, as rank 0's says. The probe is no collective of the
user's: results stay exact across it, and a later error still names the user's collective by
its own number (#301 is the user's 301st, probes not counted). A forced store setting (the
test hook RSDP_TEST_SHM_STORES) survives the re-probe; left to choose, the group streams
exactly when its probe's hand-off was clearly faster with streaming stores. 2 ranks (a core
each on a 2-core machine, so the probe measures); about 15 s.
"""

from __future__ import annotations

import pytest

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp", reason="rsdp's own probe")
INTERVAL_S = 1.0  # Adaptation::kReprobeInterval
OPS = 300


def _run(ctx, group, pauses=(99, 199)):
    """OPS exact all-reduces with pauses past the interval; the probe counts around them."""
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
        if i in pauses:  # rank 0's interval passes: it asks for a probe
            time.sleep(INTERVAL_S * 1.2)
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
    for rank0, other in (("off", "continuous"), ("once", "continuous"), ("continuous", "off")):
        os.environ["RSDP_SHM_ADAPT"] = rank0 if ctx.rank == 0 else other
        group = dist.new_group(backend="rsdp")
        h = _run(ctx, group, pauses=(99,))[1]
        decided[rank0] = (h["adapt"], h["probes"], h["mode"])
        dist.destroy_process_group(group)
    return {"first": first, "after": after, "error": error, "decided": decided}


@pytest.mark.parametrize("stores", [None, "streaming"], ids=["chosen", "forced-streaming"])
def test_the_group_probes_again_and_keeps_counting_the_users_collectives(stores):
    res = launch(_worker, 2, env={"RSDP_TEST_SHM_STORES": stores}, deadline=180, pg_timeout=30,
                 raise_on_error=True)
    for rank, out in enumerate(res.values()):
        first, after = out["first"], out["after"]
        assert first["adapt"] == "continuous", (rank, first)
        assert first["mode"] in ("near", "far") and first["probes"] == 1, (rank, first)
        # At least the two that the pauses asked for (more where a slow machine let the
        # interval pass between collectives too).
        assert after["mode"] in ("near", "far") and after["probes"] >= 3, (rank, after)
        for h in (first, after):
            assert h["cached_gbps"] > 0 and h["streamed_gbps"] > 0, (rank, h)
        if stores:
            assert first["stores"] == after["stores"] == stores, (rank, first, after)
        else:  # streaming only where the probe's hand-off was >= 15% faster with it
            for h in (first, after):
                faster = h["streamed_gbps"] * 0.85 > h["cached_gbps"]
                assert h["stores"] == ("streaming" if faster else "cached"), (rank, h)
        error = out["error"] or ""
        assert "collective mismatch" in error and f"collective #{OPS + 1}" in error, \
            (rank, error)
        decided = out["decided"]
        assert decided["off"] == ("off", 0, "unmeasured"), (rank, decided)
        assert decided["once"][:2] == ("once", 1), (rank, decided)
        assert decided["continuous"][0] == "continuous" and decided["continuous"][1] >= 2, \
            (rank, decided)
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
            time.sleep(INTERVAL_S * 1.2)
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
    res = launch(_dies_before_the_probe, 2, expect_killed=[1], deadline=120, pg_timeout=30,
                 raise_on_error=True)
    op, error = res[0]
    assert op == 5, (op, error)
    assert "rank 1" in error and "exited during the hand-off probe before collective #5" \
        in error, error
