"""RSDP, FSDP2 and DDP (and torch_rsdp.plan's strategies) training the same TransformerLM in
fresh ranks, each run `strategy:backend`: tokens/s, parameter-related memory
(training_models.ParamMemoryTracker), peak RSS or CUDA memory, last loss. A failing run is
reported and the others go on. See docs/benchmarks.md, training.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import common
from . import training_models as tm
from .common import RESULTS, write_result

SEED_CONFIG = dict(vocab=10240, d_model=2048, ffn=2048, heads=32, layers=10, seq=32, batch=32)
SMALL_CONFIG = dict(vocab=2048, d_model=256, ffn=512, heads=4, layers=4, seq=32, batch=8)
DEFAULT_RUNS = "rsdp:rsdp,fsdp2:rsdp,fsdp2:gloo,ddp:rsdp,ddp:gloo"
DEFAULT_RUNS_CUDA = "rsdp:rsdp,fsdp2:rsdp,fsdp2:nccl,ddp:rsdp,ddp:nccl"
SINGLE_GPU_RUNS = "rsdp:rsdp,fsdp2:rsdp,ddp:rsdp,plain"
PLAIN = "plain"  # the unwrapped model in one process (no backend)
NO_BACKEND = "-"
TARGETS = {"mem_vs_fsdp2": 0.5, "mem_vs_ddp": 0.3, "tps_vs_fsdp2": 0.8}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="preset for a 2-core machine: " + ", ".join(
                       f"{k} {v}" for k, v in SMALL_CONFIG.items()))
    for k, default in SEED_CONFIG.items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=None,
                       help=f"default {default} (seed), {SMALL_CONFIG[k]} with --small"
                            + ("; sequences per rank per step" if k == "batch" else ""))
    p.add_argument("--runs", default=None,
                   help=f"comma-separated strategy:backend (strategies rsdp, fsdp2, ddp; and "
                        f"'plain', the unwrapped model in one process). Default {DEFAULT_RUNS}; "
                        f"with --device cuda {DEFAULT_RUNS_CUDA} (nccl runs left out when ranks "
                        f"share a GPU); with --single-gpu {SINGLE_GPU_RUNS}")
    p.add_argument("--plan", action="append", default=[], metavar="SPEC",
                   help="add a run of torch_rsdp.plan over the rsdp backend: a strategy name "
                        "(no_shard, shard_optim, full_shard, shard_grad_op, hybrid_shard, rotate, "
                        "split:k; one unit per block) or a plan JSON file; repeatable")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: rank r on GPU r %% device count; memory = "
                        "torch.cuda.max_memory_allocated()")
    p.add_argument("--single-gpu", action="store_true",
                   help="--device cuda with every rank on the first GPU, plus the 'plain' run "
                        "(one process, whole global batch) to compare RSDP's step time with")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=8, help="timed steps")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat all runs, alternating, and report each run's median step time "
                        "over rounds (use 2-3 on a busy machine)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory-tracked step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default cores // world size)")
    p.add_argument("--timeout", type=int, default=600, help="process-group timeout, seconds")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--name", default=None, help="file name stem (default small / seed / custom)")
    args = p.parse_args(argv)
    base = SMALL_CONFIG if args.small else SEED_CONFIG
    custom = any(getattr(args, k) not in (None, base[k]) for k in SEED_CONFIG)
    for k in SEED_CONFIG:
        setattr(args, k, base[k] if getattr(args, k) is None else getattr(args, k))
    args.name = args.name or ("custom" if custom else ("small" if args.small else "seed"))
    args.threads = args.threads or tm.default_threads(args.world_size)
    if args.single_gpu:
        args.device = "cuda"
    args.notes = []
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error(f"--device cuda: no CUDA device (torch {torch.__version__}, "
                    f"CUDA {torch.version.cuda})")
        if args.runs is None:
            args.runs = SINGLE_GPU_RUNS if args.single_gpu else DEFAULT_RUNS_CUDA
            if ranks_share_gpu(args):
                kept = [r for r in args.runs.split(",") if not r.endswith(":nccl")]
                if len(kept) < len(args.runs.split(",")):
                    args.notes.append(
                        f"nccl runs left out: {args.world_size} ranks on {gpus_used(args)} GPU(s) "
                        f"share a GPU, which NCCL refuses; the FSDP2/DDP baselines run over rsdp")
                args.runs = ",".join(kept)
    elif args.runs is None:
        args.runs = DEFAULT_RUNS
    runs = []
    for item in filter(None, (t.strip() for t in args.runs.split(","))):
        strategy, _, backend = item.partition(":")
        if strategy not in (PLAIN, *tm.STRATEGIES):
            p.error(f"unknown strategy {strategy!r} in --runs")
        runs.append((PLAIN, NO_BACKEND) if strategy == PLAIN else (strategy, backend or "rsdp"))
    for spec in args.plan:
        try:
            tm.load_plan(spec)
        except (OSError, ValueError) as e:
            p.error(f"--plan {spec}: {e}")
        runs.append((f"plan={spec}", "rsdp"))
    if not runs:
        p.error("--runs is empty")
    args.runs = runs
    return args


def gpus_used(args) -> int:
    return 1 if args.single_gpu else torch.cuda.device_count()


def ranks_share_gpu(args) -> bool:
    return args.device == "cuda" and args.world_size > gpus_used(args)


def model_config(args) -> dict:
    return {k: getattr(args, k) for k in SEED_CONFIG}


# --------------------------------------------------------------------------------- one rank


def global_batch(step: int, args):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    return torch.randint(0, args.vocab, (args.world_size * args.batch, args.seq + 1), generator=g)


def train_step(model, opt, step, rank, args, rows=None, device=None):
    """rows: sequences this process takes from the global batch (default --batch); device:
    where to move them (default: stay on the CPU)."""
    rows = rows or args.batch
    toks = global_batch(step, args)[rank * rows:(rank + 1) * rows]
    if device is not None:
        toks = toks.to(device)
    opt.zero_grad(set_to_none=True)
    loss = tm.lm_loss(model(toks[:, :-1]), toks[:, 1:])
    loss.backward()
    opt.step()
    return loss.item()


def worker(rank: int, args, strategy: str, backend: str, port: int, out_dir: str):
    try:
        _worker(rank, args, strategy, backend, port, out_dir)
    except BaseException as exc:  # noqa: BLE001
        with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        raise


def _worker(rank, args, strategy, backend, port, out_dir):
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")  # FSDP2, harmless here
    cuda = args.device == "cuda"
    single = strategy == PLAIN  # one process, no process group, the whole global batch
    if cuda:  # before any other CUDA call and before init_process_group
        torch.cuda.set_device(rank % gpus_used(args))
    torch.set_num_threads(args.threads)
    tm.tune_for_oversubscription(args.world_size)
    if not single:
        if backend == "rsdp":
            import torch_rsdp  # noqa: F401
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.world_size,
                                timeout=datetime.timedelta(seconds=args.timeout))
    W = 1 if single else args.world_size
    rows = args.world_size * args.batch // W
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    mine = {"rss_reset": tm.reset_peak_rss(), "rss_base": tm.proc_status_kib("VmRSS") * 1024}
    torch.manual_seed(args.seed)
    model = tm.TransformerLM(args.vocab, args.d_model, args.ffn, args.heads, args.layers,
                             args.seq)
    n_params = tm.count_params(model)
    if cuda:
        model = model.to(dev)  # built on the CPU: the same weights on every device
    t0 = time.perf_counter()
    if not single:
        model = tm.wrap(model, strategy, dev)
    mine["wrap_s"] = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        mine["cuda_wrap"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the peak of training, not of building/sharding
    opt = tm.make_optimizer(model, args.lr)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(train_step(model, opt, step, rank, args, rows, dev if cuda else None))
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if cuda:
        mine["cuda_peak"] = torch.cuda.max_memory_allocated()
    mine.update(mem=float("nan"), bd=dict.fromkeys(tm.ParamMemoryTracker.CATS, 0), samples=0)
    if not args.no_memory:
        if not single:
            dist.barrier()
        tracker = tm.ParamMemoryTracker(model, opt)
        with tracker:
            train_step(model, opt, args.warmup + args.steps, rank, args, rows,
                       dev if cuda else None)
        mine.update(mem=tracker.peak, bd=tracker.peak_breakdown, samples=tracker.samples)
    mine.update(step=tm.median(times), rss_peak=tm.proc_status_kib("VmHWM") * 1024,
                loss=losses[-1])
    every = [mine] * W
    if not single:
        dist.all_gather_object(every, mine)
    if rank == 0:
        col = lambda k: [r[k] for r in every]  # noqa: E731
        step_s, peak = max(col("step")), max(every, key=lambda r: r["mem"])
        tokens = args.world_size * args.batch * args.seq  # the global batch, for every run
        res = {
            "strategy": strategy, "backend": backend, "world_size": W, "params": n_params,
            "tokens_per_step": tokens, "timed_steps": len(times),
            "step_s_median_per_rank": col("step"), "step_s": step_s,
            "tokens_per_s": tokens / step_s, "mem_peak_bytes": peak["mem"],
            "mem_breakdown_bytes": peak["bd"], "mem_peak_bytes_per_rank": col("mem"),
            "rss_peak_bytes": max(col("rss_peak")), "rss_peak_bytes_per_rank": col("rss_peak"),
            "rss_base_bytes": max(col("rss_base")),
            "rss_growth_bytes": max(r["rss_peak"] - r["rss_base"] for r in every),
            "rss_peak_reset": mine["rss_reset"], "final_loss": sum(col("loss")) / W,
            "losses_rank0": losses, "wrap_s": max(col("wrap_s")),
            "mem_samples": every[0]["samples"], "threads_per_rank": args.threads,
        }
        if cuda:
            res.update(device="cuda", gpu=torch.cuda.get_device_name(dev),
                       cuda_peak_bytes=max(col("cuda_peak")),
                       cuda_peak_bytes_per_rank=col("cuda_peak"),
                       cuda_after_wrap_bytes=max(col("cuda_wrap")))
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(res, f)
    if not single:
        dist.barrier()
        dist.destroy_process_group()


# --------------------------------------------------------------------------------- driver


def run_one(args, strategy, backend) -> dict:
    single = strategy == PLAIN
    label = PLAIN if single else f"{strategy}:{backend}"
    why = None
    if "rsdp" in (strategy, backend):
        try:
            import torch_rsdp
            if args.device == "cuda" and not torch_rsdp.cuda_available():
                why = "rsdp: not available: torch_rsdp was built without CUDA"
        except Exception as exc:  # noqa: BLE001
            why = f"rsdp: not available: {type(exc).__name__}: {exc}"
    elif backend not in ("gloo", "nccl", "mpi", NO_BACKEND):
        why = f"unknown backend {backend!r}"
    if why is None and backend == "nccl" and ranks_share_gpu(args):
        why = (f"NCCL refuses several ranks on one GPU ({args.world_size} ranks on "
               f"{gpus_used(args)} GPU(s)); use the rsdp backend")
    if why is not None:
        print(f"=== {label}: skipped: {why}", flush=True)
        return {"strategy": strategy, "backend": backend, "error": why}
    nprocs = 1 if single else args.world_size
    if single:
        print(f"=== {label}: 1 process, the whole global batch, {args.threads} thread(s) ...",
              flush=True)
    else:
        print(f"=== {label}: {args.world_size} ranks, {args.threads} thread(s)/rank ...",
              flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.start_processes(worker, args=(args, strategy, backend, tm.free_port(), tmp),
                               nprocs=nprocs, start_method="spawn")
            with open(os.path.join(tmp, "result.json")) as f:
                res = json.load(f)
        except Exception as exc:  # noqa: BLE001
            errs = sorted(n for n in os.listdir(tmp) if n.startswith("error"))
            msg = (open(os.path.join(tmp, errs[0])).read() if errs
                   else f"{type(exc).__name__}: {exc}")
            first = msg.strip().splitlines()[0] if msg.strip() else repr(exc)
            if strategy == "rsdp" and not first.startswith("rsdp:"):
                first = f"rsdp: not available: {first}"
            print(f"=== {label}: FAILED: {first}", flush=True)
            print("    " + msg.strip().replace("\n", "\n    ")[-3000:], flush=True)
            return {"strategy": strategy, "backend": backend, "error": first}
    res["wall_s"] = time.perf_counter() - t0
    mem = (f"peak CUDA mem {tm.fmt_bytes(res['cuda_peak_bytes'])}" if "cuda_peak_bytes" in res
           else f"peak RSS {tm.fmt_bytes(res['rss_peak_bytes'])}")
    print(f"=== {label}: {res['tokens_per_s']:,.0f} tokens/s, step {res['step_s'] * 1e3:.1f} ms, "
          f"param mem {tm.fmt_bytes(res['mem_peak_bytes'])}, {mem}, loss {res['final_loss']:.4f} "
          f"({res['wall_s']:.0f} s)", flush=True)
    return res


def evaluate_targets(results: list) -> list:
    ok = {(r["strategy"], r["backend"]): r for r in results if "error" not in r}
    rs = ok.get(("rsdp", "rsdp"))
    out = []

    def first(strategy, prefer="rsdp"):
        cands = [r for (s, b), r in ok.items() if s == strategy]
        cands.sort(key=lambda r: r["backend"] != prefer)
        return cands[0] if cands else None

    specs = [("RSDP peak param memory <= 0.5x FSDP2", "mem_vs_fsdp2", first("fsdp2"),
              "mem_peak_bytes", True),
             ("RSDP peak param memory <= 0.3x DDP", "mem_vs_ddp", first("ddp"),
              "mem_peak_bytes", True),
             ("RSDP tokens/s >= 0.8x FSDP2 (same backend)", "tps_vs_fsdp2",
              ok.get(("fsdp2", "rsdp")), "tokens_per_s", False)]
    for text, key, other, field, lower in specs:
        limit = TARGETS[key]
        if rs is None or other is None or not (rs[field] == rs[field]) or not other[field]:
            out.append({"target": text, "key": key, "limit": limit, "ratio": None,
                        "status": "n/a", "against": None})
            continue
        ratio = rs[field] / other[field]
        status = "PASS" if (ratio <= limit if lower else ratio >= limit) else "MISS"
        out.append({"target": text, "key": key, "limit": limit, "ratio": ratio, "status": status,
                    "against": f"{other['strategy']}:{other['backend']}"})
    return out


LABELS = {"rsdp": "RSDP", "fsdp2": "FSDP2", "ddp": "DDP", PLAIN: "plain (1 process)"}
CUDA_MEM_METHOD = ("peak CUDA mem/rank = torch.cuda.max_memory_allocated() over the warm-up and "
                   "timed steps, the peak reset after wrapping, max over ranks: everything "
                   "PyTorch's caching allocator handed out (parameters, gradients, optimizer "
                   "state, activations, FSDP2/DDP buffers), not buffers a backend allocates "
                   "itself (NCCL's, rsdp's staging). CUDA mem after wrap = memory_allocated() "
                   "right after wrapping.")


def render(args, results, targets, meta) -> str:
    cuda = args.device == "cuda"
    mem_cols = (["peak CUDA mem/rank", "CUDA mem after wrap"] if cuda
                else ["peak RSS/rank", "RSS growth"])
    hdr = ["strategy", "backend", "tokens/s", "step ms", "param mem/rank", "params", "grads",
           "optim", "buffers", *mem_cols, "final loss"]
    rows = []
    for r in results:
        label = LABELS.get(r["strategy"], r["strategy"])
        if "error" in r:
            err = r["error"] if r["error"].startswith("rsdp:") else "not available: " + r["error"]
            rows.append([label, r["backend"], err[:100]] + ["-"] * 9)
            continue
        bd = r["mem_breakdown_bytes"]
        mem = ([tm.fmt_bytes(r["cuda_peak_bytes"]), tm.fmt_bytes(r["cuda_after_wrap_bytes"])]
               if cuda else
               [tm.fmt_bytes(r["rss_peak_bytes"]), tm.fmt_bytes(r["rss_growth_bytes"])])
        rows.append([label, r["backend"], f"{r['tokens_per_s']:,.0f}", f"{r['step_s'] * 1e3:.1f}",
                     tm.fmt_bytes(r["mem_peak_bytes"]), *(tm.fmt_bytes(bd[c]) for c in
                                                          tm.ParamMemoryTracker.CATS),
                     *mem, f"{r['final_loss']:.4f}"])
    cfg = model_config(args)
    where = (f"{args.world_size} ranks x {args.threads} thread(s) on {meta['cpus']} CPU(s)"
             if not cuda else
             f"{args.world_size} ranks on {meta['gpus_used']} x {meta['gpu']} "
             f"({meta['ranks_per_gpu']} rank(s) per GPU), {args.threads} thread(s) per rank")
    lines = [f"## Training benchmark ({args.name}): RSDP vs FSDP2 vs DDP", "",
             f"Model: TransformerLM vocab {cfg['vocab']}, d_model {cfg['d_model']}, ffn "
             f"{cfg['ffn']}, heads {cfg['heads']}, layers {cfg['layers']}, seq {cfg['seq']}, "
             f"batch {cfg['batch']}/rank; {meta['params'] / 1e6:.2f} M parameters "
             f"({tm.fmt_bytes(meta['params'] * 4)} float32); Adam; {where}; {args.warmup} warm-up + "
             f"{args.steps} timed steps x {args.rounds} round(s); {meta['rsdp_env']}; "
             f"torch {torch.__version__}; "
             f"load average before/after: "
             f"{meta['load_before']} / {meta['load_after']}.", "",
             tm.md_table(hdr, rows), "",
             "tokens/s = global tokens per step / (median step time, slowest rank). "
             "param mem/rank = " + tm.METHOD]
    if cuda:
        lines += ["", CUDA_MEM_METHOD]
    for note in getattr(args, "notes", []):
        lines += ["", f"Note: {note}."]
    lines += ["", "Targets:", ""]
    for t in targets:
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(f"- {t['status']}: {t['target']} (ratio {ratio}"
                     + (f" vs {t['against']})" if t["against"] else ")"))
    ok = {r["strategy"]: r for r in results if "error" not in r and r["backend"] in ("rsdp", NO_BACKEND)}
    if "rsdp" in ok and PLAIN in ok:
        lines += ["", f"RSDP over {args.world_size} ranks vs the plain model in one process "
                      f"(same global batch): tokens/s ratio "
                      f"{ok['rsdp']['tokens_per_s'] / ok[PLAIN]['tokens_per_s']:.2f}, "
                      f"step time {ok['rsdp']['step_s'] * 1e3:.1f} vs "
                      f"{ok[PLAIN]['step_s'] * 1e3:.1f} ms."]
    return "\n".join(lines) + "\n"


def plot(path, results, title) -> bool:
    ok = [r for r in results if "error" not in r]
    if not ok:
        return False
    labels = [f"{r['strategy']}\n{r['backend']}" for r in ok]
    cuda = all("cuda_peak_bytes" in r for r in ok)
    peak, after = (("cuda_peak_bytes", "cuda_after_wrap_bytes") if cuda
                   else ("rss_peak_bytes", "rss_growth_bytes"))
    return bool(common.plot(path, [
        dict(title="throughput (median step, slowest rank)", ylabel="tokens/s",
             bars=[("tokens/s", labels, [r["tokens_per_s"] for r in ok])]),
        dict(title="peak parameter-related memory", ylabel="MiB per rank",
             bars=[(c, labels, [r["mem_breakdown_bytes"][c] / 2**20 for r in ok])
                   for c in tm.ParamMemoryTracker.CATS]),
        dict(title="peak CUDA memory" if cuda else "peak RSS (VmHWM)", ylabel="MiB per rank",
             bars=[("after wrapping" if cuda else "growth during training", labels,
                    [r[after] / 2**20 for r in ok]),
                   ("rest of the peak", labels, [(r[peak] - r[after]) / 2**20 for r in ok])]),
    ], title=title))


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = model_config(args)
    with torch.device("meta"):  # count parameters without allocating them
        probe = tm.TransformerLM(cfg["vocab"], cfg["d_model"], cfg["ffn"], cfg["heads"],
                                 cfg["layers"], cfg["seq"])
    # the machine, commit and date: write_result's provenance
    meta = {"params": tm.count_params(probe), "cpus": os.cpu_count(),
            "load_before": tm.load_average(),
            "rsdp_env": tm.tune_for_oversubscription(args.world_size)}
    if args.device == "cuda":
        meta.update(gpu=torch.cuda.get_device_name(0), gpus_used=gpus_used(args),
                    ranks_per_gpu=-(-args.world_size // gpus_used(args)))
    del probe
    print(f"TransformerLM {cfg}, {meta['params'] / 1e6:.2f} M params; runs: "
          + ", ".join(f"{s}:{b}" for s, b in args.runs) + f"; load average {meta['load_before']}",
          flush=True)
    for note in args.notes:
        print(f"note: {note}", flush=True)
    t0 = time.perf_counter()
    rounds = [[run_one(args, s, b) for s, b in args.runs] for _ in range(max(1, args.rounds))]
    results = []
    for i in range(len(args.runs)):  # merge rounds: median step time, first round's memory
        ok = [rd[i] for rd in rounds if "error" not in rd[i]]
        if not ok:
            results.append(rounds[0][i])
            continue
        r = dict(ok[0])
        r["step_s_rounds"] = [x["step_s"] for x in ok]
        r["step_s"] = tm.median(r["step_s_rounds"])
        r["tokens_per_s"] = r["tokens_per_step"] / r["step_s"]
        r["rss_peak_bytes"] = max(x["rss_peak_bytes"] for x in ok)
        r["rss_growth_bytes"] = max(x["rss_growth_bytes"] for x in ok)
        results.append(r)
    meta["load_after"] = tm.load_average()
    meta["wall_s"] = time.perf_counter() - t0
    targets = evaluate_targets(results)
    text = render(args, results, targets, meta)
    print("\n" + text)
    stem = os.path.join(args.out, f"training_{args.name}")
    write_result(args.out, f"training_{args.name}", {
        "config": cfg, "args": {k: v for k, v in vars(args).items() if k != "runs"},
        "runs": [f"{s}:{b}" for s, b in args.runs], "meta": meta,
        "memory_method": tm.METHOD, "results": results, "targets": targets}, text, argv)
    plotted = plot(stem + ".png", results,
                   f"TransformerLM {args.name}: {meta['params'] / 1e6:.1f} M "
                   f"params, {args.world_size} ranks (load {meta['load_before']})")
    print((f"# wrote {stem}.png; " if plotted else "# ") + f"took {meta['wall_s']:.0f} s")
    return 0 if any("error" not in r for r in results) else 1
