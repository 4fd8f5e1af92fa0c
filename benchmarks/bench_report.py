"""Tables, targets and plots for bench_collectives.py (no torch.distributed in here).

A row is one measured point: {"backend", "op", "dtype", "bytes", "count", "time_us",
"algbw_gbps", "busbw_gbps", "correct", ...}. Report adds the ratios to the baseline (the last
backend label), renders the markdown report, evaluates the performance targets and draws one
PNG per op. For a CUDA run (machine info "device" == "cuda") it also relates every point to the
GPU's device-to-device copy bandwidth ("busbw/copy") and replaces the CPU targets with a
"Physical limit" section. With peers (config "peers", e.g. ["mpi", "oneccl"]; see
bench_peers.py) each peer is shown as one more backend with an `X/<peer>` time ratio, and the
targets section checks rsdp's 2-rank time minus its 1-rank ("rsdp@1") time against mpi's.
"""

from __future__ import annotations

import math
import os

KiB, MiB = 1 << 10, 1 << 20

BUSBW_FACTOR_TEXT = {
    "allreduce": "2(n-1)/n",
    "allgather": "(n-1)/n",
    "reduce_scatter": "(n-1)/n",
    "alltoall": "(n-1)/n",
    "broadcast": "1",
}

# Targets, stated for 2 ranks (docs/benchmarks.md).
BUSBW_SPEEDUP = 5.0            # busbw >= 5x baseline ...
BUSBW_RANGE = (64 * KiB, 64 * MiB)  # ... from 64 KiB to 64 MiB ...
BUSBW_OPS = ("allreduce", "allgather", "reduce_scatter")  # ... for these ops
LATENCY_RATIO = 0.2            # time <= 1/5 of baseline ...
LATENCY_MAX_BYTES = 4 * KiB    # ... at 4 KiB and below (every op measured)
# busbw >= this fraction of single-core memcpy, for these ops, at this size and above.
MEMCPY_TARGETS = ((("allreduce",), 0.6, 16 * MiB), (("allgather", "broadcast"), 0.8, 1 * MiB))
# With --peers mpi: rsdp's time minus its own world-size-1 time ("rsdp@1", the cost of the call
# itself) <= Open MPI's time, for every size in this range, for these ops.
PEER = "mpi"
WORLD1 = "rsdp@1"
PEER_RANGE = (8, 64 * KiB)
PEER_OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")


def busbw_factor(op: str, n: int) -> float:
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(op)


def bandwidths(op: str, nbytes: int, seconds: float, n: int) -> dict:
    algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(op, n)}


def aggregate(raw: list[dict]) -> list[dict]:
    """Merge the per-round rows of one point: pool the iteration samples, take the median.

    A point is correct only if it was correct in every round; an error in any round sticks.
    """
    merged: dict[tuple, dict] = {}
    for r in raw:
        key = (r["backend"], r["op"], r["dtype"], r["bytes"])
        m = merged.get(key)
        if m is None:
            m = merged[key] = {k: v for k, v in r.items() if k not in ("round", "samples_us")}
            m.update(rounds=0, iters=0, correct=True, samples_us=[])
        m["rounds"] += 1
        m["correct"] = m["correct"] and r.get("correct", False)
        if r.get("error"):
            m["error"] = r["error"]
        m["iters"] += r.get("iters", 0)
        m["samples_us"] += r.get("samples_us", [])
    rows = list(merged.values())
    for m in rows:
        if m["samples_us"] and not m.get("error"):
            samples = sorted(m["samples_us"])
            mid = len(samples) // 2
            med = samples[mid] if len(samples) % 2 else (samples[mid - 1] + samples[mid]) / 2
            m["time_us"] = med
            m["time_us_min"] = samples[0]
            m.update(bandwidths(m["op"], m["bytes"], med * 1e-6, m["world_size"]))
    return rows


def fmt_bytes(b: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def fmt_num(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    if 0 < x < 0.01:
        return f"{x:.2g}"
    return f"{x:.{digits}f}"


def md_table(header: list[str], rows: list[list[str]], align: str) -> str:
    """Markdown table padded to column width, so it also reads well on a terminal."""
    cells = [header] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        out = []
        for i, c in enumerate(r):
            out.append(c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]))
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


