#!/usr/bin/env python3
"""Run examples/train_ddp.py once per backend (same seed, same data) and compare.

    python examples/compare_ddp.py                           # rsdp vs gloo (gloo alone if rsdp is missing)
    python examples/compare_ddp.py --backends rsdp,gloo --nproc 4 --steps 100
    python examples/compare_ddp.py --backends gloo,gloo      # dry run: gloo against itself
    python examples/compare_ddp.py --launcher torchrun -- --batch-size 16   # args after -- go to train_ddp

The last backend is the baseline. The table shows steps/s, tokens/s, the time per step and its
split, the speedup over the baseline, the final loss, and the largest absolute difference
between the final parameters and the baseline's ("identical" when bitwise equal). Different
reduction orders change the last bits of the gradients and Adam amplifies them (gloo against
rsdp: ~1e-6 after 1 step, ~5e-4 after 100), so small differences are expected from a correct
backend; --atol sets what counts as a match. Exit code 1 when a run fails, the parameters do
not match, or they differ between the ranks of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train_ddp.py")
# train_ddp (beside this file) owns backend loading and the checkout fallback.
sys.path.insert(0, HERE)
from train_ddp import BUILTIN_BACKENDS, load_backend  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backends", default=None,
                   help="comma-separated; the last is the baseline (default rsdp,gloo, or just "
                        "gloo when torch_rsdp is not importable)")
    p.add_argument("--nproc", type=int, default=4, help="ranks per run")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launcher", choices=("spawn", "torchrun"), default="spawn",
                   help="spawn: train_ddp.py --nproc N; torchrun: python -m torch.distributed.run")
    p.add_argument("--atol", type=float, default=5e-3,
                   help="max |param - baseline param| that still counts as a match. A correct "
                        "backend that sums in another order differs by ~1e-6 after one step; "
                        "Adam amplifies that to ~5e-4 after 100 steps. A broken reduction "
                        "differs by about lr (3e-3) per step")
    p.add_argument("--quiet", action="store_true", help="do not echo the training logs")
    p.add_argument("--json-out", default=None, help="write the comparison as JSON here")
    args, extra = p.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if args.backends is None:
        try:
            load_backend("rsdp")
            args.backends = "rsdp,gloo"
        except Exception as exc:  # noqa: BLE001
            print(f"note: torch_rsdp is not importable ({type(exc).__name__}: {exc}); "
                  f"running gloo only. Pass --backends to choose.", file=sys.stderr)
            args.backends = "gloo"
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not args.backends:
        p.error("--backends is empty")
    if args.nproc < 1 or args.steps < 1:
        p.error("--nproc and --steps must be >= 1")
    for b in args.backends:
        if b not in BUILTIN_BACKENDS:
            try:
                load_backend(b)
            except Exception as exc:  # noqa: BLE001
                p.error(f"backend {b!r}: cannot import torch_{b} ({exc})")
    return args, extra


def labels_for(backends):
    seen, out = {}, []
    for b in backends:
        seen[b] = seen.get(b, 0) + 1
        out.append(b if seen[b] == 1 else f"{b}#{seen[b]}")
    return out


def run_one(backend, label, args, extra, tmp) -> dict | None:
    json_out = os.path.join(tmp, f"{label}.json")
    params = os.path.join(tmp, f"{label}.pt")
    common = [TRAIN, "--backend", backend, "--steps", str(args.steps), "--seed", str(args.seed),
              "--json-out", json_out, "--save-params", params, *extra]
    if args.launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(args.nproc), *common]
    else:
        cmd = [sys.executable, *common, "--nproc", str(args.nproc)]
    print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        if not args.quiet:
            print(f"[{label}] {line}", end="", flush=True)
    rc = proc.wait()
    if rc != 0 or not os.path.exists(json_out):
        if args.quiet:
            sys.stdout.writelines(f"[{label}] {line}" for line in tail)
        print(f"=== {label}: FAILED (exit code {rc})", flush=True)
        return None
    with open(json_out) as f:
        result = json.load(f)
    result["state_dict"] = torch.load(params, weights_only=True)
    return result


def max_abs_diff(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        return float("inf")
    return max((x.double() - y.double()).abs().max().item() if x.numel() else 0.0
               for x, y in ((a[k], b[k]) for k in a))


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                      for i, (c, w) in enumerate(zip(r, widths))) + " |"
    sep = "|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([fmt(header), sep] + [fmt(r) for r in rows])


def main(argv=None) -> int:
    args, extra = parse_args(argv)
    labels = labels_for(args.backends)
    base_label = labels[-1]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend, label in zip(args.backends, labels):
            results[label] = run_one(backend, label, args, extra, tmp)

    base = results.get(base_label)
    header = ["backend", "steps/s", "tokens/s", "ms/step", "fwd / bwd+allreduce / opt ms",
              f"speedup vs {base_label}", "final loss", f"max abs Δparam vs {base_label}", "params"]
    rows, summary, ok = [], [], True
    for label in labels:
        r = results[label]
        if r is None:
            rows.append([label, "-", "-", "-", "-", "-", "-", "-", "RUN FAILED"])
            summary.append({"backend": label, "failed": True})
            ok = False
            continue
        speedup = diff = None
        verdict = "-"
        if base is not None:
            speedup = r["steps_per_s"] / base["steps_per_s"]
            diff = max_abs_diff(r["state_dict"], base["state_dict"])
            if label == base_label:
                verdict = "baseline"
            elif diff == 0.0:
                verdict = "identical"
            elif diff <= args.atol:
                verdict = f"match (≤ {args.atol:g})"
            else:
                verdict = "DIFFERENT"
                ok = False
        if not r.get("params_equal_on_all_ranks", True):
            verdict += ", ranks differ!"
            ok = False
        rows.append([label, f"{r['steps_per_s']:.2f}", f"{r['tokens_per_s']:,.0f}",
                     f"{r['step_ms_mean']:.1f}",
                     f"{r['forward_ms']:.1f} / {r['backward_allreduce_ms']:.1f} / "
                     f"{r['optimizer_ms']:.1f}",
                     "-" if speedup is None else f"{speedup:.2f}x",
                     f"{r['final_loss']:.4f}",
                     "-" if diff is None else f"{diff:.3g}", verdict])
        summary.append({k: v for k, v in r.items() if k != "state_dict"} |
                       {"label": label, "speedup": speedup, "max_abs_param_diff": diff,
                        "verdict": verdict})

    first = next((r for r in results.values() if r), None)
    print(f"\n## DDP training comparison: {args.nproc} ranks, {args.steps} steps, seed {args.seed}"
          + (f", {first['params'] / 1e6:.2f} M params, {first['tokens_per_step']} tokens/step"
             if first else ""))
    print()
    print(table(header, rows))
    print("\nsteps/s and tokens/s use the mean step time after the warm-up steps; "
          "bwd+allreduce is loss.backward(), during which DDP all-reduces the gradients.")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args) | {"extra": extra}, "runs": summary}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
