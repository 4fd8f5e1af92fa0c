"""``python -m torch_rsdp --check N``: every collective once on N local ranks, rsdp and gloo.

The launcher starts N processes of this machine's Python (``subprocess``, so that a rank that
segfaults or hangs cannot take the launcher with it), which meet through a ``FileStore`` in a
temporary folder (no port to find free). Each rank builds a gloo world group and an rsdp
group and runs every op once per backend and device: inputs are small integers in float32
that encode the sending rank (and the destination chunk), so every result is checked exactly.
It then times each op: a small message (8 bytes per rank; latency) and a larger one (4 MiB in
all; bus bandwidth with nccl-tests' factors), the slowest rank of each iteration, the median.

Each rank writes one JSON line when it starts an op and one with its result, so when a rank
dies or hangs the launcher still knows which op it was in. Every wait has a deadline: each
collective the group timeout (a quarter of ``--timeout``, at least 5 s), the whole run
``--timeout``; a rank that raises skips the rest of that backend's ops (its peers may be out
of step), and a rank that dies leaves the others a few seconds to report before they stop.

``RSDP_TEST_SELFCHECK_PLANT=<op>:<rank>[:die|:hang]`` (a test hook, read here only) corrupts that
rank's result of that op before it is checked, or makes the rank exit or sleep in that op, so
that the tests can see each kind of failure reported.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._cuda import cuda_available
from ._ring import ring_neighbours, ring_shift

__all__ = ["check", "OPS"]

PLANT_ENV = "RSDP_TEST_SELFCHECK_PLANT"
BACKENDS = ("rsdp", "gloo")
SMALL = 2                 # float32 elements per rank for the latency figure: 8 bytes
LARGE_BYTES = 4 << 20     # the whole message for the bandwidth figure
LAT_ITERS, BW_ITERS = 7, 3
GRACE_S = 5.0             # after a rank dies, the others get this long to report, then stop
#: gloo lacks some ops on some devices: that is gloo's answer, not a failure of this machine.
GLOO_UNSUPPORTED = re.compile(r"not supported|does not support|unsupported|only supports", re.I)


def _vals(count: int, rank: int, device, chunk: int = 0) -> torch.Tensor:
    """Small integers (exact in float32, and in sums of them) that encode rank and chunk."""
    i = torch.arange(count, device=device)
    return ((i % 4) * 16 + (rank + 1) + 256 * chunk).float()


class _NotApplicable(Exception):
    """The op does not apply here (one rank has no peer; a backend without it)."""


class _Op:
    """One op on one group: ``run()`` issues it (again, for timing); ``got()`` is this rank's
    result (None where the op gives it none) and ``want`` what it must equal."""

    def __init__(self, run: Callable[[], None], got: Callable[[], Optional[torch.Tensor]],
                 want: Optional[torch.Tensor]):
        self.run, self.got, self.want = run, got, want


def _build(op: str, g, r: int, n: int, c: int, dev) -> _Op:
    """``op`` on group ``g`` for rank ``r`` of ``n``, ``c`` elements per rank (split ops) or
    in all (the others). Ranks are group ranks; the groups span the world, so they are also
    the global ranks torch's src/dst arguments take."""
    v = lambda q, chunk=0: _vals(c, q, dev, chunk)  # noqa: E731
    total = lambda: sum(v(q) for q in range(n))      # noqa: E731
    if op == "all_reduce":
        x = v(r)
        return _Op(lambda: dist.all_reduce(x, group=g), lambda: x, total())
    if op == "broadcast":
        x = v(r)
        return _Op(lambda: dist.broadcast(x, src=0, group=g), lambda: x, v(0))
    if op == "reduce":
        x = v(r)
        return _Op(lambda: dist.reduce(x, dst=0, group=g),
                   lambda: x if r == 0 else None, total())
    if op in ("all_gather", "all_gather_into_tensor"):
        x, want = v(r), torch.cat([v(q) for q in range(n)])
        if op == "all_gather":
            outs = [torch.empty(c, device=dev) for _ in range(n)]
            return _Op(lambda: dist.all_gather(outs, x, group=g), lambda: torch.cat(outs), want)
        out = torch.empty(n * c, device=dev)
        return _Op(lambda: dist.all_gather_into_tensor(out, x, group=g), lambda: out, want)
    if op in ("reduce_scatter", "reduce_scatter_tensor"):
        ins, out = [v(r, j) for j in range(n)], torch.empty(c, device=dev)
        want = sum(v(q, r) for q in range(n))
        if op == "reduce_scatter":
            return _Op(lambda: dist.reduce_scatter(out, ins, group=g), lambda: out, want)
        x = torch.cat(ins)
        return _Op(lambda: dist.reduce_scatter_tensor(out, x, group=g), lambda: out, want)
    if op == "gather":
        x, outs = v(r), [torch.empty(c, device=dev) for _ in range(n)] if r == 0 else None
        return _Op(lambda: dist.gather(x, outs, dst=0, group=g),
                   lambda: torch.cat(outs) if r == 0 else None,
                   torch.cat([v(q) for q in range(n)]))
    if op == "scatter":
        ins, out = ([v(0, j) for j in range(n)] if r == 0 else None), torch.empty(c, device=dev)
        return _Op(lambda: dist.scatter(out, ins, src=0, group=g), lambda: out, v(0, r))
    if op == "all_to_all_single":
        x, out = torch.cat([v(r, j) for j in range(n)]), torch.empty(n * c, device=dev)
        return _Op(lambda: dist.all_to_all_single(out, x, group=g), lambda: out,
                   torch.cat([v(q, r) for q in range(n)]))
    if op == "send_recv":  # a ring of isend/irecv: every rank sends and receives once
        if n == 1:
            raise _NotApplicable("needs 2 ranks or more")
        x, out = v(r), torch.empty(c, device=dev)

        def run():
            for w in (dist.isend(x, (r + 1) % n, group=g), dist.irecv(out, (r - 1) % n, group=g)):
                w.wait()
        return _Op(run, lambda: out, v((r - 1) % n))
    if op == "barrier":
        return _Op(lambda: dist.barrier(group=g), lambda: None, None)
    if op == "ring_shift":
        try:
            _, recv_from = ring_neighbours(g)
        except TypeError as e:  # not an rsdp group: no fused ring step (yet)
            raise _NotApplicable(str(e).split(";")[0]) from e
        x, out = v(r), torch.empty(c, device=dev)
        return _Op(lambda: ring_shift(x, out, group=g), lambda: out, v(recv_from))
    raise ValueError(f"unknown op {op}")


