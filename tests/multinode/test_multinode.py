"""The backend across emulated nodes: topology, every collective under every algorithm,
traffic counters against theory, a whole node dying, and cleanup of the emulation.

Nodes are network namespaces on one bridge (torch_rsdp.testing.netns, needs root): ranks of
one node share memory, nodes talk over veth links (UCX_TLS=tcp). Where namespaces cannot be
created, the same tests run with every rank on the loopback and RSDP_NODE_ID=node<i> telling
the nodes apart; a warning says so (the mode is also printed at the top of the module).

Topologies: 2 nodes x 2 ranks, 3 x 1, and uneven 1 + 2 / 2 + 1 ranks (hierarchical
algorithms fall back to flat ones there, so forcing them runs what auto runs: no hier batch).
One launch per (topology, algorithm setting) runs all selected families of
collective_families.py, as test_collectives.py does:
  auto  every family (the reduced dtype x op matrix of collective_families.REDUCED);
  hier  RSDP_ALGO_*=hier for every op that has it;
  flat  ring / tree / flat;
  rd    recursive doubling over all ranks for all_reduce (its families only);
the forced settings run the families whose algorithm they change. The 2x2 hier/flat launches also compare torch_rsdp.comm_stats() with
traffic_theory.py. Against gloo (RSDP_TEST_BACKEND=gloo) only the auto setting runs, without
the rsdp-specific topology and traffic checks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from support.collective_families import FAMILIES, MIN_WORLD, use_reduced_matrix
from support.harness import (assert_family, backend_under_test, launch, launch_families,
                     run_families)
from torch_rsdp.testing import netns
from support.traffic_theory import inter_node_bytes_per_node, tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RSDP = backend_under_test() == "rsdp"

TOPOLOGIES = {"2x2": (0, 0, 1, 1), "3x1": (0, 1, 2), "1+2": (0, 1, 1), "2+1": (0, 0, 1)}
ALGO_OPS = ("ALLREDUCE", "ALLGATHER", "REDUCE_SCATTER", "BROADCAST", "REDUCE", "BARRIER")
SETTINGS = {
    "auto": {},
    "hier": {f"RSDP_ALGO_{op}": "hier" for op in ALGO_OPS},
    "flat": {"RSDP_ALGO_ALLREDUCE": "ring", "RSDP_ALGO_ALLGATHER": "ring",
             "RSDP_ALGO_REDUCE_SCATTER": "ring", "RSDP_ALGO_BROADCAST": "tree",
             "RSDP_ALGO_REDUCE": "tree", "RSDP_ALGO_BARRIER": "flat"},
    "rd": {"RSDP_ALGO_ALLREDUCE": "rd"},  # recursive doubling over all ranks (any size)
}
# Families each forced setting changes the algorithm of (default: FORCED_FAMILIES).
SETTING_FAMILIES = {"rd": ("all_reduce", "all_reduce_coalesced")}
# Families whose algorithm the forced settings change (gather, scatter, all_to_all and
# send/recv have one algorithm across nodes: they run under auto only).
FORCED_FAMILIES = ("broadcast", "all_reduce", "all_reduce_coalesced", "reduce", "all_gather",
                   "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                   "barrier", "noncontiguous")
DEADLINE = 300
PG_TIMEOUT = 30



def _families(topo: str, setting: str) -> list[str]:
    ws = len(TOPOLOGIES[topo])
    names = [f for f in FAMILIES if ws >= MIN_WORLD.get(f, 1)]
    if setting != "auto":
        names = [f for f in names if f in SETTING_FAMILIES.get(setting, FORCED_FAMILIES)]
    front = ["topology"] if RSDP and setting == "auto" else []
    back = ["traffic"] if RSDP and setting in ("hier", "flat") and topo == "2x2" else []
    last = [f for f in names if f == "reinit"]  # it replaces the default group: keep it last
    return front + [f for f in names if f != "reinit"] + back + last


# --------------------------------------------------------------------------------------------
# Families that only make sense across nodes (run inside workers)
# --------------------------------------------------------------------------------------------


def expected_topology(node_of, rank: int) -> dict:
    """What torch_rsdp.topology() must say; nodes are numbered by their lowest rank."""
    order = list(dict.fromkeys(node_of))
    nodes = [[r for r, n in enumerate(node_of) if n == label] for label in order]
    node = order.index(node_of[rank])
    local = nodes[node].index(rank)
    return {"rank": rank, "size": len(node_of), "node": node, "num_nodes": len(nodes),
            "local_rank": local, "local_size": len(nodes[node]), "nodes": nodes,
            "rail": [nd[local] for nd in nodes if len(nd) > local],
            "leaders": [nd[0] for nd in nodes],
            "uniform": len({len(nd) for nd in nodes}) == 1}


def _check_topology(got: dict, exp: dict, what: str) -> None:
    norm = {k: ([list(x) for x in v] if k == "nodes" else list(v) if isinstance(v, (list, tuple))
                else v) for k, v in got.items() if k in exp}
    bad = {k: (norm.get(k), v) for k, v in exp.items() if norm.get(k) != v}
    assert not bad, f"{what}: wrong keys (got, expected): {bad}"


def fam_topology(ctx, rec):
    import torch_rsdp

    node_of, r, W = ctx.node_of, ctx.rank, ctx.world_size
    with rec.case("topology() of the world"):
        _check_topology(torch_rsdp.topology(), expected_topology(node_of, r), "topology()")
    # a subgroup without rank 0: other node sizes, group ranks != world ranks
    members = list(range(1, W))
    with rec.case(f"topology() of subgroup {members}"):
        g = dist.new_group(ranks=members)
        if r in members:
            sub = [node_of[q] for q in members]
            _check_topology(torch_rsdp.topology(g), expected_topology(sub, members.index(r)),
                            f"topology(subgroup {members})")


def fam_traffic(ctx, rec):
    """comm_stats() after one forced-algorithm collective = traffic_theory, per node."""
    import torch_rsdp

    algo = {"hier": "hier", "flat": "ring"}[ctx.setting]
    node_of, r, W = ctx.node_of, ctx.rank, ctx.world_size
    M = len(set(node_of))
    L = W // M
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for n in (1 << 18, (1 << 18) + 5):  # float32 elements: even splits, then uneven ones
            with rec.case(f"{op} {algo} n={n}"):
                x = torch.full((n,), float(r + 1))
                torch_rsdp.reset_comm_stats()
                if op == "all_reduce":
                    dist.all_reduce(x)
                elif op == "all_gather":
                    dist.all_gather_into_tensor(torch.empty(W * n), x)
                else:
                    dist.reduce_scatter_tensor(torch.empty(n), torch.full((W * n,), float(r)))
                stats = torch_rsdp.comm_stats()
                every = ctx.store_sync(f"traffic/{op}/{n}", json.dumps(stats).encode())
                every = [json.loads(s) for s in every]
                expected = inter_node_bytes_per_node(op, algo, 4 * n, M, L)
                slack = tolerance(W, 4)
                per_rank = [s["inter_node_bytes"] for s in every]
                for node in sorted(set(node_of)):
                    ranks = [q for q in range(W) if node_of[q] == node]
                    sent = sum(per_rank[q] for q in ranks)
                    assert abs(sent - expected) <= slack, (
                        f"node {node} sent {sent} B across its link, theory {expected:.0f} B "
                        f"(+-{slack}); inter_node_bytes per rank: {per_rank}")
                    # hier: every local rank has a rail; ring: only the node's boundary rank
                    senders = [q for q in ranks if per_rank[q] > 0]
                    want = len(ranks) if algo == "hier" else 1
                    assert len(senders) == want, (
                        f"{algo}: {len(senders)} rank(s) of node {node} sent across the link, "
                        f"expected {want}; inter_node_bytes per rank: {per_rank}")
                    assert all(every[q]["inter_node_messages"] > 0 for q in senders), every


LOCAL_FAMILIES = {"topology": fam_topology, "traffic": fam_traffic}


def matrix_worker(ctx, names, node_of, setting):
    ctx.node_of, ctx.setting = list(node_of), setting
    use_reduced_matrix(ctx)
    return run_families(ctx, {**FAMILIES, **LOCAL_FAMILIES}, names)


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------


_BATCH: dict = {}


def _selected(session, topo: str, setting: str) -> set[str]:
    """The families of (topo, setting) that this pytest run selected (-k, node ids)."""
    out = set()
    for item in session.items:
        cs = getattr(item, "callspec", None)
        if getattr(item, "originalname", None) == "test_matrix" and cs is not None and \
                cs.params.get("topo") == topo and cs.params.get("setting") == setting:
            out.add(cs.params["family"])
    return out


def _batch(topo: str, setting: str, nodes, session):
    """Runs the families of (topology, setting) in as few launches as possible; a crash or
    hang is charged to the family that was running and the rest go on in a new launch."""
    key = (topo, setting)
    if key in _BATCH:
        return _BATCH[key]
    node_of = TOPOLOGIES[topo]
    names = [f for f in _families(topo, setting) if f in _selected(session, topo, setting)]
    results, errors, mode = launch_families(
        lambda batch: launch(matrix_worker, len(node_of),
                            (batch, list(node_of), setting),
                            env=SETTINGS[setting], node_of=node_of, netns=nodes,
                            deadline=DEADLINE, pg_timeout=PG_TIMEOUT), names, len(node_of), 4)
    _BATCH[key] = (results, errors, mode)
    return _BATCH[key]


def _uniform(topo: str) -> bool:
    node_of = TOPOLOGIES[topo]
    return len({node_of.count(n) for n in node_of}) == 1


def _matrix_params():
    out = []
    for topo in TOPOLOGIES:
        for setting in SETTINGS:
            # On nodes of unequal size `hier` is what `auto` runs: all-reduce, all-gather and
            # reduce-scatter cannot pair ranks across nodes and fall back to the automatic
            # choice, and auto picks hier for broadcast, reduce and barrier
            # (csrc/algorithms/select.cpp, hier_applies).
            if setting == "hier" and not _uniform(topo):
                continue
            for fam in _families(topo, setting):
                marks = ()
                if not RSDP and setting != "auto":
                    marks = pytest.mark.skip(reason="forced rsdp algorithms: nothing to force on "
                                                    f"{backend_under_test()}")
                out.append(pytest.param(topo, setting, fam, marks=marks,
                                        id=f"{topo}-{setting}-{fam}"))
    return out


@pytest.mark.parametrize("topo,setting,family", _matrix_params())
def test_matrix(topo, setting, family, nodes, request):
    results, errors, mode = _batch(topo, setting, nodes, request.session)
    assert_family(results, errors, family, f"{topo} {setting} ({mode or 'mode unknown'})")


# --------------------------------------------------------------------------------------------
# Recursive halving + doubling (rhd) on the rails and over all ranks, at 3, 4 and 5 nodes
# --------------------------------------------------------------------------------------------

# Ranks 0-4 on nodes 0-4, ranks 5-9 the second local rank of nodes 0-4: subgroups of the first
# 3, 4, 5 nodes with one rank (flat rhd, K = 3, 4, 5) or two ranks per node (hier_rhd).
RHD_NODE_OF = (0, 1, 2, 3, 4, 0, 1, 2, 3, 4)
RHD_LARGE = (1 << 20) + 7  # float32 elements: more than net::kPieceBytes, uneven blocks


def _rhd_input(members, r, n, dt, integral):
    g = torch.Generator().manual_seed(1000 * r + n)
    if integral:  # bfloat16: small integers, summed exactly
        return torch.randint(-8, 9, (n,), generator=g).to(dt)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dt)


def _rhd_worker(ctx):
    import torch_rsdp  # noqa: F401  (registers the backend)

    r, fails = ctx.rank, []
    groups = []
    for m in (3, 4, 5):
        one = list(range(m))
        two = one + [q + 5 for q in one]
        for algo, members in (("rhd", one), ("hier_rhd", two)):
            os.environ["RSDP_ALGO_ALLREDUCE"] = algo  # read when the group is created
            groups.append((algo, members, dist.new_group(ranks=members)))
    os.environ.pop("RSDP_ALGO_ALLREDUCE")
    for algo, members, g in groups:
        if r not in members:
            continue
        K = len(members)
        # The messages this rank sends across nodes prove the algorithm ran: 2 log2(P) on its
        # rail of M nodes (P the largest power of two <= M), plus the fold's one to or from
        # the first 2(M-P) nodes; a ring would send 2(M-1).
        M, node = len({RHD_NODE_OF[q] for q in members}), RHD_NODE_OF[r]
        P = 1 << (M.bit_length() - 1)
        sent = (1 if node % 2 == 0 else 2 * P.bit_length() - 1) if node < 2 * (M - P) \
            else 2 * (P.bit_length() - 1)
        torch_rsdp.reset_comm_stats(g)
        dist.all_reduce(torch.ones(1003), group=g)
        got = torch_rsdp.comm_stats(g)["inter_node_messages"]
        if got != sent:
            fails.append(f"{algo} on {members}: {got} messages across nodes, expected {sent}")
        for dt in (torch.float32, torch.bfloat16):
            integral = dt == torch.bfloat16
            counts = (0, 1, K - 1, K + 1, 1003) + ((RHD_LARGE,) if dt == torch.float32 else ())
            for op in ("sum", "avg", "max"):
                for n in counts:
                    if n == RHD_LARGE and op != "sum":
                        continue
                    what = f"{algo} on {members} {dt} {op} n={n}"
                    ins = [_rhd_input(members, q, n, dt, integral) for q in members]
                    x = ins[members.index(r)].clone()
                    dist.all_reduce(x, op=getattr(dist.ReduceOp, op.upper()), group=g)
                    stack = torch.stack([t.double() for t in ins])
                    want = {"sum": stack.sum(0), "avg": stack.sum(0) / K,
                            "max": stack.max(0).values if n else stack.sum(0)}[op]
                    if integral and op != "avg":
                        ok = torch.equal(x.double(), want)
                    else:
                        tol = 2.0 ** -7 if integral else 1e-5
                        ok = bool(torch.allclose(x.double(), want, rtol=tol, atol=tol * K))
                    if not ok:
                        err = (x.double() - want).abs().max().item()
                        fails.append(f"{what}: wrong (max error {err})")
                    # every member ends bit-identical
                    every = [torch.empty_like(x) for _ in members]
                    dist.all_gather(every, x, group=g)
                    same = all(torch.equal(e.view(torch.int16 if integral else torch.int32),
                                           x.view(torch.int16 if integral else torch.int32))
                               for e in every)
                    if not same:
                        fails.append(f"{what}: members differ")
    return fails


def test_rhd_allreduce():
    """RSDP_ALGO_ALLREDUCE=rhd (over all ranks) and =hier_rhd (on the rails) on 3, 4 and 5
    emulated nodes (RSDP_NODE_ID loopback), one and two ranks per node: sum, avg and max of
    float32 and bfloat16, counts 0, 1, below and above the member count, odd, and beyond
    net::kPieceBytes; right within rounding and bit-identical on every member."""
    res = launch(_rhd_worker, len(RHD_NODE_OF), node_of=RHD_NODE_OF, netns=None,
                 deadline=DEADLINE, pg_timeout=PG_TIMEOUT)
    fails = [f"rank {r}: {f}" for r in range(len(RHD_NODE_OF)) for f in res[r]]
    assert not fails, "\n".join(fails[:30])


# --------------------------------------------------------------------------------------------
# A whole node dies
# --------------------------------------------------------------------------------------------

KILL_NODE = 1
KILL_ITER = 3
FAULT_TIMEOUT = 10.0


def _node_death_worker(ctx, node_of):
    r = ctx.rank
    victim = node_of[r] == KILL_NODE
    t = torch.empty(1 << 21)  # 8 MiB: many chunks in flight when the node dies
    for i in range(1000):
        if victim and i == KILL_ITER:
            ctx.store.set(f"killed_at/{r}", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        t.fill_(1.0)
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            raised = time.time()
            keys = [f"killed_at/{q}" for q in range(ctx.world_size) if node_of[q] == KILL_NODE]
            ctx.store.wait(keys)
            killed = max(float(ctx.store.get(k)) for k in keys)
            return {"outcome": "raised", "iter": i, "after_kill_s": raised - killed,
                    "msg": str(e)[:1000]}
        if not bool((t == ctx.world_size).all()):
            return {"outcome": "wrong", "iter": i}
    return {"outcome": "completed"}


@pytest.mark.slow
def test_node_death(nodes):
    node_of = TOPOLOGIES["2x2"]
    victims = [r for r, n in enumerate(node_of) if n == KILL_NODE]
    res = launch(_node_death_worker, len(node_of), (list(node_of),), node_of=node_of,
                 netns=nodes, pg_timeout=FAULT_TIMEOUT, deadline=90, expect_killed=victims)
    print(f"[{res.mode}] killed ranks {victims} (node {KILL_NODE}); survivors raised after "
          + ", ".join(f"{res[r]['after_kill_s']:.2f}s" for r in range(len(node_of))
                      if r not in victims and res[r].get("after_kill_s") is not None))
    for r in range(len(node_of)):
        if r in victims:
            continue
        o = res[r]
        assert o["outcome"] == "raised", f"[{res.mode}] survivor rank {r}: {o}"
        assert o["iter"] >= KILL_ITER, f"rank {r} raised before the kill: {o}"
        assert o["after_kill_s"] <= FAULT_TIMEOUT + 5, (
            f"[{res.mode}] rank {r} raised {o['after_kill_s']:.1f}s after node {KILL_NODE} "
            f"died (timeout {FAULT_TIMEOUT}s): {o['msg'][:300]}")


# --------------------------------------------------------------------------------------------
# A quiet start: no UCX warnings
# --------------------------------------------------------------------------------------------


def _quiet_worker(ctx):
    t = torch.ones(1 << 10)
    dist.all_reduce(t)  # small: through the leaders over UCX
    dist.all_reduce(torch.ones(1 << 16))  # large: the rails
    dist.barrier()
    return float(t[0])


def test_no_ucx_warnings(nodes):
    """UCX prints its warnings into every rank's output (e.g. a transport setting set where
    the installed UCX does not read it); a multi-node start must leave none."""
    node_of = TOPOLOGIES["2x2"]
    res = launch(_quiet_worker, len(node_of), node_of=node_of, netns=nodes, deadline=90)
    for r in range(len(node_of)):
        assert res[r] == len(node_of), res[r]
        log = res.outcomes[r].log_tail
        assert not re.search(r"UCX\s+(WARN|ERROR)", log), f"[{res.mode}] rank {r}:\n{log}"


# --------------------------------------------------------------------------------------------
# Benchmark smoke test
# --------------------------------------------------------------------------------------------


def test_bench_multinode_quick(tmp_path, nodes):
    """`python -m benchmarks multinode --quick` runs every variant and writes a complete JSON
    report: rsdp as it chooses, the flat ring, gloo, Open MPI on the same emulated nodes (its daemons
    started through netns.py as a remote shell) and rsdp without a link; without emulated nodes
    Open MPI is left out with its reason in the report."""
    variants = "auto,ring,gloo,mpi,nolink" if RSDP else "gloo"
    cmd = [sys.executable, "-m", "benchmarks", "multinode", "--quick",
           "--variants", variants, "--out", str(tmp_path)]
    cmd += ["--loopback"] if nodes is None else []
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n" \
                              f"{p.stderr[-3000:]}"
    with open(tmp_path / "multinode.json") as f:
        report = json.load(f)["results"]
    print(f"bench mode: {report['config']['mode']}")
    rows = report["rows"]
    ops = {"all_reduce", "all_gather", "reduce_scatter"}
    ran = set(report["config"]["variants"])
    if RSDP:
        # Open MPI runs wherever the nodes are namespaces (setup.sh installs it)
        expected = {"auto", "ring", "gloo", "nolink"} | ({"mpi"} if nodes is not None else set())
        assert ran == expected, (ran, report["machine"].get("peer_notes"))
        if nodes is None:
            assert "Open MPI not measured" in (tmp_path / "multinode.md").read_text()
    for v in ran:
        for op in ops:
            got = [row for row in rows if row["variant"] == v and row["op"] == op]
            assert got, f"no rows for {v} {op}"
            for row in got:
                assert row["correct"], f"wrong result: {row}"
                assert row["time_s"] > 0 and row["link_bytes"] > 0, row
                # no link, no efficiency; every linked variant has one behind a rate limit
                has_eff = row["link_efficiency"] is not None
                assert has_eff == (v != "nolink" and nodes is not None), row
    assert (tmp_path / "multinode.md").exists()


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
@pytest.mark.skipif(not RSDP, reason="measures the rsdp backend's rail algorithms")
def test_bench_multinode_delay_quick(tmp_path):
    """`python -m benchmarks multinode --delay` on 4 nodes: the ring and rhd on the rails
    behind a link delay, right, with the one-way latency measured and each rhd row set beside
    the rails' model (at 4 nodes, a power of two, the model has rhd ahead at every size)."""
    cmd = [sys.executable, "-m", "benchmarks", "multinode", "--nodes", "4", "--ranks-per-node",
           "1", "--ops", "all_reduce", "--variants", "hier,hier_rhd", "--sizes", "64K,256K",
           "--iters", "2", "--warmup", "1", "--delay", "200us", "--out",
           str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    report = json.loads((tmp_path / "multinode.json").read_text())["results"]
    # a message crosses two links each way: at least twice the delay one way
    assert report["machine"]["alpha_s"] >= 2 * 200e-6, report["machine"]
    rhd = [r for r in report["rows"] if r["variant"] == "hier_rhd"]
    assert len(rhd) == 2 and all(r["correct"] for r in report["rows"]), report["rows"]
    for r in rhd:
        assert r["ring_over_rhd"] > 0 and r["model_ring_over_rhd"] > 1, r
        assert r["model_alpha_s"] > 0, r
    assert "model ring / rhd" in (tmp_path / "multinode.md").read_text()


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
def test_netns_command_runs_inside_the_node_and_refuses_other_names(nodes):
    """`python netns.py NODE COMMAND...` (mpirun's remote shell in the multinode benchmark suite) runs the
    command in the node's namespace under the node's host name, with ssh's leading options
    ignored; a name that is no live node's namespace gets ssh's status 255 and a message."""
    if nodes is None:
        pytest.skip("loopback mode: no emulated nodes")
    script = os.path.join(ROOT, "torch_rsdp", "testing", "netns.py")
    node = nodes.netns_name(1)
    p = subprocess.run([sys.executable, script, "-x", node, "hostname;", "ip", "-br", "addr"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == node, p.stdout
    assert nodes.node_addr(1) in p.stdout and nodes.node_addr(0) not in p.stdout, p.stdout
    for bad in ("rsdp-0000-n9", "/etc"):
        p = subprocess.run([sys.executable, script, bad, "true"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 255 and "not the namespace of a live emulated node" in p.stderr, \
            (bad, p.returncode, p.stderr)


_ECHO = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1] == "serve":
    s.bind((sys.argv[2], 9999))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(16)
        s.sendto(data, peer)
        if data == b"end":
            break
else:
    s.settimeout(5)
    rtts = []
    for i in range(20):
        t = time.perf_counter()
        s.sendto(b"x", (sys.argv[2], 9999))
        s.recvfrom(16)
        rtts.append(time.perf_counter() - t)
    s.sendto(b"end", (sys.argv[2], 9999))
    print(min(rtts))
"""


def _min_rtt_s(en) -> float:
    """The shortest of 20 UDP round trips from node 0 to node 1."""
    serve = subprocess.Popen(["ip", "netns", "exec", en.netns_name(1), sys.executable, "-c",
                              _ECHO, "serve", en.node_addr(1)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert serve.stdout.readline().strip() == "ready"
        p = subprocess.run(["ip", "netns", "exec", en.netns_name(0), sys.executable, "-c",
                            _ECHO, "ask", en.node_addr(1)], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return float(p.stdout)
    finally:
        serve.wait(timeout=10)


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
def test_link_delay():
    """delay= holds every frame on every node link for that long in each direction, so a
    round trip between two nodes crosses it four times; the relay that does it and its TAP
    devices are gone once the nodes are closed."""
    delay_s = 0.002
    with netns.EmulatedNodes(2, rate="1gbit", delay=f"{delay_s * 1e3:g}ms") as en:
        tag, relay = en.tag, en._relay
        rtt = _min_rtt_s(en)
        assert 4 * delay_s <= rtt < 4 * delay_s + 0.05, rtt
    assert relay.poll() is not None, "the delay relay outlived its nodes"
    assert not [n for n in netns.leftovers() if netns._tag_of(n) == tag]
    with netns.EmulatedNodes(2, rate="1gbit") as en:
        assert _min_rtt_s(en) < 4 * delay_s  # the delay above was the relay's, not the host's


# --------------------------------------------------------------------------------------------
# The emulation cleans up after itself (keep these last: they run after the launches above)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
def test_namespaces_removed_on_error():
    """__exit__ removes everything even when the body raised."""
    with pytest.raises(ZeroDivisionError):
        with netns.EmulatedNodes(2, rate="100mbit") as en:
            tag = en.tag
            assert len([n for n in netns.leftovers() if netns._tag_of(n) == tag]) >= 4
            1 / 0
    left = [n for n in netns.leftovers() if netns._tag_of(n) == tag]
    assert not left, f"left behind: {left}"


_CRASH = """
import os, signal, sys
sys.path.insert(0, {root!r})
from torch_rsdp.testing.netns import EmulatedNodes
en = EmulatedNodes(2, delay={delay!r})
en.create()
print(en.tag, en._relay.pid if en._relay else 0, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
@pytest.mark.parametrize("delay", [None, "1ms"])
def test_cleanup_stale_after_crash(nodes, delay):
    """A SIGKILLed creator leaves its namespaces behind; cleanup_stale() removes them and
    leaves instances of live processes (this module's nodes) alone. With a delay, the relay
    ends with its creator."""
    p = subprocess.run([sys.executable, "-c", _CRASH.format(root=ROOT, delay=delay)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    tag, relay_pid = p.stdout.split()
    if delay:
        assert _gone(int(relay_pid), 10), "the delay relay outlived its crashed creator"
    assert [n for n in netns.leftovers() if netns._tag_of(n) == tag], "crash left nothing?"
    removed = netns.cleanup_stale()
    assert not [n for n in netns.leftovers() if netns._tag_of(n) == tag], removed
    if nodes is not None:
        assert os.path.exists(os.path.join(netns.NETNS_DIR, nodes.netns_name(0))), \
            "cleanup_stale removed the namespaces of a live process"


@pytest.mark.skipif(not netns.namespaces_available(), reason="network namespaces not permitted")
def test_no_leftovers_from_other_runs():
    """Nothing with the rsdp- prefix exists but this process's own live nodes."""
    mine = {t for t, en in netns._LIVE.items() if en.owner_pid == os.getpid()}
    others_live = {t for t, e in netns._registry().items() if netns._owner_alive(e)}
    left = [n for n in netns.leftovers() if netns._tag_of(n) not in mine | others_live]
    assert not left, f"stale emulated-node namespaces/links: {left}"