class Report:
    def __init__(self, rows: list[dict], labels: list[str], info: dict, config: dict):
        self.rows = rows
        self.labels = labels
        self.baseline = labels[-1]
        self.candidates = labels[:-1]
        self.info = info
        self.config = config
        self.n = config["world_size"]
        self.memcpy = info["memcpy_gbps_single_core"]
        self.cuda = info.get("device") == "cuda"
        self.copy = info.get("d2d_copy_gbps") if self.cuda else None
        self._index = {(r["backend"], r["op"], r["dtype"], r["bytes"]): r for r in rows}
        # Peers measured in this run (shown as backends after the torch ones), and the torch
        # labels compared with them (the candidates, or the baseline when alone).
        self.peers = [p for p in config.get("peers") or [] if any(r["backend"] == p for r in rows)]
        self.vs_peer = (self.candidates or [self.baseline]) if self.peers else []
        for r in rows:
            base = self._index.get((self.baseline, r["op"], r["dtype"], r["bytes"]))
            r["busbw_ratio"] = r["latency_ratio"] = None
            for peer in self.peers:
                if r["backend"] in self.vs_peer:
                    p = self._index.get((peer, r["op"], r["dtype"], r["bytes"]))
                    r[f"latency_ratio_{peer}"] = (r["time_us"] / p["time_us"] if self._ok(r)
                                                  and p and self._ok(p) and p["time_us"] > 0
                                                  else None)
            if r["backend"] not in self.labels:
                continue  # peers and rsdp@1: no ratios to the torch baseline
            if self._ok(r) and base is not None and self._ok(base):
                if base["busbw_gbps"] > 0:
                    r["busbw_ratio"] = r["busbw_gbps"] / base["busbw_gbps"]
                if base["time_us"] > 0:
                    r["latency_ratio"] = r["time_us"] / base["time_us"]
            if self.cuda:
                r["copy_fraction"] = (r["busbw_gbps"] / self.copy
                                      if self._ok(r) and self.copy else None)

    @staticmethod
    def _ok(r: dict) -> bool:
        return r.get("correct", False) and not r.get("error") and "time_us" in r

    def bad_rows(self) -> list[dict]:
        return [r for r in self.rows if not self._ok(r)]

    def _ops_dtypes(self):
        ops = [op for op in self.config["ops"]]
        return [(op, dt) for op in ops for dt in self.config["dtypes"]]

    # ------------------------------------------------------------------ markdown

    def markdown(self) -> str:
        if self.cuda:
            return self._markdown_cuda()
        info, cfg = self.info, self.config
        vs = (f"{', '.join(self.candidates)} vs {self.baseline} (baseline)"
              if self.candidates else f"{self.baseline} only")
        out = [
            f"# Collective benchmark: {vs}, {self.n} ranks, CPU tensors",
            "",
            f"Machine: {info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']}, "
            f"single-core memcpy {self.memcpy:.2f} GB/s. "
            f"Sizes {fmt_bytes(cfg['min_bytes'])}..{fmt_bytes(cfg['max_bytes'])}, "
            f"up to {cfg['iters']} timed iterations (at least {cfg['min_iters']}) of up to "
            f"{cfg['reps']} back-to-back ops (1 from 1 MiB), "
            f"{cfg['threads']} thread(s) per rank; run took {info.get('elapsed_s', '?')} s.",
            "",
            "time = per-op time in µs: median over iterations of the slowest rank's "
            "iteration time / ops per iteration; "
            "algbw = bytes / time, busbw = algbw × factor, in GB/s (1e9 B/s); "
            f"`busbw×` = busbw / {self.baseline} busbw (higher is better); "
            f"`lat×` = time / {self.baseline} time (lower is better). "
            "`WRONG` marks a point whose result did not match.",
        ]
        out += self._peers_header()
        if not self.rows:
            out += ["", "**No results: the run failed before the first point was measured.**"]
            return "\n".join(out) + "\n"
        for op, dtype in self._ops_dtypes():
            out += ["", self._section(op, dtype)]
        out += ["", self.targets_markdown()]
        return "\n".join(out) + "\n"

    def _peers_header(self) -> list[str]:
        info, out = self.info, []
        world1 = (f" `{WORLD1}` = rsdp on a 1-rank group, same points (in results.json and "
                  "the targets section)." if any(r["backend"] == WORLD1 for r in self.rows)
                  else "")
        for peer in self.peers:
            vs = ", ".join(f"`{lb}/{peer}`" for lb in self.vs_peer)
            if peer == "mpi":
                what = (f"{info.get('mpi_library_version', '?').split(',')[0]} "
                        f"(MPI {info.get('mpi_standard_version', '?')}, mpi4py "
                        f"{info.get('mpi4py_version', '?')}), `{info.get('mpi_command', '')}`, "
                        "numpy buffers")
            else:  # oneccl
                what = (f"oneCCL {info.get('oneccl_library_version', '?').split(' ')[0]} "
                        f"(wheel oneccl-cpu {info.get('oneccl_wheel_version', '?')}), "
                        f"`{info.get('oneccl_command', '')}`, C++ on page-aligned buffers")
            out += ["", f"Peer `{peer}`: {what}, the same points, iteration counts and timing; "
                        f"{vs} = time / {peer} time (lower is better).{world1}"]
            world1 = ""  # said once
        out += [f"\nNote: {n}." for n in info.get("peer_notes", [])]
        return out

    def _markdown_cuda(self) -> str:
        info, cfg = self.info, self.config
        vs = (f"{', '.join(self.candidates)} vs {self.baseline} (baseline)"
              if self.candidates else f"{self.baseline} only")
        out = [
            f"# Collective benchmark: {vs}, {self.n} ranks, CUDA tensors",
            "",
            f"GPU: {info['gpu_name']} x{info['gpu_count']}, {info['ranks_per_gpu']} rank(s) per "
            f"GPU, CUDA {info['torch_cuda_version']}; device-to-device copy "
            f"{fmt_num(self.copy)} GB/s counting bytes read + written "
            f"({fmt_num(info['d2d_copy_gbps_bytes_copied'])} GB/s of bytes copied). "
            f"Host: {info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']}. "
            f"Sizes {fmt_bytes(cfg['min_bytes'])}..{fmt_bytes(cfg['max_bytes'])}, "
            f"up to {cfg['iters']} timed iterations (at least {cfg['min_iters']}) of up to "
            f"{cfg['reps']} back-to-back ops (1 from 1 MiB); run took "
            f"{info.get('elapsed_s', '?')} s.",
        ]
        if info.get("baseline_note"):
            out += ["", f"Note: {info['baseline_note']}."]
        out += [
            "",
            "time = per-op GPU time in µs (CUDA events on each rank's current stream from "
            "right after a barrier to after the last op of the iteration): median over "
            "iterations of the slowest rank's iteration time / ops per iteration; "
            "algbw = bytes / time, busbw = algbw × factor, in GB/s (1e9 B/s); "
            "`busbw/copy` = busbw / the device-to-device copy bandwidth above"
            + (f"; `busbw×` = busbw / {self.baseline} busbw (higher is better); "
               f"`lat×` = time / {self.baseline} time (lower is better)"
               if self.candidates else "")
            + ". `WRONG` marks a point whose result did not match.",
        ]
        if not self.rows:
            out += ["", "**No results: the run failed before the first point was measured.**"]
            return "\n".join(out) + "\n"
        for op, dtype in self._ops_dtypes():
            out += ["", self._section(op, dtype)]
        out += ["", self.limit_markdown()]
        return "\n".join(out) + "\n"

    def physical_limit(self) -> list[dict]:
        """CUDA: per backend, op and dtype, the best busbw and its fraction of the copy
        bandwidth (no PASS/MISS)."""
        res = []
        for lb in self.labels:
            for op, dt in self._ops_dtypes():
                rows = [r for r in self._rows(lb, op, dt) if self._ok(r)]
                if not rows:
                    continue
                best = max(rows, key=lambda r: r["busbw_gbps"])
                res.append(dict(backend=lb, op=op, dtype=dt, busbw_gbps=best["busbw_gbps"],
                                at_bytes=best["bytes"], copy_gbps=self.copy,
                                fraction=best.get("copy_fraction")))
        return res

    def limit_markdown(self) -> str:
        out = ["## Physical limit",
               "",
               f"The GPU's device-to-device copy moves {fmt_num(self.copy)} GB/s (bytes read + "
               f"written). Ranks that share a GPU share that bandwidth. No PASS/MISS targets are "
               f"stated for CUDA tensors."]
        rows = [[t["backend"], t["op"], t["dtype"], fmt_num(t["busbw_gbps"], 3),
                 fmt_bytes(t["at_bytes"]), fmt_num(t["fraction"])]
                for t in self.physical_limit()]
        if rows:
            out += ["", md_table(["backend", "op", "dtype", "best busbw", "at", "busbw/copy"],
                                 rows, "lllrrr")]
        return "\n".join(out)

    def _section(self, op: str, dtype: str) -> str:
        # A peer without this dtype (MPI has no bfloat16) gets no columns here.
        peers = [p for p in self.peers if self._rows(p, op, dtype)]
        header = ["bytes"]
        for lb in self.labels + peers:
            header += [f"{lb} µs", f"{lb} algbw", f"{lb} busbw"]
        for lb in self.candidates:
            header += [f"{lb} busbw×", f"{lb} lat×"]
        header += [f"{lb}/{p}" for lb in self.vs_peer for p in peers]
        if self.cuda:
            header += [f"{lb} busbw/copy" for lb in self.labels]
        shown = self.labels + peers
        sizes = sorted({r["bytes"] for r in self.rows if r["op"] == op and r["dtype"] == dtype
                        and r["backend"] in shown})
        body = []
        for b in sizes:
            line = [fmt_bytes(b)]
            for lb in shown:
                r = self._index.get((lb, op, dtype, b))
                if r is None:
                    line += ["-", "-", "-"]
                elif r.get("error"):
                    line += ["ERROR", "-", "-"]
                else:
                    mark = "" if r.get("correct") else " WRONG"
                    line += [fmt_num(r["time_us"], 1), fmt_num(r["algbw_gbps"], 3),
                             fmt_num(r["busbw_gbps"], 3) + mark]
            for lb in self.candidates:
                r = self._index.get((lb, op, dtype, b)) or {}
                line += [fmt_num(r.get("busbw_ratio")), fmt_num(r.get("latency_ratio"))]
            for lb in self.vs_peer:
                r = self._index.get((lb, op, dtype, b)) or {}
                line += [fmt_num(r.get(f"latency_ratio_{p}")) for p in peers]
            if self.cuda:
                for lb in self.labels:
                    r = self._index.get((lb, op, dtype, b)) or {}
                    line.append(fmt_num(r.get("copy_fraction")))
            body.append(line)
        errors = {r["backend"]: r["error"] for r in self.rows
                  if r["op"] == op and r["dtype"] == dtype and r.get("error")
                  and r["backend"] in shown}
        title = (f"## {op}, {dtype}  (busbw factor {BUSBW_FACTOR_TEXT[op]} = "
                 f"{busbw_factor(op, self.n):.2f})")
        if not body:
            return f"{title}\n\n(no data)"
        notes = "".join(f"\n\n{lb}: {msg}" for lb, msg in errors.items())
        return f"{title}\n\n{md_table(header, body, 'l' + 'r' * (len(header) - 1))}{notes}"

    # ------------------------------------------------------------------ targets

    def _rows(self, label, op, dtype, lo=0, hi=float("inf")):
        return [r for r in self.rows if r["backend"] == label and r["op"] == op
                and r["dtype"] == dtype and lo <= r["bytes"] <= hi]

    def targets(self) -> list[dict]:
        if self.cuda:
            return []  # the targets are stated for CPU tensors; see physical_limit()
        res = []
        ops_dtypes = self._ops_dtypes()

        def entry(target, label, op, dtype, rows, key, better, need, fmt):
            if not rows:
                return dict(target=target, backend=label, op=op, dtype=dtype, value=None,
                            at_bytes=None, measured="no sizes in range", need=need, result="n/a")
            bad = [r for r in rows if not self._ok(r) or r.get(key) is None]
            if bad:
                return dict(target=target, backend=label, op=op, dtype=dtype, value=None,
                            at_bytes=bad[0]["bytes"],
                            measured=f"failed/missing at {fmt_bytes(bad[0]['bytes'])}",
                            need=need, result="MISS")
            worst = min(rows, key=lambda r: r[key]) if better == "high" else \
                max(rows, key=lambda r: r[key])
            v = worst[key]
            ok = v >= need if better == "high" else v <= need
            return dict(target=target, backend=label, op=op, dtype=dtype, value=v,
                        at_bytes=worst["bytes"],
                        measured=f"{'min' if better == 'high' else 'max'} {fmt(v)} "
                                 f"at {fmt_bytes(worst['bytes'])}",
                        need=need, result="PASS" if ok else "MISS")

        rng = f"{fmt_bytes(BUSBW_RANGE[0])}..{fmt_bytes(BUSBW_RANGE[1])}"
        for lb in self.candidates:
            for op, dt in ops_dtypes:
                if op in BUSBW_OPS:
                    res.append(entry(f"busbw >= {BUSBW_SPEEDUP:g}x {self.baseline}, {rng}",
                                     lb, op, dt, self._rows(lb, op, dt, *BUSBW_RANGE),
                                     "busbw_ratio", "high", BUSBW_SPEEDUP, lambda v: f"{v:.3f}x" if v < 1 else f"{v:.2f}x"))
        for lb in self.candidates:
            for op, dt in ops_dtypes:
                res.append(entry(f"latency <= 1/{1 / LATENCY_RATIO:g} of {self.baseline}, "
                                 f"<= {fmt_bytes(LATENCY_MAX_BYTES)}",
                                 lb, op, dt, self._rows(lb, op, dt, 0, LATENCY_MAX_BYTES),
                                 "latency_ratio", "low", LATENCY_RATIO, lambda v: f"{v:.3f}x" if v < 1 else f"{v:.2f}x"))
        for ops, frac, lo in MEMCPY_TARGETS:
            for lb in (self.candidates or [self.baseline]):
                for op, dt in ops_dtypes:
                    if op not in ops:
                        continue
                    rows = [dict(r, memcpy_fraction=(r["busbw_gbps"] / self.memcpy
                                                     if self._ok(r) else None))
                            for r in self._rows(lb, op, dt, lo)]
                    res.append(entry(f"busbw >= {frac:.0%} of 1-core memcpy "
                                     f"({self.memcpy:.2f} GB/s), >= {fmt_bytes(lo)}",
                                     lb, op, dt, rows, "memcpy_fraction", "high", frac,
                                     lambda v: f"{v:.0%}"))
        return res + self.world1_targets()

    def world1_points(self) -> list[dict]:
        """The peer target's data: per op and dtype (those the peer measured), every size in
        PEER_RANGE that rsdp measured, with rsdp@1, the difference and the peer's time."""
        if PEER not in self.peers or "rsdp" not in self.labels:
            return []
        pts = []
        for op, dt in self._ops_dtypes():
            if op not in PEER_OPS or not self._rows(PEER, op, dt):
                continue  # e.g. bfloat16: MPI has no such datatype
            for r in sorted(self._rows("rsdp", op, dt, *PEER_RANGE), key=lambda r: r["bytes"]):
                one = self._index.get((WORLD1, op, dt, r["bytes"]))
                peer = self._index.get((PEER, op, dt, r["bytes"]))
                pt = dict(op=op, dtype=dt, bytes=r["bytes"], rsdp_us=None, world1_us=None,
                          diff_us=None, mpi_us=None, ratio=None)
                if self._ok(r):
                    pt["rsdp_us"] = r["time_us"]
                if one is not None and self._ok(one):
                    pt["world1_us"] = one["time_us"]
                if peer is not None and self._ok(peer):
                    pt["mpi_us"] = peer["time_us"]
                if pt["rsdp_us"] is not None and pt["world1_us"] is not None:
                    pt["diff_us"] = pt["rsdp_us"] - pt["world1_us"]
                    if pt["mpi_us"]:
                        pt["ratio"] = pt["diff_us"] / pt["mpi_us"]
                pts.append(pt)
        return pts

    def world1_targets(self) -> list[dict]:
        """PASS when, at every size in PEER_RANGE, (rsdp - rsdp@1) / mpi <= 1."""
        if PEER not in self.peers:
            return []
        target = (f"rsdp - {WORLD1} <= {PEER}, "
                  f"{fmt_bytes(PEER_RANGE[0])}..{fmt_bytes(PEER_RANGE[1])}")
        pts = self.world1_points()
        if "rsdp" not in self.labels:
            return [dict(target=target, backend="rsdp", op="-", dtype="-", value=None,
                         at_bytes=None, measured="rsdp not measured", need=1.0, result="n/a")]
        res = []
        groups: dict[tuple, list[dict]] = {}
        for pt in pts:
            groups.setdefault((pt["op"], pt["dtype"]), []).append(pt)
        for op, dt in self._ops_dtypes():
            if op not in PEER_OPS or not self._rows(PEER, op, dt):
                continue
            g = groups.get((op, dt), [])
            e = dict(target=target, backend="rsdp", op=op, dtype=dt, value=None,
                     at_bytes=None, need=1.0)
            bad = [pt for pt in g if pt["ratio"] is None]
            if not g:
                e.update(measured="no sizes in range", result="n/a")
            elif bad:
                e.update(at_bytes=bad[0]["bytes"], result="MISS",
                         measured=f"failed/missing at {fmt_bytes(bad[0]['bytes'])}")
            else:
                w = max(g, key=lambda pt: pt["ratio"])
                e.update(value=w["ratio"], at_bytes=w["bytes"],
                         result="PASS" if w["ratio"] <= 1.0 else "MISS",
                         measured=f"max {w['ratio']:.2f}x at {fmt_bytes(w['bytes'])}: "
                                  f"{fmt_num(w['rsdp_us'], 1)} - {fmt_num(w['world1_us'], 1)} = "
                                  f"{fmt_num(w['diff_us'], 1)} µs vs {fmt_num(w['mpi_us'], 1)} µs")
            res.append(e)
        return res

    def world1_markdown(self) -> str:
        pts = self.world1_points()
        if not pts:
            return ""
        out = [f"### rsdp - {WORLD1} vs {PEER}",
               "",
               f"`{WORLD1}` is rsdp on a 1-rank group (the same call, nothing to communicate); "
               f"`rsdp - {WORLD1}` is what the communication adds, compared with {PEER}'s whole "
               f"time. Target: at most 1.00 at every size from {fmt_bytes(PEER_RANGE[0])} to "
               f"{fmt_bytes(PEER_RANGE[1])}."]
        groups: dict[tuple, list[dict]] = {}
        for pt in pts:
            groups.setdefault((pt["op"], pt["dtype"]), []).append(pt)
        for (op, dt), g in groups.items():
            body = [[fmt_bytes(pt["bytes"]), fmt_num(pt["rsdp_us"], 1),
                     fmt_num(pt["world1_us"], 1),
                     "-" if pt["diff_us"] is None else f"{pt['diff_us']:.1f}",
                     fmt_num(pt["mpi_us"], 1),
                     "-" if pt["ratio"] is None else f"{pt['ratio']:.2f}"] for pt in g]
            out += ["", f"#### {op}, {dt}", "",
                    md_table(["bytes", "rsdp µs", f"{WORLD1} µs", f"rsdp − {WORLD1}",
                              f"{PEER} µs", f"(rsdp − {WORLD1})/{PEER}"], body, "lrrrrr")]
        return "\n".join(out)

    def targets_markdown(self) -> str:
        out = ["## Targets"]
        if self.n != 2:
            out.append(f"\nThe targets are stated for 2 ranks; this run has {self.n}, "
                       "so the verdicts below are for information only.")
        if not self.candidates:
            out.append(f"\nOnly one backend ({self.baseline}) was measured: the ratio targets "
                       "need a candidate and a baseline (e.g. --backends rsdp,gloo).")
        rows = [[t["target"], t["backend"], t["op"], t["dtype"], t["measured"], t["result"]]
                for t in self.targets()]
        if rows:
            out += ["", md_table(["target", "backend", "op", "dtype", "measured", "result"],
                                 rows, "llllll")]
            n_pass = sum(t["result"] == "PASS" for t in self.targets())
            out.append(f"\n{n_pass} of {len(rows)} PASS.")
        world1 = self.world1_markdown()
        if world1:
            out += ["", world1]
        return "\n".join(out)

    # ------------------------------------------------------------------ json

    def to_json(self) -> dict:
        out = {"machine": self.info, "config": self.config, "rows": self.rows,
               "targets": self.targets()}
        if self.cuda:
            out["physical_limit"] = self.physical_limit()
        if self.peers:
            out["world1_vs_peer"] = self.world1_points()
        return out

    # ------------------------------------------------------------------ plots

    def plots(self, out_dir: str) -> list[str]:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

        colors = plt.get_cmap("tab10").colors
        styles = ["-", "--", ":", "-."]
        written = []
        for op in self.config["ops"]:
            have_ratio = bool(self.candidates)
            fig, axes = plt.subplots(
                2 if have_ratio else 1, 1, sharex=True, figsize=(8, 6.5 if have_ratio else 4.8),
                gridspec_kw={"height_ratios": [3, 1.4]} if have_ratio else None, squeeze=False)
            ax = axes[0][0]
            all_bytes = set()
            for i, lb in enumerate(self.labels + self.peers):
                for j, dt in enumerate(self.config["dtypes"]):
                    rows = sorted((r for r in self._rows(lb, op, dt) if self._ok(r)),
                                  key=lambda r: r["bytes"])
                    if not rows:
                        continue
                    xs = [r["bytes"] for r in rows]
                    all_bytes.update(xs)
                    name = f"{lb} {dt}" + (" (baseline)" if lb == self.baseline else "")
                    ax.plot(xs, [r["busbw_gbps"] for r in rows], styles[j % len(styles)],
                            color=colors[i % len(colors)], marker="o", markersize=3,
                            linewidth=1.6, label=name)
                    if have_ratio and lb in self.candidates:
                        pts = [(r["bytes"], r["busbw_ratio"]) for r in rows
                               if r.get("busbw_ratio")]
                        if pts:
                            axes[1][0].plot(*zip(*pts), styles[j % len(styles)],
                                            color=colors[i % len(colors)], marker="o",
                                            markersize=3, linewidth=1.6, label=f"{lb} {dt}")
            ref_bw, ref_text = self.memcpy, f"single-core memcpy {self.memcpy:.1f} GB/s"
            if self.cuda and self.copy:
                ref_bw, ref_text = self.copy, f"device copy {self.copy:.0f} GB/s (read + written)"
            ax.axhline(ref_bw, color="gray", linestyle=(0, (2, 2)), linewidth=1)
            ax.text(max(all_bytes) if all_bytes else 1, ref_bw * 1.12,
                    ref_text, color="gray", fontsize=8,
                    ha="right", va="bottom")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            lo_y, hi_y = ax.get_ylim()
            ax.set_ylim(lo_y, max(hi_y, ref_bw * 2.5))
            ax.set_ylabel("busbw (GB/s)")
            ax.set_title(f"{op}: bus bandwidth vs message size "
                         f"({self.n} ranks, factor {BUSBW_FACTOR_TEXT[op]})"
                         + (", CUDA tensors" if self.cuda else ""))
            ax.grid(True, which="major", alpha=0.35)
            ax.grid(True, which="minor", axis="y", alpha=0.12)
            ax.legend(fontsize=8, loc="upper left")
            bottom = axes[-1][0]
            if have_ratio:
                rax = axes[1][0]
                rax.axhline(1.0, color="black", linewidth=0.8)
                if op in BUSBW_OPS:
                    rax.axhline(BUSBW_SPEEDUP, color="tab:red", linestyle="--", linewidth=0.9)
                    rax.text(min(all_bytes) if all_bytes else 1, BUSBW_SPEEDUP * 1.1,
                             f"target {BUSBW_SPEEDUP:g}x", color="tab:red", fontsize=8)
                rax.set_yscale("log")
                lo_r, hi_r = rax.get_ylim()
                lo_r, hi_r = min(lo_r, 0.5), max(hi_r, BUSBW_SPEEDUP * 1.6)
                rax.set_ylim(lo_r, hi_r)
                nice = [v * 10.0 ** e for e in range(-3, 4) for v in (1, 2, 5)]
                rax.yaxis.set_major_locator(FixedLocator([v for v in nice if lo_r <= v <= hi_r]))
                rax.yaxis.set_minor_locator(NullLocator())
                rax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
                rax.set_ylabel(f"busbw / {self.baseline}")
                rax.grid(True, which="major", alpha=0.35)
            if all_bytes:
                lo = int(math.log2(min(all_bytes)))
                hi = int(math.ceil(math.log2(max(all_bytes))))
                ticks = [2 ** k for k in range(lo, hi + 1) if (k - lo) % 2 == 0 or hi - lo < 12]
                bottom.xaxis.set_major_locator(FixedLocator(ticks))
                bottom.xaxis.set_minor_locator(NullLocator())
                bottom.set_xticklabels([fmt_bytes(t).replace(" ", "") for t in ticks],
                                       rotation=45, fontsize=8)
            bottom.set_xlabel("message size (bytes of the full buffer)")
            fig.tight_layout()
            name = f"busbw_{op}.png"
            fig.savefig(os.path.join(out_dir, name), dpi=110)
            plt.close(fig)
            written.append(name)
        return written