#: op -> (bus bandwidth factor at n ranks, whether ``c`` is per rank); None: no bandwidth.
OPS: Dict[str, Tuple[Optional[Callable[[int], float]], bool]] = {
    "all_reduce": (lambda n: 2 * (n - 1) / n, False),
    "broadcast": (lambda n: 1.0, False),
    "reduce": (lambda n: 1.0, False),
    "all_gather": (lambda n: (n - 1) / n, True),
    "all_gather_into_tensor": (lambda n: (n - 1) / n, True),
    "reduce_scatter": (lambda n: (n - 1) / n, True),
    "reduce_scatter_tensor": (lambda n: (n - 1) / n, True),
    "gather": (lambda n: (n - 1) / n, True),
    "scatter": (lambda n: (n - 1) / n, True),
    "all_to_all_single": (lambda n: (n - 1) / n, True),
    "send_recv": (lambda n: 1.0, False),
    "barrier": (None, False),
    "ring_shift": (lambda n: 1.0, False),
}


def _compare(got: Optional[torch.Tensor], want: Optional[torch.Tensor], planted: bool) -> str:
    """'' when right, else what is wrong."""
    tag = " (planted by RSDP_TEST_SELFCHECK_PLANT)" if planted else ""
    if got is None or want is None:
        return f"planted failure{tag}" if planted else ""
    got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    if planted:
        got = got.clone()
        got[0] += 1
    if got.shape != want.shape:
        return f"result has {got.numel()} elements, expected {want.numel()}{tag}"
    bad = (got != want).nonzero()
    if not len(bad):
        return ""
    i = int(bad[0])
    return (f"element {i} is {got[i].item():g}, expected {want[i].item():g} "
            f"({len(bad)} of {want.numel()} elements wrong){tag}")


