"""Collectives across emulated nodes behind a rate-limited link: rsdp (as it chooses,
hierarchical, flat ring, compressed) against gloo and Open MPI, with link efficiency (the bytes
the algorithm must send per node link, torch_rsdp/testing/traffic.py, / time / link rate).
See docs/benchmarks.md, multinode.

Only the standard library is imported at the top: worker processes import this file before
they move into their node's namespace, and torch must not start threads before that.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from . import common
from .common import RESULTS, fmt_bytes, md_table

OPS = ("all_reduce", "all_gather", "reduce_scatter")
VARIANTS = {  # (what runs, the traffic theory charged for its link bytes)
    "auto": ("rsdp", "hier"),  # what auto chooses at these sizes (select.cpp)
    "hier": ("rsdp", "hier"),
    "hier_rhd": ("rsdp", "hier"),  # all_reduce only: recursive halving + doubling on the rails
    "ring": ("rsdp", "ring"),
    "gloo": ("gloo", "ring"),
    "mpi": ("mpi", "ring"),
    "nolink": ("rsdp", "hier"),
    # hier with torch_rsdp.set_compression: int8 everywhere; int4 for the reductions (the
    # all-gather stays int8)
    "hier-int8": ("rsdp", "hier"),
    "hier-int4": ("rsdp", "hier"),
}
LABELS = {"auto": "rsdp auto", "hier": "rsdp hier", "hier_rhd": "rsdp hier_rhd",
          "ring": "rsdp ring", "gloo": "gloo",
          "mpi": "Open MPI", "nolink": "rsdp auto, no link",
          "hier-int8": "rsdp hier int8", "hier-int4": "rsdp hier int4"}
COMPRESSION = {"hier-int8": dict(all_gather="int8", reduce_scatter="int8", all_reduce="int8"),
               "hier-int4": dict(all_gather="int8", reduce_scatter="int4", all_reduce="int4")}
BLOCK = 512
RAILS_MIN_BYTES = 32 << 10  # kOneshotBytes (select.h): up to it, the leaders' all-reduce
TARGET_COMPRESSED = 2.5  # compressed all-gather / reduce-scatter vs fp32 hier, from 16 MiB
TARGET_MIN_BYTES = 16 << 20  # the speed-up and compression targets
TARGET_EFFICIENCY_MIN_BYTES = 1 << 20
TARGET_EFFICIENCY = 0.9
# rsdp's allreduce against gloo's flat ring: at least this share of the speed-up its bytes
# allow (gloo's link bytes / its own: 1.5x on 2 nodes, 1.25x on 4, towards 1x on many)
TARGET_SPEEDUP_SHARE = 0.9
QUICK_SIZES = "256K,1M"
PG_TIMEOUT = 300  # seconds


def inter_node_bytes_per_node(*args):
    """The traffic theory (torch_rsdp.testing.traffic), imported on the launcher's side only:
    importing torch_rsdp starts torch, and a rank must not before it enters its namespace."""
    from torch_rsdp.testing.traffic import inter_node_bytes_per_node as theory

    return theory(*args)


def wire_fraction(variant: str, op: str) -> float:
    """Bytes a variant puts on a node link per byte of float32 the algorithm moves."""
    comp = COMPRESSION.get(variant)
    if comp is None:
        return 1.0

    def frac(bits):
        return ((1.0 if bits == "int8" else 0.5) + 4 / BLOCK) / 4
    if op == "all_reduce":  # a reduce-scatter, then the sums back as int8
        return (frac(comp["all_reduce"]) + frac("int8")) / 2
    return frac(comp["all_gather" if op == "all_gather" else "reduce_scatter"])


def tolerance(variant: str, op: str) -> float:
    """Largest error allowed, relative to the largest expected magnitude: half a step per
    quantisation (tests/multinode/test_compression.py checks the exact bounds)."""
    comp = COMPRESSION.get(variant)
    if comp is None:
        return 0.0
    t = 1 / (2 * {"int8": 126, "int4": 6}[comp[op]])
    return (t + 1 / (2 * 126) if op == "all_reduce" else t) * 1.01


def count_of(size: int, world_size: int) -> int:
    """float32 elements of a point's total buffer: a multiple of the world size."""
    return max(world_size, size // 4 // world_size * world_size)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rate", default="1gbit", help="tc rate of each node link, per direction")
    p.add_argument("--delay", default=None,
                   help="added to every frame on each node link, per direction (tc syntax, "
                        "e.g. 400us; node to node is twice this); the run then measures the "
                        "one-way latency of a message and compares ring and rhd with the "
                        "rails' all-reduce model")
    p.add_argument("--sizes", type=common.parse_sizes, default="1M,4M,16M,64M,256M",
                   help="total tensor sizes (K/M/G binary)")
    p.add_argument("--iters", type=common.positive_int, default=5,
                   help="timed iterations per point")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations per point")
    p.add_argument("--ops", type=common.csv_list(OPS), default=list(OPS),
                   help=f"comma-separated from {','.join(OPS)}")
    p.add_argument("--variants", type=common.csv_list(list(VARIANTS)),
                   default=["auto", "ring", "gloo"],
                   help=f"comma-separated from {','.join(VARIANTS)}")
    p.add_argument("--nodes", type=int, default=2, help="emulated nodes")
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: sizes {QUICK_SIZES}, 1 iteration, no warm-up")
    p.add_argument("--loopback", action="store_true",
                   help="no namespaces: all ranks on the loopback, nodes told apart by "
                        "RSDP_NODE_ID, no rate limit (the fallback where namespaces are not "
                        "permitted); link efficiency is not computed")
    p.add_argument("--out", default=RESULTS, help="output directory")
    p.add_argument("--name", default="multinode", help="result file stem")
    return p


# --------------------------------------------------------------------------- worker side


def one_way_latency(partner: int, trips: int = 20) -> float | None:
    """Half the median round trip of a 4-byte send/recv between rank 0 and `partner` (the
    first rank of node 1) over the default group: the model's per-message cost as this
    transport pays it across one emulated link pair."""
    import torch
    import torch.distributed as dist

    r, x, rtts = dist.get_rank(), torch.zeros(1), []
    for _ in range(trips + 2):
        t0 = time.perf_counter()
        if r == 0:
            dist.send(x, partner)
            dist.recv(x, partner)
        elif r == partner:
            dist.recv(x, 0)
            dist.send(x, 0)
        rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts[2:]) / 2 if r == 0 else None


