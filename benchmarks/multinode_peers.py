"""Open MPI and oneCCL across emulated nodes: the peers of bench_multinode.py.

Each peer runs the points bench_multinode measures (same ops, element counts, iterations and
timing: a barrier, one op, the slowest rank's time per iteration, the median over
iterations), with its ranks placed on the emulated nodes as the torch ranks are, so its
traffic between nodes crosses the same rate-limited links:

  mpi     Open MPI's mpirun starts one daemon per emulated node through a remote shell that
          enters the node's namespace (torch_rsdp/testing/netns.py run as a command; the
          host names are the namespace names), exactly as it would over ssh on a cluster.
          Its ranks run bench_mpi_peer.py. Shared memory (vader) inside a node, TCP between
          nodes on the node's interface; mpi_yield_when_idle, Open MPI's setting for more
          ranks than cores (its ranks poll otherwise: 16 of them on 2 cores made a 1 MiB
          allreduce take 330 ms instead of 30).
  oneccl  not measured across nodes (ONECCL_ACROSS_NODES says why); bench_collectives.py
          --peers oneccl measures it inside one node.

Both are launched from the root namespace by bench_multinode.main() while the EmulatedNodes
are up; neither imports torch on the ranks.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import bench_peers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NETNS_COMMAND = [sys.executable, os.path.join(ROOT, "torch_rsdp", "testing", "netns.py")]
PEERS = ("mpi", "oneccl")
# Tried: oneccl_peer.cpp, one process per rank started inside its node's namespace (the
# remote shell below), libfabric 1.17's tcp provider (via ofi_rxm) with FI_TCP_IFACE and
# CCL_KVS_IFACE naming the node's interface, CCL_ATL_SHM=0. The key-value store connects
# across nodes, and libfabric logs that it chose the node's address, but strace shows every
# OFI endpoint bound to and connecting to 127.0.0.1: each namespace has its own loopback,
# so the ranks of different nodes never reach each other (connection refused, retried
# forever). FI_PROVIDER=sockets with FI_SOCKETS_IFACE fails at the first send.
ONECCL_ACROSS_NODES = ("oneCCL's libfabric endpoints bind to 127.0.0.1 inside each node's "
                       "namespace whatever FI_TCP_IFACE says, so ranks on different emulated "
                       "nodes cannot connect (benchmarks/multinode_peers.py)")
# bench_multinode's op names -> the peers' (bench_mpi_peer.py and oneccl_peer.cpp agree)
PEER_OP = {"all_reduce": "allreduce", "all_gather": "allgather",
           "reduce_scatter": "reduce_scatter"}


def unavailable(peer: str, nodes) -> str | None:
    """Why `peer` cannot run across the emulated nodes, or None."""
    if nodes is None:
        return "no emulated nodes (--loopback, or namespaces not available)"
    if peer == "oneccl":
        return ONECCL_ACROSS_NODES
    return bench_peers.unavailable(peer)


def plan(ops, sizes, count_of, world_size, iters, warmup) -> list[dict]:
    return [{"op": PEER_OP[op], "dtype": "float32", "count": count_of(size, world_size),
             "bytes": 4 * count_of(size, world_size), "iters": iters, "reps": 1,
             "warmup": warmup} for op in ops for size in sizes]


def rows_of(peer: str, raw: list[dict]) -> list[dict]:
    """bench_peers' raw rows (samples in microseconds, slowest rank per iteration) as
    bench_multinode rows."""
    back = {v: k for k, v in PEER_OP.items()}
    out = []
    for r in raw:
        row = {"variant": peer, "op": back[r["op"]], "bytes": r["bytes"], "count": r["count"],
               "correct": bool(r.get("correct"))}
        if r.get("error"):
            row["error"] = r["error"]
        elif r.get("samples_us"):
            row["samples_s"] = [t * 1e-6 for t in r["samples_us"]]
            row["time_s"] = statistics.median(row["samples_s"])
        out.append(row)
    return out


def run(peer: str, nodes, node_of: list[int], points: list[dict], timeout: float
        ) -> tuple[list[dict], str | None, str]:
    """(rows, error or None, the command shown in the report) of one peer's run."""
    with tempfile.TemporaryDirectory() as tmp:
        raw, error, shown = run_mpi(nodes, node_of, points, timeout, tmp)
    return rows_of(peer, raw), error, shown


def run_mpi(nodes, node_of, points, timeout, tmp):
    plan_path, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "result.json")
    with open(plan_path, "w") as f:
        json.dump({"world_size": len(node_of), "rounds": 1, "points": points}, f)
    per_node = [node_of.count(i) for i in range(max(node_of) + 1)]
    hosts = ",".join(f"{nodes.netns_name(i)}:{n}" for i, n in enumerate(per_node))
    subnet = nodes.store_addr.rsplit(".", 1)[0] + ".0/24"
    opts = {"plm_rsh_agent": " ".join(NETNS_COMMAND), "plm_rsh_no_tree_spawn": "1",
            "oob_tcp_if_include": subnet, "btl_tcp_if_include": subnet,
            "btl": "self,vader,tcp", "mpi_yield_when_idle": "1"}
    cmd = ["mpirun"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd += ["--oversubscribe", "-np", str(len(node_of)), "-H", hosts, "--bind-to", "none",
            "--map-by", "slot"]
    for key, value in opts.items():
        cmd += ["--mca", key, value]
    cmd += [sys.executable, os.path.join(HERE, "bench_mpi_peer.py"), "--plan", plan_path,
            "--out", out]
    shown = " ".join(cmd[:cmd.index(sys.executable)])
    print(f"# mpi: {shown} python benchmarks/bench_mpi_peer.py ...", flush=True)
    error = bench_peers.run_mpirun(cmd, timeout, capture=True)
    raw = json.load(open(out)).get("rows", []) if os.path.exists(out) else []
    return raw, error, shown