def _time(op: _Op, g, iters: int, dev) -> List[float]:
    """Seconds of each of ``iters`` runs, each started together (a barrier before it)."""
    out = []
    for _ in range(iters):
        dist.barrier(group=g)
        t0 = time.perf_counter()
        op.run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _one(name: str, g, r: int, n: int, dev, planted: bool) -> dict:
    """Runs, checks and times one op at both sizes; raises what the backend raises."""
    factor, split = OPS[name]
    large = LARGE_BYTES // 4 // (n if split else 1)
    rec = {"status": "pass", "error": "", "lat": [], "bw": [],
           "bytes": large * 4 * (n if split else 1), "factor": factor(n) if factor else None}
    for c, label in ((SMALL, f"{SMALL * 4} B"), (large, "4 MiB")):
        op = _build(name, g, r, n, c, dev)
        op.run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        wrong = _compare(op.got(), op.want, planted)
        if wrong and rec["status"] == "pass":
            rec.update(status="FAIL", error=f"{label}: {wrong}")
        if c == SMALL:
            rec["lat"] = _time(op, g, LAT_ITERS, dev)
        elif factor is not None:
            rec["bw"] = _time(op, g, BW_ITERS, dev)
    return rec


def _worker(rank: str, n: str, tmp: str, timeout: str) -> int:
    """One rank: runs every op on every backend and device, one JSON line per event."""
    rank, n, timeout = int(rank), int(n), float(timeout)
    warnings.filterwarnings("ignore")  # torch's deprecation notes would bury the rank's log
    torch.set_num_threads(1)           # N ranks share the machine's cores
    log = open(Path(tmp) / f"rank{rank}.jsonl", "a", buffering=1)
    note = lambda **rec: log.write(json.dumps(rec) + "\n")  # noqa: E731
    op_timeout = timedelta(seconds=max(5.0, timeout / 4))
    devices = ["cpu"] + (["cuda"] if cuda_available() else [])
    if "cuda" in devices:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    plant_op, plant_rank, plant_how = (os.environ.get(PLANT_ENV, "").split(":") + ["", ""])[:3]
    groups = {}
    note(event="start", backend="gloo", device="-", op="init")
    store = dist.FileStore(str(Path(tmp) / "store"), n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=op_timeout)
    groups["gloo"] = dist.group.WORLD
    note(event="start", backend="rsdp", device="-", op="init")
    try:
        groups["rsdp"] = dist.new_group(backend="rsdp", timeout=op_timeout)
    except Exception as e:  # noqa: BLE001 - reported, and gloo still runs
        note(event="result", backend="rsdp", device="-", op="init", status="FAIL",
             error=_first_line(e))
    for backend in BACKENDS:
        broken = "" if backend in groups else "the group did not start"
        for device in devices:
            for name in OPS:
                key = dict(backend=backend, device=device, op=name)
                if broken:  # the ranks may be out of step in a group whose op raised
                    note(event="result", **key, status="skipped", error=broken)
                    continue
                note(event="start", **key)
                planted = plant_op == name and plant_rank == str(rank)
                if planted and plant_how == "die":
                    os._exit(3)
                if planted and plant_how == "hang":
                    time.sleep(3600)
                try:
                    rec = _one(name, groups[backend], rank, n, torch.device(device), planted)
                except _NotApplicable as e:
                    rec = {"status": "n/a", "error": str(e)}
                except Exception as e:  # noqa: BLE001 - the check's answer
                    if backend == "gloo" and GLOO_UNSUPPORTED.search(str(e)):
                        rec = {"status": "n/a", "error": _first_line(e)}
                    else:
                        rec = {"status": "FAIL", "error": _first_line(e)}
                        broken = f"after {name} raised on rank {rank}"
                note(event="result", **key, **rec)
    dist.destroy_process_group()
    note(event="finished")
    return 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# ----------------------------------------------------------------------------- the launcher