def bench_worker(ctx, variant, ops, sizes, iters, warmup, partner=None):
    """One variant on every rank: returns rank 0's rows (other ranks return None)."""
    import torch
    import torch.distributed as dist

    # imports torch: only once in the node's namespace
    from .collectives import Collective, agree, timed_iterations
    torch.set_num_threads(1)  # one intra-op thread per rank, as OMP_NUM_THREADS says
    if variant in COMPRESSION:
        import torch_rsdp
        torch_rsdp.set_compression(**COMPRESSION[variant], block=BLOCK)
    side = dist.new_group(backend="gloo")  # barriers and timing reductions
    W, r = ctx.world_size, ctx.rank
    alpha = one_way_latency(partner) if partner else None
    rows = []
    for op in ops:
        for size in sizes:
            n = count_of(size, W)
            ctx.set_progress(f"{variant} {op} {size}")
            coll = Collective(PEER_OP[op], torch.float32, n, r, W)

            def check():  # within the compression's tolerance of the exact result
                coll.prepare()
                coll.run()
                got, want = coll.inp if coll.out is None else coll.out, coll.expected()
                return bool(((got - want).abs() <= tolerance(variant, op) * want.abs().max())
                            .all())

            correct, error = agree(check, side)
            row = {"variant": variant, "op": op, "bytes": n * 4, "count": n,
                   "correct": correct, "alpha_s": alpha}
            if error:
                rows.append(dict(row, error=error))
                continue
            for _ in range(warmup):
                coll.prepare()
                coll.run()
            per_iter = timed_iterations(coll, iters, 1, side, side, False)
            row.update(samples_s=per_iter, time_s=statistics.median(per_iter))
            rows.append(row)
            if r == 0:
                print(f"[{variant}] {op} {size} B: {row['time_s'] * 1e3:.1f} ms", flush=True)
    dist.barrier(group=side)
    return rows if r == 0 else None


