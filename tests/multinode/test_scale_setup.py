"""Set-up and endpoints at scale (docs/scale.md): a group's set-up costs every rank but group
rank 0 the same few store requests whatever its size (rank 0 gathers the peer records and posts
one table), and UCX endpoints are made on first use, so a rank holds one per peer its
collectives reach. Ranks on emulated loopback nodes (RSDP_NODE_ID), 2 per node, at 4, 8 and 16
ranks; the all-reduce is forced onto the flat ring (RSDP_ALGO_ALLREDUCE=ring), whose every rank
reaches exactly its two ring neighbours. Then a peer that joins the group but never publishes
its UCX address: the first collective and the first send to it name it at their deadline."""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import torch_rsdp
from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="store requests and endpoints are rsdp's")

ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "RSDP_POOL_BYTES": "0",
       "RSDP_ALGO_ALLREDUCE": "ring"}


def _setup_costs(ctx):
    topo = torch_rsdp.topology()
    before = torch_rsdp.comm_stats()["ucx_endpoints"]
    t = torch.ones(1 << 16)  # 256 KiB: the ring proper, every rank sends and receives
    dist.all_reduce(t)
    ok = bool((t == ctx.world_size).all())
    return {"requests": topo["setup_store_requests"], "eps_before": before,
            "eps_after": torch_rsdp.comm_stats()["ucx_endpoints"], "ok": ok}


def test_setup_requests_and_endpoints_do_not_grow_with_ranks():
    per_size = {}
    for w in (4, 8, 16):
        res = launch(_setup_costs, w, env=ENV, node_of=[r // 2 for r in range(w)], deadline=240,
                     pg_timeout=60)
        per_size[w] = [res[r] for r in range(w)]
    for w, outs in per_size.items():
        print(f"\n{w} ranks: store requests at set-up "
              f"{[o['requests'] for o in outs]}, endpoints {[o['eps_after'] for o in outs]}")
        for r, o in enumerate(outs):
            assert o["ok"], f"{w} ranks: rank {r}: wrong all_reduce result"
            assert o["eps_before"] == 0, f"{w} ranks: rank {r} had endpoints before any op: {o}"
            # A ring over all ranks: this rank sends to one neighbour, receives from the other.
            assert o["eps_after"] == 2, f"{w} ranks: rank {r} holds {o['eps_after']} endpoints"
    for kind, pick in (("group rank 0", lambda outs: outs[:1]),
                       ("the other ranks", lambda outs: outs[1:])):
        most = {w: max(o["requests"] for o in pick(outs)) for w, outs in per_size.items()}
        assert most[16] == most[4] and most[8] == most[4], (
            f"set-up store requests of {kind} grow with the group's size: {most}")


# --------------------------------------------------------------------------------------------
# a peer that never publishes its UCX address
# --------------------------------------------------------------------------------------------

SILENT_TIMEOUT = 3.0


def _silent_pair(ctx):
    """Rank 0: a real rank on node a. Rank 1: a plain process that joins the group's store
    protocol as group rank 1 on node b (its peer record) and never publishes a UCX address."""
    st = ctx.store
    gs = dist.PrefixStore("cpu/", dist.PrefixStore("0/", dist.PrefixStore("/silent/", st)))
    if ctx.rank == 1:
        gs.add("rsdp/joined/2", 1)
        gs.set("rsdp/2/0/peer/1", f"rsdp1|peer|1|{os.getpid()}|silent-node-b")
        st.get("silent/done")  # waits
        return "silent"
    dist.init_process_group("rsdp", store=dist.PrefixStore("/silent/", st), rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=SILENT_TIMEOUT))
    out = {}
    try:
        # The send first: its timeout leaves the group usable, the collective's does not.
        for what, op in (("send", lambda: dist.send(torch.ones(4), dst=1)),
                         ("all_reduce", lambda: dist.all_reduce(torch.ones(4)))):
            t0 = time.monotonic()
            try:
                op()
                out[what] = {"raised": False}
            except Exception as e:  # noqa: BLE001
                out[what] = {"raised": True, "msg": str(e)[:2000]}
            out[what]["elapsed"] = time.monotonic() - t0
        out["eps"] = torch_rsdp.comm_stats()["ucx_endpoints"]
    finally:
        dist.destroy_process_group()
        st.set("silent/done", "1")
    return out


def test_peer_that_never_publishes_its_address_is_named():
    res = launch(_silent_pair, 2, init=False, deadline=120, pg_timeout=SILENT_TIMEOUT,
                 env={**ENV, "RSDP_NODE_ID": "silent-node-a"})
    out = res[0]
    for what in ("all_reduce", "send"):
        o = out[what]
        print(f"\n{what}: {o['elapsed']:.2f} s: {o.get('msg', '')[:300]}")
        assert o["raised"], f"{what} to a peer without an address succeeded"
        assert "rank 1" in o["msg"] and "publish its UCX address" in o["msg"], o["msg"]
        assert o["elapsed"] <= SILENT_TIMEOUT + 2, f"{what} took {o['elapsed']:.1f} s"
    assert out["eps"] == 0, f"endpoints left to a peer that never published: {out['eps']}"
