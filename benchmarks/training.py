"""RSDP, FSDP2 and DDP (and torch_rsdp.plan's strategies) training the same TransformerLM in
fresh ranks, each run `strategy:backend`: tokens/s, parameter-related memory
(training_models.ParamMemoryTracker), peak RSS or CUDA memory, last loss. A failing run is
reported and the others go on. See docs/benchmarks.md, training.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import torch
import torch.distributed as dist

from . import common
from . import training_models as tm
from .common import RESULTS, fmt_bytes, run_ranks, write_result

SEED_CONFIG = dict(vocab=10240, d_model=2048, ffn=2048, heads=32, layers=10, seq=32, batch=32)
SMALL_CONFIG = dict(vocab=2048, d_model=256, ffn=512, heads=4, layers=4, seq=32, batch=8)
DEFAULT_RUNS = "rsdp:rsdp,fsdp2:rsdp,fsdp2:gloo,ddp:rsdp,ddp:gloo"
DEFAULT_RUNS_CUDA = "rsdp:rsdp,fsdp2:rsdp,fsdp2:nccl,ddp:rsdp,ddp:nccl"
SINGLE_GPU_RUNS = "rsdp:rsdp,fsdp2:rsdp,ddp:rsdp,plain"
PLAIN = "plain"  # the unwrapped model in one process (no backend)
NO_BACKEND = "-"
LR = 1e-4
LABELS = {"rsdp": "RSDP", "fsdp2": "FSDP2", "ddp": "DDP", PLAIN: "plain (1 process)"}
CUDA_MEM_METHOD = ("peak CUDA mem/rank = torch.cuda.max_memory_allocated() over the warm-up and "
                   "timed steps, the peak reset after wrapping, max over ranks: everything "
                   "PyTorch's caching allocator handed out (parameters, gradients, optimizer "
                   "state, activations, FSDP2/DDP buffers), not buffers a backend allocates "
                   "itself (NCCL's, rsdp's staging). CUDA mem after wrap = memory_allocated() "
                   "right after wrapping.")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="preset for a 2-core machine: " + ", ".join(
                       f"{k} {v}" for k, v in SMALL_CONFIG.items()))
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
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--name", default=None, help="file name stem (default small / seed)")
    args = p.parse_args(argv)
    vars(args).update(SMALL_CONFIG if args.small else SEED_CONFIG)
    args.name = args.name or ("small" if args.small else "seed")
    args.threads = tm.default_threads(args.world_size)
    args.device = "cuda" if args.single_gpu else args.device
    args.notes = []
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: no CUDA device (torch {torch.__version__}, "
                f"CUDA {torch.version.cuda})")
    if args.runs is None:
        args.runs = (DEFAULT_RUNS if args.device == "cpu" else
                     SINGLE_GPU_RUNS if args.single_gpu else DEFAULT_RUNS_CUDA)
        if ranks_share_gpu(args) and ":nccl" in args.runs:
            args.notes.append(
                f"nccl runs left out: {args.world_size} ranks on {gpus_used(args)} GPU(s) "
                f"share a GPU, which NCCL refuses; the FSDP2/DDP baselines run over rsdp")
            args.runs = ",".join(r for r in args.runs.split(",") if not r.endswith(":nccl"))
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


def build(args):
    return tm.TransformerLM(args.vocab, args.d_model, args.ffn, args.heads, args.layers,
                            args.seq)


# --------------------------------------------------------------------------------- one rank


def worker(rank, world, args, strategy):
    """One run on this rank (``plain``: one process with the whole global batch); rank 0's
    summary over the ranks."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")  # FSDP2, harmless
    cuda = args.device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rows = args.world_size * args.batch // world
    mine = {"rss_reset": tm.reset_peak_rss(), "rss_base": tm.proc_status_kib("VmRSS") * 1024}
    torch.manual_seed(0)
    model = build(args).to(dev)  # built on the CPU: the same weights on every device
    n_params = tm.count_params(model)
    t0 = time.perf_counter()
    if strategy != PLAIN:
        model = tm.wrap(model, strategy, dev)
    mine["wrap_s"] = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        mine["cuda_wrap"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the peak of training, not of building/sharding
    opt = tm.make_optimizer(model, LR)
    losses = []

    def step(i):
        toks = tm.token_batch(args.vocab, args.world_size * args.batch, args.seq + 1, i)
        toks = toks[rank * rows:(rank + 1) * rows].to(dev)
        loss = tm.lm_loss(model(toks[:, :-1]), toks[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the device
        if cuda:
            torch.cuda.synchronize()

    times = tm.timed_steps(step, args.steps, args.warmup)
    if cuda:
        mine["cuda_peak"] = torch.cuda.max_memory_allocated()
    tracker = tm.ParamMemoryTracker(model, opt)
    dist.barrier()
    with tracker:
        step(args.warmup + args.steps)
    mine.update(mem=tracker.peak, bd=tracker.peak_breakdown, samples=tracker.samples,
                step=tm.median(times), rss_peak=tm.proc_status_kib("VmHWM") * 1024,
                loss=losses[-2])
    every = [None] * world
    dist.all_gather_object(every, mine)
    col = lambda k: [r[k] for r in every]  # noqa: E731
    step_s, peak = max(col("step")), max(every, key=lambda r: r["mem"])
    tokens = args.world_size * args.batch * args.seq  # the global batch, for every run
    res = {
        "world_size": world, "params": n_params, "tokens_per_step": tokens,
        "timed_steps": len(times), "step_s_median_per_rank": col("step"), "step_s": step_s,
        "tokens_per_s": tokens / step_s, "mem_peak_bytes": peak["mem"],
        "mem_breakdown_bytes": peak["bd"], "mem_peak_bytes_per_rank": col("mem"),
        "rss_peak_bytes": max(col("rss_peak")), "rss_peak_bytes_per_rank": col("rss_peak"),
        "rss_base_bytes": max(col("rss_base")),
        "rss_growth_bytes": max(r["rss_peak"] - r["rss_base"] for r in every),
        "rss_peak_reset": mine["rss_reset"], "final_loss": sum(col("loss")) / world,
        "losses_rank0": losses[:-1], "wrap_s": max(col("wrap_s")),
        "mem_samples": every[0]["samples"], "threads_per_rank": args.threads}
    if cuda:
        res.update(device="cuda", gpu=torch.cuda.get_device_name(dev),
                   cuda_peak_bytes=max(col("cuda_peak")),
                   cuda_peak_bytes_per_rank=col("cuda_peak"),
                   cuda_after_wrap_bytes=max(col("cuda_wrap")))
    return res


# --------------------------------------------------------------------------------- driver


def run_one(args, strategy, backend) -> dict:
    single = strategy == PLAIN
    label = PLAIN if single else f"{strategy}:{backend}"
    out = {"strategy": strategy, "backend": backend}
    why = None
    if "rsdp" in (strategy, backend) and args.device == "cuda":
        import torch_rsdp
        if not torch_rsdp.cuda_available():
            why = "rsdp: not available: torch_rsdp was built without CUDA"
    elif backend not in ("rsdp", "gloo", "nccl", "mpi", NO_BACKEND):
        why = f"unknown backend {backend!r}"
    if why is None and backend == "nccl" and ranks_share_gpu(args):
        why = (f"NCCL refuses several ranks on one GPU ({args.world_size} ranks on "
               f"{gpus_used(args)} GPU(s)); use the rsdp backend")
    if why is not None:
        print(f"=== {label}: skipped: {why}", flush=True)
        return dict(out, error=why)
    print(f"=== {label}: " + ("1 process, the whole global batch" if single else
                              f"{args.world_size} ranks") + f", {args.threads} thread(s) ...",
          flush=True)
    t0 = time.perf_counter()
    try:
        res = run_ranks(worker, 1 if single else args.world_size, args, strategy,
                        backend="gloo" if single else backend, threads=args.threads,
                        cuda_devices=gpus_used(args) if args.device == "cuda" else 0)
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        msg = str(exc).strip() or repr(exc)
        first = msg.splitlines()[-1]  # a failed rank's traceback ends with its error
        print(f"=== {label}: FAILED: {first}\n    " + msg.replace("\n", "\n    ")[-3000:],
              flush=True)
        return dict(out, error=first)
    res.update(out, wall_s=time.perf_counter() - t0)
    mem = (f"peak CUDA mem {fmt_bytes(res['cuda_peak_bytes'])}" if "cuda_peak_bytes" in res
           else f"peak RSS {fmt_bytes(res['rss_peak_bytes'])}")
    print(f"=== {label}: {res['tokens_per_s']:,.0f} tokens/s, step {res['step_s'] * 1e3:.1f} ms, "
          f"param mem {fmt_bytes(res['mem_peak_bytes'])}, {mem}, loss {res['final_loss']:.4f} "
          f"({res['wall_s']:.0f} s)", flush=True)
    return res


# (text, key, the strategy compared with (rsdp backend first), field, limit, lower is better)
TARGETS = [("RSDP peak param memory <= 0.5x FSDP2", "mem_vs_fsdp2", "fsdp2", "mem_peak_bytes",
            0.5, True),
           ("RSDP peak param memory <= 0.3x DDP", "mem_vs_ddp", "ddp", "mem_peak_bytes", 0.3,
            True),
           ("RSDP tokens/s >= 0.8x FSDP2 (same backend)", "tps_vs_fsdp2", "fsdp2:rsdp",
            "tokens_per_s", 0.8, False)]


def evaluate_targets(results: list) -> list:
    ok = [r for r in results if "error" not in r]
    rs = next((r for r in ok if (r["strategy"], r["backend"]) == ("rsdp", "rsdp")), None)
    out = []
    for text, key, against, field, limit, lower in TARGETS:
        strategy, _, backend = against.partition(":")
        cands = sorted((r for r in ok if r["strategy"] == strategy
                        and backend in ("", r["backend"])), key=lambda r: r["backend"] != "rsdp")
        other = cands[0] if cands else None
        t = {"target": text, "key": key, "limit": limit, "ratio": None, "status": "n/a",
             "against": None}
        if rs is not None and other is not None and rs[field] == rs[field] and other[field]:
            ratio = rs[field] / other[field]
            t.update(ratio=ratio, against=f"{other['strategy']}:{other['backend']}",
                     status="PASS" if (ratio <= limit if lower else ratio >= limit) else "MISS")
        out.append(t)
    return out


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
        mem = ("cuda_peak_bytes", "cuda_after_wrap_bytes") if cuda else ("rss_peak_bytes",
                                                                         "rss_growth_bytes")
        rows.append([label, r["backend"], f"{r['tokens_per_s']:,.0f}", f"{r['step_s'] * 1e3:.1f}",
                     fmt_bytes(r["mem_peak_bytes"]),
                     *(fmt_bytes(r["mem_breakdown_bytes"][c]) for c in
                       tm.ParamMemoryTracker.CATS),
                     *(fmt_bytes(r[k]) for k in mem), f"{r['final_loss']:.4f}"])
    cfg = model_config(args)
    where = (f"{args.world_size} ranks x {args.threads} thread(s) on {meta['cpus']} CPU(s)"
             if not cuda else
             f"{args.world_size} ranks on {meta['gpus_used']} x {meta['gpu']} "
             f"({meta['ranks_per_gpu']} rank(s) per GPU), {args.threads} thread(s) per rank")
    lines = [f"## Training benchmark ({args.name}): RSDP vs FSDP2 vs DDP", "",
             f"Model: TransformerLM vocab {cfg['vocab']}, d_model {cfg['d_model']}, ffn "
             f"{cfg['ffn']}, heads {cfg['heads']}, layers {cfg['layers']}, seq {cfg['seq']}, "
             f"batch {cfg['batch']}/rank; {meta['params'] / 1e6:.2f} M parameters "
             f"({fmt_bytes(meta['params'] * 4)} float32); Adam; {where}; {args.warmup} warm-up + "
             f"{args.steps} timed steps; {meta['rsdp_env']}; "
             f"torch {torch.__version__}; load average before/after: "
             f"{meta['load_before']} / {meta['load_after']}.", "",
             tm.md_table(hdr, rows), "",
             "tokens/s = global tokens per step / (median step time, slowest rank). "
             "param mem/rank = " + tm.METHOD]
    if cuda:
        lines += ["", CUDA_MEM_METHOD]
    lines += [f"\nNote: {note}." for note in args.notes]
    lines += ["", "Targets:", ""]
    for t in targets:
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(f"- {t['status']}: {t['target']} (ratio {ratio}"
                     + (f" vs {t['against']})" if t["against"] else ")"))
    ok = {r["strategy"]: r for r in results
          if "error" not in r and r["backend"] in ("rsdp", NO_BACKEND)}
    if "rsdp" in ok and PLAIN in ok:
        rs, pl = ok["rsdp"], ok[PLAIN]
        lines += ["", f"RSDP over {args.world_size} ranks vs the plain model in one process "
                      f"(same global batch): tokens/s ratio "
                      f"{rs['tokens_per_s'] / pl['tokens_per_s']:.2f}, step time "
                      f"{rs['step_s'] * 1e3:.1f} vs {pl['step_s'] * 1e3:.1f} ms."]
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
    with torch.device("meta"):  # count parameters without allocating them
        n_params = tm.count_params(build(args))
    meta = {"params": n_params, "cpus": os.cpu_count(), "load_before": tm.load_average(),
            "rsdp_env": tm.tune_for_oversubscription(args.world_size)}
    if args.device == "cuda":
        meta.update(gpu=torch.cuda.get_device_name(0), gpus_used=gpus_used(args),
                    ranks_per_gpu=-(-args.world_size // gpus_used(args)))
    print(f"TransformerLM {model_config(args)}, {n_params / 1e6:.2f} M params; runs: "
          + ", ".join(f"{s}:{b}" for s, b in args.runs) + f"; load average {meta['load_before']}",
          flush=True)
    for note in args.notes:
        print(f"note: {note}", flush=True)
    t0 = time.perf_counter()
    results = [run_one(args, s, b) for s, b in args.runs]
    meta.update(load_after=tm.load_average(), wall_s=time.perf_counter() - t0)
    targets = evaluate_targets(results)
    text = render(args, results, targets, meta)
    print("\n" + text)
    stem = f"training_{args.name}"
    write_result(args.out, stem, {
        "config": model_config(args),
        "args": {k: v for k, v in vars(args).items() if k != "runs"},
        "runs": [f"{s}:{b}" for s, b in args.runs], "meta": meta,
        "memory_method": tm.METHOD, "results": results, "targets": targets}, text, argv)
    plotted = plot(os.path.join(args.out, stem + ".png"), results,
                   f"TransformerLM {args.name}: {n_params / 1e6:.1f} M "
                   f"params, {args.world_size} ranks (load {meta['load_before']})")
    print((f"# wrote {os.path.join(args.out, stem)}.png; " if plotted else "# ")
          + f"took {meta['wall_s']:.0f} s")
    return 0 if any("error" not in r for r in results) else 1