# --------------------------------------------------------------------------- launcher side


def run_variant(variant, args, node_of, nodes) -> tuple[list[dict], str, str | None]:
    """(rows, mode, error) of one variant: one launch of every rank."""
    from torch_rsdp.testing.launch import LaunchError, launch

    backend, algo = VARIANTS[variant]
    # generous deadline: every point at a quarter of the link rate, plus start-up
    rate_Bps = (nodes.rate_bps / 8) if nodes is not None else 1e8
    total = sum(inter_node_bytes_per_node(op, "ring", s if op == "all_reduce" else s // len(node_of),
                                          args.nodes, args.ranks_per_node)
                for op in args.ops for s in args.sizes)
    deadline = 120 + 4 * total / rate_Bps * (args.iters + args.warmup + 1)
    if backend == "mpi":
        rows, error = run_mpi(args, nodes, node_of, deadline)
        return rows, "network namespaces", error
    env = {"OMP_NUM_THREADS": "1"}
    if variant == "hier_rhd":
        env["RSDP_ALGO_ALLREDUCE"] = "hier_rhd"
    elif backend == "rsdp" and variant not in ("auto", "nolink"):
        env.update({f"RSDP_ALGO_{op}": algo for op in ("ALLREDUCE", "ALLGATHER",
                                                        "REDUCE_SCATTER")})
    try:
        res = launch(bench_worker, len(node_of),
                     (variant, list(args.ops), list(args.sizes), args.iters, args.warmup,
                      args.ranks_per_node if args.delay and backend == "rsdp"
                      and args.nodes > 1 and variant != "nolink" else None),
                     backend=backend, env=env, node_of=node_of,
                     netns=None if variant == "nolink" else nodes, deadline=deadline,
                     pg_timeout=PG_TIMEOUT, allow_exit_abort=(backend == "gloo"))
    except LaunchError as e:
        return [], getattr(e.result, "mode", ""), str(e)[:4000]
    return res[0], res.mode, None


# Open MPI across the emulated nodes: mpirun starts one daemon per node through
# torch_rsdp/testing/netns.py as its remote shell (the host names are the namespaces'), as ssh
# would on a cluster; vader inside a node, TCP between nodes on the node's interface,
# mpi_yield_when_idle (polling ranks outnumbering the cores would starve each other).
NETNS_COMMAND = [sys.executable, os.path.join(common.ROOT, "torch_rsdp", "testing", "netns.py")]
PEER_OP = {"all_reduce": "allreduce", "all_gather": "allgather",  # as mpi_rank.py names them
           "reduce_scatter": "reduce_scatter"}
PEER_COMMANDS: dict[str, str] = {}  # variant -> the launch command shown in the report