_WORKER = "import sys; from torch_rsdp._selfcheck import _worker; sys.exit(_worker(*sys.argv[1:]))"


def _spawn(n: int, tmp: Path, timeout: float) -> List[subprocess.Popen]:
    env = dict(os.environ)
    # the workers import this very torch_rsdp, installed or not (an in-place build)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    procs = []
    for r in range(n):
        with open(tmp / f"rank{r}.log", "wb") as log:  # the child keeps its own copy
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(r), str(n), str(tmp), str(timeout)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs: List[subprocess.Popen], timeout: float) -> Dict[int, str]:
    """Waits for every rank, at most ``timeout`` seconds; returns how each rank that did not
    exit cleanly ended. A rank that dies leaves the others GRACE_S to report, then stops them."""
    deadline, stop_at, first_dead, killed = time.monotonic() + timeout, None, None, {}
    while any(p.poll() is None for p in procs):
        dead = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if dead and first_dead is None:
            first_dead, stop_at = dead[0], time.monotonic() + GRACE_S
        now = time.monotonic()
        if now > deadline or (stop_at is not None and now > stop_at):
            why = (f"hung: no end within the {timeout:g} s deadline, killed" if now > deadline
                   else f"was stopped {GRACE_S:g} s after rank {first_dead} died")
            for r, p in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    killed[r] = why
            break
        time.sleep(0.05)
    ended = {}
    for r, p in enumerate(procs):
        code = p.wait()
        if r in killed:
            ended[r] = killed[r]
        elif code < 0:
            ended[r] = f"died: killed by {signal.Signals(-code).name}"
        elif code > 0:
            ended[r] = f"died: exited with code {code}"
    return ended


def _records(tmp: Path, r: int) -> Tuple[Dict[tuple, dict], Optional[tuple], bool]:
    """Rank ``r``'s results by (backend, device, op), the op it started last and had not
    finished, and whether it finished."""
    results, current, finished = {}, None, False
    path = tmp / f"rank{r}.jsonl"
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        key = (rec.get("backend"), rec.get("device"), rec.get("op"))
        if rec["event"] == "start":
            current = key
        elif rec["event"] == "result":
            results[key], current = rec, None
        finished = finished or rec["event"] == "finished"
    return results, current, finished


def _tail(tmp: Path, r: int, lines: int = 6) -> str:
    path = tmp / f"rank{r}.log"
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join("      " + ln for ln in text[-lines:]) or "      (no output)"


def _figures(recs: List[dict]) -> Tuple[str, str]:
    """(latency, bus bandwidth) of one op: the slowest rank of each iteration, the median."""
    def median_of_max(field):
        runs = [rec.get(field) or [] for rec in recs]
        if not runs or not all(runs):
            return None
        return statistics.median(max(t) for t in zip(*runs))
    lat, bw = median_of_max("lat"), median_of_max("bw")
    factor = recs[0].get("factor") if recs else None
    return (f"{lat * 1e6:9.1f} us" if lat else f"{'-':>12}",
            f"{recs[0]['bytes'] * factor / bw / 1e9:7.2f} GB/s" if bw and factor else
            f"{'-':>12}")


