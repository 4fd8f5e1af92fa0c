"""The hand-off probe runs again while a group lives (csrc/transport/shm/handoff_probe.h): the
host can move the vCPUs under a running group, so every 4096 collectives the group probes again
and adopts the mode it measures (`topology()["handoff"]["probes"]` counts the probes). The probe
is no collective of the user's: results stay exact across it, and a later error still names the
user's collective by its own number (#4196 is the user's 4196th, the probe not counted). A
forced RSDP_SHM_STORES setting survives the re-probe; left to choose, the group streams exactly
when its probe's hand-off was clearly faster with streaming stores. 2 ranks (a core each on a 2-core machine,
so the probe measures); a few seconds.
"""

from __future__ import annotations

import pytest

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp", reason="rsdp's own probe")
REPROBE = 4096  # kReprobeCollectives


def _worker(ctx):
    import torch
    import torch.distributed as dist

    import torch_rsdp

    first = torch_rsdp.topology()["handoff"]
    t = torch.ones(16)
    for i in range(REPROBE + 99):
        t.fill_(ctx.rank + 1)
        dist.all_reduce(t)
        if t[0].item() != 3.0:
            raise AssertionError(f"rank {ctx.rank}: all_reduce #{i + 1} gave {t[0].item()}")
    after = torch_rsdp.topology()["handoff"]
    # The user's collective #4196: mismatched sizes.
    bad = torch.ones(4 + ctx.rank)
    try:
        dist.all_reduce(bad)
        error = None
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        error = str(exc)
    return {"first": first, "after": after, "error": error}


@pytest.mark.parametrize("stores", [None, "streaming"], ids=["auto", "forced-streaming"])
def test_the_group_probes_again_and_keeps_counting_the_users_collectives(stores):
    res = launch(_worker, 2, env={"RSDP_SHM_STORES": stores}, deadline=180, pg_timeout=30,
                 raise_on_error=True)
    for rank, out in enumerate(res.values()):
        first, after = out["first"], out["after"]
        assert first["mode"] in ("near", "far") and first["probes"] == 1, (rank, first)
        assert after["mode"] in ("near", "far") and after["probes"] == 2, (rank, after)
        for h in (first, after):
            assert h["cached_gbps"] > 0 and h["streamed_gbps"] > 0, (rank, h)
        if stores:
            assert first["stores"] == after["stores"] == stores, (rank, first, after)
        else:  # auto: streaming only where the probe's hand-off was >= 15% faster with it
            for h in (first, after):
                faster = h["streamed_gbps"] * 0.85 > h["cached_gbps"]
                assert h["stores"] == ("streaming" if faster else "cached"), (rank, h)
        error = out["error"] or ""
        assert "collective mismatch" in error and f"collective #{REPROBE + 100}" in error, \
            (rank, error)