def run_mpi(args, nodes, node_of: list[int], timeout: float) -> tuple[list[dict], str | None]:
    """(rows, error or None) of mpi_rank.py on the same nodes and points, timed as
    bench_worker times them (one op per timed iteration)."""
    W = len(node_of)
    points = [{"op": PEER_OP[op], "dtype": "float32", "count": count_of(size, W),
               "bytes": 4 * count_of(size, W), "iters": args.iters, "reps": 1,
               "warmup": args.warmup} for op in args.ops for size in args.sizes]
    with tempfile.TemporaryDirectory() as tmp:
        plan, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "result.json")
        with open(plan, "w") as f:
            json.dump({"world_size": W, "rounds": 1, "points": points}, f)
        hosts = [f"{nodes.netns_name(i)}:{node_of.count(i)}" for i in range(args.nodes)]
        subnet = nodes.store_addr.rsplit(".", 1)[0] + ".0/24"
        cmd = common.mpirun_command(W, plan, out, hosts=hosts, mca={
            "plm_rsh_agent": " ".join(NETNS_COMMAND), "plm_rsh_no_tree_spawn": "1",
            "oob_tcp_if_include": subnet, "btl_tcp_if_include": subnet,
            "btl": "self,vader,tcp", "mpi_yield_when_idle": "1"})
        PEER_COMMANDS["mpi"] = " ".join(cmd[:cmd.index(sys.executable)])
        print(f"# mpi: {PEER_COMMANDS['mpi']} python benchmarks/mpi_rank.py ...", flush=True)
        error = common.run_mpirun(cmd, timeout, capture=True)
        raw = json.load(open(out)).get("rows", []) if os.path.exists(out) else []
    op_of = {v: k for k, v in PEER_OP.items()}
    rows = []
    for r in raw:  # samples in µs, the slowest rank's per iteration
        row = {"variant": "mpi", "op": op_of[r["op"]], "bytes": r["bytes"], "count": r["count"],
               "correct": bool(r.get("correct"))}
        if r.get("error"):
            row["error"] = r["error"]
        elif r.get("samples_us"):
            row["samples_s"] = [t * 1e-6 for t in r["samples_us"]]
            row["time_s"] = statistics.median(row["samples_s"])
        rows.append(row)
    return rows, error


def annotate(rows: list[dict], args, rate_bps) -> None:
    """Adds link bytes, link efficiency and the speed-up over gloo to every row."""
    W = args.nodes * args.ranks_per_node
    gloo = {(r["op"], r["bytes"]): r.get("time_s") for r in rows if r["variant"] == "gloo"}
    hier = {(r["op"], r["bytes"]): r.get("time_s") for r in rows if r["variant"] == "hier"}
    for r in rows:
        nbytes = r["bytes"] if r["op"] == "all_reduce" else r["bytes"] // W
        r["link_bytes"] = inter_node_bytes_per_node(r["op"], VARIANTS[r["variant"]][1], nbytes,
                                                    args.nodes, args.ranks_per_node
                                                    ) * wire_fraction(r["variant"], r["op"])
        t = r.get("time_s")
        r["link_efficiency"] = (r["link_bytes"] / t / (rate_bps / 8)
                                if t and rate_bps and r["variant"] != "nolink" else None)
        g = gloo.get((r["op"], r["bytes"]))
        flat = inter_node_bytes_per_node(r["op"], "ring", nbytes, args.nodes, args.ranks_per_node)
        r["bytes_ratio_vs_gloo"] = flat / r["link_bytes"] if r["link_bytes"] else None
        r["speedup_vs_gloo"] = (g / t if (t and g and r["variant"] not in ("gloo", "nolink"))
                                else None)
        r["speedup_share"] = (r["speedup_vs_gloo"] / r["bytes_ratio_vs_gloo"]
                              if r["speedup_vs_gloo"] and r["bytes_ratio_vs_gloo"] else None)
        h = hier.get((r["op"], r["bytes"]))
        r["speedup_vs_hier"] = (h / t if (t and h and r["variant"] in COMPRESSION) else None)
    add_rails_model(rows, args, rate_bps)


def ring_seconds(nbytes: float, m: int, alpha: float, link_Bps: float) -> float:
    """The rails' all-reduce model (csrc/algorithms/select.h): the ring across m nodes."""
    return 2 * (m - 1) * alpha + 2 * (m - 1) / m * nbytes / link_Bps


