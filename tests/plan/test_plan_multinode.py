"""torch_rsdp.plan across 2 emulated nodes x 2 ranks (network namespaces, or the loopback with
RSDP_NODE_ID where namespaces cannot be made; see test_multinode.py).

Here ``hybrid_shard`` differs from ``full_shard``: its mesh is (replicate = 2 nodes, shard = 2
ranks of a node). Checked: every strategy alone and the seven-way mix train like one process;
the hybrid mesh's shard groups are the nodes and its replicate groups the rails; the traffic
counters show hybrid_shard's all-gathers and reduce-scatters never leave the node, and that it
sends fewer bytes across the node link than full_shard for the same step.
"""
from __future__ import annotations

import pytest
import torch

from support import plan_cases as pc
from support.harness import backend_under_test, format_family_failures, launch, run_families

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="topology and traffic counters are rsdp's")

NODE_OF = (0, 0, 1, 1)


def fam_strategies(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for p in ("full_shard", "hybrid_shard", "rotate", "split:2", "mix"):
        with rec.case(p):
            want = pc.reference(pc.make_net(), "adamw", W, 2)
            import torch_rsdp.plan as plan
            model = plan.apply(pc.make_net(seed=r), pc.MIX if p == "mix" else p)
            pc.train(model, pc.plan_optim(model, "adamw"), r, W, 2)
            pc.assert_close_sd(plan.full_state_dict(model, rank0_only=False), want, 2e-5, p)


def _step_traffic(strategy: str, rank: int, world: int):
    """Inter-node bytes this rank sent, per process group, for one training step."""
    import torch_rsdp
    import torch_rsdp.plan as plan
    model = plan.apply(pc.make_net(), {"blocks.*": strategy}, default="full_shard")
    opt = pc.plan_optim(model, "sgd")
    mesh = plan.plan_state(model).meshes
    groups = {"world": None}
    if strategy == "hybrid_shard":
        hm = mesh.hybrid()
        groups.update(shard=hm.get_group("shard"), replicate=hm.get_group("replicate"))
    pc.train(model, opt, rank, world, 1)  # first step: lazy initialisation done
    for g in groups.values():
        torch_rsdp.reset_comm_stats(g)
    pc.train(model, opt, rank, world, 1, start=1)
    return {k: torch_rsdp.comm_stats(g) for k, g in groups.items()}, model


def fam_hybrid_traffic(ctx, rec):
    import torch.distributed as dist
    W, r = ctx.world_size, ctx.rank
    with rec.case("mesh layout"):
        import torch_rsdp.plan as plan
        model = plan.apply(pc.make_net(), "hybrid_shard")
        hm = plan.plan_state(model).meshes.hybrid()
        shard = dist.get_process_group_ranks(hm.get_group("shard"))
        rail = dist.get_process_group_ranks(hm.get_group("replicate"))
        assert shard == [q for q in range(W) if NODE_OF[q] == NODE_OF[r]], shard
        assert rail == [q for q in range(W) if q % 2 == r % 2], rail
    with rec.case("hybrid stays in the node; less across the link than full_shard"):
        hyb, _ = _step_traffic("hybrid_shard", r, W)
        full, _ = _step_traffic("full_shard", r, W)
        assert hyb["shard"]["inter_node_bytes"] == 0, hyb["shard"]
        assert hyb["shard"]["intra_node_bytes"] > 0, hyb["shard"]
        assert hyb["replicate"]["inter_node_bytes"] > 0, hyb["replicate"]
        # the blocks' bytes across the link: hybrid moves only the gradient all-reduce of one
        # node's shard, full_shard all-gathers (twice) and reduce-scatters across the link
        h = sum(s["inter_node_bytes"] for s in hyb.values())
        f = full["world"]["inter_node_bytes"]
        assert h < 0.75 * f, f"hybrid_shard sent {h} bytes across nodes, full_shard {f}"


FAMILIES = {"strategies": fam_strategies, "hybrid_traffic": fam_hybrid_traffic}


def families_worker(ctx, names):
    torch.set_num_threads(1)
    return run_families(ctx, FAMILIES, names)


def test_plan_two_nodes(nodes):
    res = launch(families_worker, len(NODE_OF), (list(FAMILIES),), node_of=NODE_OF,
                 netns=nodes, deadline=500, pg_timeout=90)
    results = {r: res[r] for r in range(len(NODE_OF))}
    for fam in FAMILIES:
        msg = format_family_failures(results, fam)
        assert msg is None, msg


def test_bench_strategies_quick(tmp_path):
    """The strategy benchmark runs end to end (2x2, full_shard and hybrid_shard, one step) and
    its traffic check holds: hybrid_shard sends fewer bytes across the node link."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "strategies", "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.load(open(tmp_path / "strategies.json"))["results"]
    assert [r["plan"] for r in out["rows"]] == ["full_shard", "hybrid_shard"], out["rows"]
    assert all(r["tokens_per_s"] > 0 and r["mem_peak_bytes"] > 0 for r in out["rows"])
    fewer = [c for c in out["checks"] if "fewer bytes" in c["check"]]
    assert fewer and fewer[0]["ok"], out["checks"]
    assert (tmp_path / "strategies.md").stat().st_size > 0