def check(n: int = 2, timeout: float = 120.0) -> int:
    """Runs the self-check on ``n`` local ranks and prints its table; 0 when all passed."""
    if n < 1:
        print("--check needs 1 rank or more", file=sys.stderr)
        return 2
    devices = ["cpu"] + (["cuda"] if cuda_available() else [])
    print(f"torch_rsdp self-check: {n} local rank(s), backends {', '.join(BACKENDS)}, "
          f"{' and '.join(devices)} tensors"
          + ("" if "cuda" in devices else " (no CUDA here)")
          + f"; deadline {timeout:g} s", flush=True)
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="rsdp-selfcheck-"))
    procs = []
    try:
        procs = _spawn(n, tmp, timeout)
        ended = _wait(procs, timeout)
        return _summarise(tmp, n, devices, ended, time.monotonic() - start)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _summarise(tmp: Path, n: int, devices: List[str], ended: Dict[int, str],
               elapsed: float) -> int:
    ranks = [_records(tmp, r) for r in range(n)]
    failures, rows = [], []
    keys = [(b, "-", "init") for b in BACKENDS] + [
        (b, d, op) for b in BACKENDS for d in devices for op in OPS]
    for key in keys:
        backend, device, op = key
        where = f"{op} on {backend}" + (f" ({device})" if device != "-" else "")
        recs, errors, skipped, na = [], [], [], []
        for r, (results, current, _) in enumerate(ranks):
            rec = results.get(key)
            if rec is None:
                if current == key:
                    errors.append(f"rank {r}: {ended.get(r, 'ended')} in this op")
                elif op != "init":
                    skipped.append(f"not run on rank {r}: it {ended.get(r, 'ended early')}")
                continue
            recs.append(rec)
            if rec["status"] == "FAIL":
                errors.append(f"rank {r}: {rec['error']}")
            elif rec["status"] == "skipped":
                skipped.append(f"not run: {rec['error']}")
            elif rec["status"] == "n/a":
                na.append(rec["error"])
        if op == "init" and not errors:
            continue  # a group that started needs no row
        if errors:
            status = "FAIL"
            failures += [f"FAIL {where}: {e}" for e in errors]
        elif skipped:
            status, note = "skip", skipped[0]
        elif na and len(na) == len(recs):
            status, note = "n/a", na[0]
        else:
            status = "pass"
        lat, bw = _figures(recs) if status == "pass" else (f"{'-':>12}", f"{'-':>12}")
        tail = "  (below)" if errors else (f"  {note}" if status in ("n/a", "skip") else "")
        rows.append(f"{status:5} {backend:5} {device:5} {op:23} {lat} {bw}{tail}")
    print(f"latency: {SMALL * 4} B per rank, median of {LAT_ITERS}; bandwidth: 4 MiB in all, "
          f"busbw with nccl-tests' factors, median of {BW_ITERS}; each run's slowest rank")
    print(f"{'':5} {'':5} {'':5} {'op':23} {'latency':>12} {'busbw':>12}")
    print("\n".join(rows))
    for r, how in sorted(ended.items()):
        results, current, _ = ranks[r]
        at = (f"during {current[2]} on {current[0]}" + (f" ({current[1]})"
              if current[1] != "-" else "")) if current else "outside any op"
        failures.append(f"FAIL rank {r} {how} {at}; the end of its output:\n{_tail(tmp, r)}")
    for r, (_, _, finished) in enumerate(ranks):
        if not finished and r not in ended:
            failures.append(f"FAIL rank {r} ended without finishing:\n{_tail(tmp, r)}")
    if failures:
        print("\n" + "\n".join(failures))
        print(f"\nself-check FAILED ({len(failures)} failure(s)) in {elapsed:.1f} s")
        return 1
    na = sum(row.startswith("n/a") for row in rows)
    print(f"\nself-check passed: {len(rows) - na} of {len(rows)} passed"
          + (f", {na} not applicable here" if na else "") + f", in {elapsed:.1f} s")
    return 0