def rhd_seconds(nbytes: float, m: int, alpha: float, link_Bps: float) -> float:
    """... and recursive halving + doubling, folding the nodes beyond a power of two in."""
    p = 1 << (m.bit_length() - 1)
    fold = 2 if m > p else 0
    return ((2 * (p.bit_length() - 1) + fold) * alpha
            + (2 * (p - 1) / p + fold) * nbytes / link_Bps)


def add_rails_model(rows: list[dict], args, rate_bps) -> None:
    """With hier and hier_rhd both run behind a delay: each all-reduce row of hier_rhd gets
    ring / rhd as measured and as the rails' model predicts it. The model's message cost is
    calibrated on the ring alone, at its smallest size (what one of its 2(M-1) steps costs
    beyond the link's bytes), and then predicts rhd at every size: a check of the model's
    shape, since a rank's message cost here is mostly waiting for a core (the ranks share a
    few), which the send/recv ping-pong above sees only in part. At RAILS_MIN_BYTES and
    below forced hier hands the op to the leaders' recursive doubling: no ring to compare."""
    if not (args.delay and rate_bps):
        return
    m, link = args.nodes, rate_bps / 8
    t = {(r["variant"], r["bytes"]): r.get("time_s") for r in rows if r["op"] == "all_reduce"}
    rings = sorted(b for (v, b), x in t.items() if v == "hier" and x and b > RAILS_MIN_BYTES)
    if not rings or m < 3:
        return
    b0 = rings[0]
    alpha = (t[("hier", b0)] - 2 * (m - 1) / m * b0 / link) / (2 * (m - 1))
    for r in rows:
        ring = t.get(("hier", r["bytes"]))
        if (r["variant"] != "hier_rhd" or r["op"] != "all_reduce" or not ring
                or not r.get("time_s") or r["bytes"] <= RAILS_MIN_BYTES):
            continue
        r["ring_over_rhd"] = ring / r["time_s"]
        r["model_alpha_s"] = alpha
        r["model_ring_over_rhd"] = (ring_seconds(r["bytes"], m, alpha, link)
                                    / rhd_seconds(r["bytes"], m, alpha, link))


def targets(rows: list[dict]) -> list[dict]:
    out, ran = [], {r["variant"] for r in rows}

    def verdict(name, variant, op, key, need, min_bytes, shown, gloo=False):
        pts = [r for r in rows if r["variant"] == variant and r["op"] == op
               and r["bytes"] >= min_bytes]
        if not pts or (gloo and "gloo" not in ran):
            why = f"no {variant} sizes >= {fmt_bytes(min_bytes)}" if not pts else "gloo not run"
            return out.append(dict(target=name, op=op, result="n/a", measured=why))
        bad = [r for r in pts if r.get(key) is None or not r["correct"]]
        if bad:
            return out.append(dict(target=name, op=op, result="MISS",
                                   measured=f"missing/failed at {fmt_bytes(bad[0]['bytes'])}"))
        worst = min(pts, key=lambda r: r[key])
        out.append(dict(target=name, op=op, value=worst[key], at_bytes=worst["bytes"],
                        measured=f"min {shown(worst)} at {fmt_bytes(worst['bytes'])}",
                        result="PASS" if worst[key] >= need else "MISS"))

    chooser = next((v for v in ("auto", "hier") if v in ran), None)
    for op in OPS if chooser else ():
        verdict(f"{chooser} link efficiency >= {TARGET_EFFICIENCY:.0%} from "
                f"{fmt_bytes(TARGET_EFFICIENCY_MIN_BYTES)}", chooser, op, "link_efficiency",
                TARGET_EFFICIENCY, TARGET_EFFICIENCY_MIN_BYTES,
                lambda r: f"{r['link_efficiency']:.0%}")
    for v in (v for v in COMPRESSION if v in ran):
        for op in ("all_gather", "reduce_scatter"):
            verdict(f"{LABELS[v]} >= {TARGET_COMPRESSED}x fp32 hier from 16 MiB", v, op,
                    "speedup_vs_hier", TARGET_COMPRESSED, TARGET_MIN_BYTES,
                    lambda r: f"{r['speedup_vs_hier']:.2f}x")
    if chooser:  # the allreduce speed-up over gloo as a share of what the link bytes allow
        verdict(f"{chooser} allreduce faster than gloo by >= {TARGET_SPEEDUP_SHARE:.0%} of what "
                f"its link bytes allow, from 16 MiB", chooser, "all_reduce", "speedup_share",
                TARGET_SPEEDUP_SHARE, TARGET_MIN_BYTES,
                lambda r: f"{r['speedup_vs_gloo']:.2f}x of {r['bytes_ratio_vs_gloo']:.2f}x "
                          f"({r['speedup_share']:.0%})", gloo=True)
    return out


