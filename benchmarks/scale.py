"""What scale costs, by world size: set-up time, shared memory, RSS, threads, fds and UCX
endpoints the set-up adds, 8 B and 1 MiB all-reduce, and how long the survivors take to notice
a rank SIGKILLed inside an all-reduce. Nodes are the loopback with RSDP_NODE_ID. See
docs/benchmarks.md, scale, and docs/scale.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

from .common import RESULTS, MiB, md_table, proc_status_kib, write_result

# The backend's own description of each group's segment (csrc/transport/shm/shm_comm.cpp).
SHM_LINE = re.compile(r"group '([^']*)' size (\d+), shared memory (\d+) bytes \(staging 2x(\d+),"
                      r" p2p ring (\d+), pool (\d+) per rank\)")
EP_LINE = re.compile(r"ucx: group '([^']*)': collective endpoint to "
                     r".*\(node \d+, (same|other) node\)")
# The group's timeout, seconds: long, so that only the notice ends the survivors' wait.
PG_TIMEOUT = 120.0
# Seconds a launch may take, plus 8 per rank.
DEADLINE = 150.0


# ---------------------------------------------------------------------------------------------
# What a process holds (Linux /proc)

def fd_kinds() -> dict:
    """Open fds of this process by kind (socket, pidfd, eventfd, epoll, shm, other)."""
    kinds: dict = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the fd of the listing itself, closed meanwhile
        if target.startswith("socket:"):
            k = "socket"
        elif target.startswith("anon_inode:"):
            k = target[len("anon_inode:"):].strip("[]")
        elif target.startswith("/dev/shm/"):
            k = "shm"
        else:
            k = "other"
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def snapshot() -> dict:
    kinds = fd_kinds()
    return {"threads": len(os.listdir("/proc/self/task")), "fds": sum(kinds.values()),
            "fd_kinds": kinds, "rss_kib": proc_status_kib("VmRSS")}


def delta(after: dict, before: dict) -> dict:
    kinds = {k: after["fd_kinds"].get(k, 0) - before["fd_kinds"].get(k, 0)
             for k in set(after["fd_kinds"]) | set(before["fd_kinds"])}
    return {"threads": after["threads"] - before["threads"], "fds": after["fds"] - before["fds"],
            "fd_kinds": {k: v for k, v in sorted(kinds.items()) if v},
            "rss_mib": (after["rss_kib"] - before["rss_kib"]) / 1024}


# ---------------------------------------------------------------------------------------------
# The shared-memory layout on paper (csrc/transport/shm/shm_layout.h), for the model

def auto_ring_bytes(local: int) -> int:
    """shm_comm.cpp's default p2p ring per ordered pair: 64 MiB / local^2 in [16 KiB, 1 MiB]."""
    return min(max((64 * MiB) // max(local * local, 1), 16 << 10), 1 * MiB)


def round_up(v: int, a: int) -> int:
    return (v + a - 1) // a * a


def segment_head_bytes(local: int, shm_bytes: int = 2 * MiB, ring: int = 0) -> int:
    """Bytes a node's segment reserves up front (fallocate): header, per-rank control, two
    staging halves per rank, a ring per ordered pair; the pool after it stays sparse."""
    half = round_up(max(shm_bytes // 2, 64 * local), 4096)
    ring = round_up(ring or auto_ring_bytes(local), 4096)
    stage_base = round_up(4096 + 256 * local, 4096)
    return stage_base + 2 * local * half + local * local * (128 + ring)


# ---------------------------------------------------------------------------------------------
# One rank

def _time_allreduce(dist, torch, numel: int, reps: int, iters: int, warmup: int) -> list:
    t = torch.zeros(numel)  # zeros: sums stay finite however often they are repeated
    for _ in range(warmup):
        dist.all_reduce(t)
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        samples.append((time.perf_counter() - t0) / reps)
    # The slowest rank's time is the iteration's time.
    s = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    return s.tolist()


def worker(rank: int, cfg: dict, port: int, workdir: str) -> None:
    W = cfg["world_size"]
    os.environ.update(cfg["env"][rank])
    # The backend's set-up lines (RSDP_DEBUG) and UCX's log (stdout) go to this rank's file.
    err = os.open(os.path.join(workdir, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(err, 1)
    os.dup2(err, 2)
    import torch
    import torch.distributed as dist
    import torch_rsdp  # noqa: F401  (registers the backend; loaded before the baseline)

    torch.set_num_threads(1)
    out = {"rank": rank}
    timeout = datetime.timedelta(seconds=PG_TIMEOUT)
    store = dist.TCPStore("127.0.0.1", port, W, is_master=False, timeout=timeout)
    everyone = list(range(W))

    def meet(name):  # a barrier through the store, before the group exists
        store.set(f"{name}/{rank}", "1")
        store.wait([f"{name}/{r}" for r in everyone], timeout)

    meet("ready")
    before = snapshot()
    t0 = time.time()
    dist.init_process_group("rsdp", store=store, rank=rank, world_size=W, timeout=timeout)
    dist.barrier()
    out["setup_s"] = time.time() - t0
    after = snapshot()
    out["init"] = delta(after, before)
    out["topology"] = {k: v for k, v in torch_rsdp.topology().items()
                       if k in ("node", "num_nodes", "local_rank", "local_size",
                                "setup_store_requests")}

    # A second group of the same ranks: what each further group costs to make.
    t0 = time.time()
    g = dist.new_group(everyone)
    dist.barrier(group=g)
    out["new_group_s"] = time.time() - t0
    out["new_group"] = delta(snapshot(), after)
    dist.destroy_process_group(g)

    out["allreduce_8B_s"] = _time_allreduce(dist, torch, 2, cfg["reps_small"], cfg["iters"],
                                            cfg["warmup"])
    out["allreduce_1MiB_s"] = _time_allreduce(dist, torch, MiB // 4, 1, cfg["iters"],
                                              cfg["warmup"])
    out["after_ops"] = delta(snapshot(), before)
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)

    victim = W - 1
    survivors = everyone[:victim]
    if rank == victim:
        # Kill once every survivor is about to wait, and a moment later (then it waits).
        store.wait([f"armed/{r}" for r in survivors], timeout)
        time.sleep(cfg["settle_s"])
        store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.zeros(MiB // 4)
    store.set(f"armed/{rank}", "1")
    res = {"rank": rank}
    try:
        dist.all_reduce(t)
        res["outcome"] = "completed"
    except RuntimeError as e:
        res["raised_at"] = time.time()
        res["outcome"] = "raised"
        res["msg"] = str(e)[:400]
    with open(os.path.join(workdir, f"notice{rank}.json"), "w") as f:
        json.dump(res, f)
    # Alive until every survivor raised: one exiting early would tell the others by its death.
    store.set(f"raised/{rank}", "1")
    try:
        store.wait([f"raised/{r}" for r in survivors], datetime.timedelta(seconds=30))
        dist.destroy_process_group()
    except Exception:  # a broken group's teardown: what counted is measured
        pass
    sys.stderr.flush()
    os._exit(0)  # nothing else to tear down; a broken group's atexit work is not measured


# ---------------------------------------------------------------------------------------------
# One world size

def rank_env(W: int, L: int, base_env: dict) -> list:
    envs = []
    nodes = (W + L - 1) // L
    for r in range(W):
        e = dict(base_env)
        e["RSDP_DEBUG"] = "1"  # the backend states its layout and endpoints at set-up
        e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"] = str(r % L), str(min(L, W - r // L * L))
        if nodes > 1:
            e["RSDP_NODE_ID"] = f"scale-node{r // L}"
            e.setdefault("UCX_TLS", "tcp")  # not UCX's shared memory: traffic crosses TCP
            # Every interface would include other jobs' short-lived bridges.
            e.setdefault("UCX_NET_DEVICES", "lo")
        envs.append({k: str(v) for k, v in e.items()})
    return envs


def parse_err(text: str) -> dict:
    shm = [m.groups() for m in SHM_LINE.finditer(text)]
    found = [m.groups() for m in EP_LINE.finditer(text)]
    # The first group named is WORLD; new_group's endpoints come after it.
    eps = [where for group, where in found if group == found[0][0]] if found else []
    d = {"endpoints": len(eps), "endpoints_other_node": eps.count("other")}
    if shm:
        name, size, total, half, ring, pool = shm[0]  # the first group: WORLD (or its node)
        d.update(shm_group=name, shm_size=int(size), shm_total=int(total), shm_half=int(half),
                 shm_ring=int(ring), shm_pool=int(pool))
    return d


def run_size(W: int, args, base_env: dict) -> dict:
    import multiprocessing as mp

    import torch.distributed as dist

    L = min(args.per_node, W)
    cfg = {"world_size": W, "env": rank_env(W, L, base_env),
           "iters": args.iters, "warmup": args.warmup, "reps_small": args.reps,
           "settle_s": 0.2 + 0.02 * W}
    workdir = tempfile.mkdtemp(prefix="rsdp_scale_")
    # The store lives here, so that the killed rank cannot take it down.
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=PG_TIMEOUT))
    ctx = mp.get_context("spawn")
    start = time.monotonic()
    procs = [ctx.Process(target=worker, args=(r, cfg, store.port, workdir), daemon=False)
             for r in range(W)]
    for p in procs:
        p.start()
    deadline = start + DEADLINE + 8 * W
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    elapsed = time.monotonic() - start
    row = {"world_size": W, "per_node": L, "nodes": (W + L - 1) // L, "launch_s": elapsed,
           "exitcodes": [p.exitcode for p in procs], "hung": hung}
    killed_at = float(store.get("killed_at")) if store.check(["killed_at"]) else None
    try:
        row.update(aggregate(W, workdir, killed_at))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def _read(path: str) -> str:
    """The file's text, "" where a rank wrote none."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _load(path: str):
    try:
        return json.loads(_read(path))
    except ValueError:
        return None


def aggregate(W: int, workdir: str, killed_at) -> dict:
    ranks = [_load(os.path.join(workdir, f"rank{r}.json")) for r in range(W)]
    missing = [r for r, v in enumerate(ranks) if v is None]
    if missing:
        return {"error": f"ranks {missing} wrote no result",
                "log_tails": {r: _read(os.path.join(workdir, f"rank{r}.err"))[-1500:]
                              for r in missing[:2]}}
    errs = [parse_err(_read(os.path.join(workdir, f"rank{r}.err"))) for r in range(W)]
    iters = len(ranks[0]["allreduce_1MiB_s"])
    d = {"setup_s": max(v["setup_s"] for v in ranks),
         "setup_s_min": min(v["setup_s"] for v in ranks),
         "new_group_s": max(v["new_group_s"] for v in ranks),
         # every rank holds the same all-reduced (max over ranks) samples
         "allreduce_8B_us": statistics.median(ranks[0]["allreduce_8B_s"]) * 1e6,
         "allreduce_1MiB_us": statistics.median(ranks[0]["allreduce_1MiB_s"]) * 1e6,
         "iters": iters}
    for key in ("init", "after_ops", "new_group"):
        per = [v[key] for v in ranks]
        d[key] = {k: [p[k] for p in per] for k in ("threads", "fds")}
        d[key].update({k + "s": [p["fd_kinds"].get(k, 0) for p in per]
                       for k in ("socket", "pidfd")}, fd_kinds_rank0=per[0]["fd_kinds"])
        d[key]["rss_mib"] = [round(p["rss_mib"], 2) for p in per]
    d["topology_rank0"] = ranks[0]["topology"]
    d["setup_store_requests"] = [r["topology"].get("setup_store_requests") for r in ranks]
    d["endpoints"] = [e["endpoints"] for e in errs]
    d["endpoints_other_node"] = [e["endpoints_other_node"] for e in errs]
    e0 = errs[0]
    if "shm_total" in e0:
        L = e0["shm_size"]
        head = segment_head_bytes(L, 2 * e0["shm_half"], e0["shm_ring"])
        d["shm"] = {"group": e0["shm_group"], "local_size": L, "segment_bytes": e0["shm_total"],
                    "staging_half_bytes": e0["shm_half"], "ring_bytes": e0["shm_ring"],
                    "pool_bytes_per_rank": e0["shm_pool"], "reserved_bytes": head,
                    "reserved_per_rank_bytes": head / L}
    notes = [_load(os.path.join(workdir, f"notice{r}.json")) for r in range(W - 1)]
    d["notice"] = notice_summary(notes, killed_at)
    return d


def notice_summary(notes: list, killed_at) -> dict:
    got = [n for n in notes if n]
    raised = [n["raised_at"] for n in got if n.get("outcome") == "raised"]
    d = {"survivors": len(notes), "raised": len(raised),
         "msg_rank0": (got[0].get("msg", "") if got else "")}
    if killed_at is not None and raised and len(raised) == len(notes):
        d["after_kill_s"] = [round(t - killed_at, 4) for t in raised]
        d["last_s"] = max(raised) - killed_at
        d["first_s"] = min(raised) - killed_at
    return d


# ---------------------------------------------------------------------------------------------
# Report

COLUMNS = ["ranks", "nodes x local", "set-up s", "new_group s", "shm/node MiB",
           "shm/rank MiB", "RSS +MiB", "threads +", "fds +", "sockets +", "UCX eps",
           "store req", "8 B µs", "1 MiB µs", "notice ms"]


def _rng(values) -> str:
    """min-max over ranks, one value when they agree (as printed)."""
    integral = all(float(v).is_integer() for v in values)
    lo, hi = (f"{v:.0f}" if integral else f"{v:.1f}" for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}-{hi}"


def table_row(row: dict) -> list:
    W, nodes, L = row["world_size"], row["nodes"], row["per_node"]
    if "error" in row:
        return [str(W), f"{nodes} x {L}", row["error"]] + [""] * (len(COLUMNS) - 3)
    shm = row.get("shm", {})
    notice = row.get("notice", {})
    init, ops = row["init"], row["after_ops"]
    return [str(W), f"{nodes} x {L}", f"{row['setup_s']:.2f}", f"{row['new_group_s']:.2f}",
            f"{shm.get('reserved_bytes', 0) / MiB:.1f}",
            f"{shm.get('reserved_per_rank_bytes', 0) / MiB:.2f}",
            _rng(init["rss_mib"]), _rng(ops["threads"]),
            f"{_rng(ops['fds'])} ({max(init['fds'])})",
            f"{_rng(ops['sockets'])} ({max(init['sockets'])})", _rng(row["endpoints"]),
            _rng(row["setup_store_requests"]) if None not in row.get("setup_store_requests",
                                                                     [None]) else "-",
            f"{row['allreduce_8B_us']:.0f}", f"{row['allreduce_1MiB_us']:.0f}",
            f"{notice['last_s'] * 1e3:.0f}" if "last_s" in notice else "-"]


def markdown(rows: list, meta: dict) -> str:
    lines = [md_table(COLUMNS, [table_row(r) for r in rows], "l" * len(COLUMNS))]
    lines += ["", "set-up: init_process_group + first barrier, max over ranks; shm/node: the "
              "node's segment reserved up front (staging, p2p rings; the pool is virtual); "
              "RSS: added per rank by the set-up; threads, fds, sockets: added per rank, "
              "held after the all-reduces (min-max over ranks; in brackets the most any rank "
              "held right after set-up); UCX eps: collective endpoints per rank; store req: "
              "requests each rank made to the store during set-up; 8 B / "
              "1 MiB: all-reduce median of the slowest rank; notice: SIGKILL of the last "
              "rank to the last survivor's all-reduce raising.", ""]
    return "\n".join(lines)



def store_get_us(n: int = 2000) -> float:
    """One client's round trip for a store get, µs: the unit of the set-up model, where every
    rank reads every other rank's records from the one store."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, is_master=False)
    client.set("k", "x" * 300)  # about a UCX worker address record
    for _ in range(100):
        client.get("k")
    t0 = time.perf_counter()
    for _ in range(n):
        client.get("k")
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2,4,8,16,32", help="world sizes, comma-separated")
    ap.add_argument("--per-node", type=int, default=4, help="ranks per emulated node")
    ap.add_argument("--iters", type=int, default=20, help="timed all-reduce iterations")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20, help="back-to-back 8 B all-reduces timed "
                    "together (ranks leave a barrier up to a message latency apart)")
    ap.add_argument("--quick", action="store_true",
                    help="2 and 4 ranks, 2 per node (one node, then two), few iterations")
    ap.add_argument("--append", action="store_true",
                    help="keep the other world sizes' rows already in <out>/scale.json")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.per_node, args.iters, args.warmup, args.reps = "2,4", 2, 5, 2, 5
    sizes = [int(s) for s in args.sizes.split(",") if s]
    base_env = {k: os.environ[k] for k in ("UCX_TLS", "UCX_NET_DEVICES") if k in os.environ}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
            "store_get_us": round(store_get_us(), 1)}
    path = os.path.join(args.out, "scale.json")
    rows = {}
    if args.append and os.path.exists(path):
        old = json.load(open(path))
        rows = {r["world_size"]: r for r in old.get("results", old)["rows"]}
    print("| " + " | ".join(COLUMNS) + " |", flush=True)
    failed = False
    for W in sizes:
        row = run_size(W, args, base_env)
        row["meta"] = meta
        rows[W] = row
        failed |= "error" in row
        print("| " + " | ".join(table_row(row)) + " |", flush=True)
        if W > (os.cpu_count() or 1):
            print(f"  ({W} ranks on {os.cpu_count()} cores: time-sliced)", flush=True)
    ordered = [rows[w] for w in sorted(rows)]
    write_result(args.out, "scale", {"meta": meta, "rows": ordered}, markdown(ordered, meta),
                 argv)
    return 1 if failed else 0