def markdown(rows, variants, info, tgts) -> str:
    def cell(key, spec, unit=""):
        return lambda r: "-" if r.get(key) is None else format(r[key], spec) + unit

    def ms(r):
        if r.get("error"):
            return "ERROR"
        if r and not r.get("correct"):
            return "WRONG"
        return "-" if r.get("time_s") is None else f"{r['time_s'] * 1e3:,.1f}"

    cols = []  # (variant, header, the cell of that variant's row)
    for v in variants:
        cols.append((v, f"{LABELS[v]} ms", ms))
        if v != "nolink":  # no link, no efficiency or speed-up
            cols.append((v, f"{LABELS[v]} link", cell("link_efficiency", ".0%")))
            if v != "gloo" and "gloo" in variants:
                cols.append((v, f"{LABELS[v]} x gloo", cell("speedup_vs_gloo", ".2f", "x")))
        if v in COMPRESSION and "hier" in variants:
            cols.append((v, f"{LABELS[v]} x hier", cell("speedup_vs_hier", ".2f", "x")))
        if v == "hier_rhd" and any("ring_over_rhd" in r for r in rows):
            cols += [(v, "ring / rhd", cell("ring_over_rhd", ".2f")),
                     (v, "model ring / rhd", cell("model_ring_over_rhd", ".2f"))]
    by = {(r["variant"], r["op"], r["bytes"]): r for r in rows}
    points = sorted({(OPS.index(r["op"]), r["bytes"]) for r in rows})
    table = [[OPS[o], fmt_bytes(b)] + [f(by.get((v, OPS[o], b), {})) for v, _, f in cols]
             for o, b in points]
    head = ["op", "bytes"] + [h for _, h, _ in cols]
    delay = (f", {info['delay']} delay per link direction (one-way message latency "
             f"{info['alpha_s'] * 1e3:.2f} ms, rsdp send/recv)"
             if info.get("alpha_s") and info.get("delay") else "")
    out = [f"# Multi-node collectives: {info['nodes']} nodes x {info['ranks_per_node']} ranks, "
           f"link {info['rate'] or 'unlimited'} per direction{delay} ({info['mode']})", "",
           f"float32, median of {info['iters']} iterations. `link` = bytes the algorithm must send "
           f"across a node link / time / link rate (TCP ceiling ~96 %); `x gloo` = gloo time / "
           f"time.", ""]
    if info.get("note"):
        out += [f"**{info['note']}**", ""]
    if any("ring_over_rhd" in r for r in rows):
        alpha = next(r["model_alpha_s"] for r in rows if "model_alpha_s" in r)
        out += ["`ring / rhd` = rsdp hier time / rsdp hier_rhd time; `model ring / rhd` = the "
                "rails' all-reduce model (csrc/algorithms/select.h) with the link rate and a "
                f"message cost of {alpha * 1e3:.2f} ms, what one ring step cost at the ring's "
                "smallest size beyond its bytes, in place of its data-centre constants.", ""]
    out.append(md_table(head, table, "ll" + "r" * (len(head) - 2)))
    out += ["", "## Targets", "",
            md_table(["target", "op", "measured", "result"],
                                  [[t["target"], t["op"], t["measured"], t["result"]]
                                   for t in tgts], "llll")]
    for v, shown in (info.get("peer_commands") or {}).items():
        out += ["", f"{LABELS[v]}: `{shown}`"]
    for v, why in (info.get("peer_notes") or {}).items():
        out += ["", f"{LABELS[v]} not measured: {why}"]
    errors = info.get("errors") or {}
    for v, e in errors.items():
        out += ["", f"**{LABELS[v]} failed:** `{e.splitlines()[0][:300]}`"]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.iters, args.warmup = common.parse_sizes(QUICK_SIZES), 1, 0
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    variants = list(args.variants)
    node_of = [n for n in range(args.nodes) for _ in range(args.ranks_per_node)]

    from torch_rsdp.testing import netns

    try:
        netns.parse_delay(args.delay) if args.delay else None
        netns.parse_rate(args.rate)
    except ValueError as e:
        print(f"bad arguments: {e}", file=sys.stderr)
        return 2

    stale = netns.cleanup_stale()
    if stale:
        print(f"# removed leftovers of a crashed earlier run: {stale}")
    info = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "rate": args.rate,
            "delay": args.delay, "iters": args.iters, "warmup": args.warmup}
    rows, errors, mode = [], {}, ""
    t0 = time.perf_counter()

    def run_all(nodes):
        nonlocal mode
        for v in list(variants):
            if v == "mpi":
                why = ("no emulated nodes (--loopback, or namespaces not available)"
                       if nodes is None else common.unavailable("mpi"))
                if why:
                    print(f"# NOTE: {LABELS[v]} not measured: {why}", flush=True)
                    info.setdefault("peer_notes", {})[v] = why
                    variants.remove(v)
                    continue
            print(f"# {LABELS[v]} ...", flush=True)
            got, m, err = run_variant(v, args, node_of, nodes)
            mode = (m if v != "nolink" else "") or mode  # nolink's loopback is not the run's
            rows.extend(got or [])
            if err:
                errors[v] = err
                print(f"# {LABELS[v]} FAILED:\n{err}", file=sys.stderr, flush=True)

    if not args.loopback and netns.namespaces_available():
        with netns.EmulatedNodes(args.nodes, rate=args.rate, delay=args.delay) as nodes:
            print(f"# {nodes.describe()}", flush=True)
            run_all(nodes)
        rate_bps = nodes.rate_bps
    else:
        why = ("--loopback" if args.loopback else
               "network namespaces are not available (needs root)")
        info["note"] = (f"{why}: all ranks ran on the loopback with RSDP_NODE_ID, no link "
                        f"was emulated, so link efficiency is not computed")
        info["rate"] = info["delay"] = None
        print(f"# WARNING: {info['note']}", flush=True)
        run_all(None)
        rate_bps = None
    info.update(mode=mode or "?", errors=errors, elapsed_s=round(time.perf_counter() - t0, 1),
                peer_commands=dict(PEER_COMMANDS))
    alphas = [r["alpha_s"] for r in rows if r.get("alpha_s")]
    info["alpha_s"] = statistics.median(alphas) if alphas else None
    annotate(rows, args, rate_bps)
    tgts = targets(rows)
    text = markdown(rows, variants, info, tgts)
    print()
    print(text)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(variants=variants, mode=info["mode"], node_of=node_of)
    common.write_result(args.out, args.name, {"machine": info, "config": config, "rows": rows,
                                              "targets": tgts}, text, argv)
    print(f"# took {info['elapsed_s']} s")
    wrong = [r for r in rows if r.get("error") or not r.get("correct")]
    if errors or wrong:
        print(f"ERROR: {len(errors)} variant(s) failed, {len(wrong)} point(s) wrong",
              file=sys.stderr)
        return 1
    return 0
