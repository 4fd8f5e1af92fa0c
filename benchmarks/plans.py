"""The planner against uniform strategies: `plan.auto` at memory budgets from the tightest
feasible to unconstrained against every uniform strategy, taking turns in one launch on 1x2,
1x4 and 2x2 emulated nodes: step time and peak memory, measured and predicted. See
docs/benchmarks.md, plans.

Only the standard library is imported at the top (workers enter network namespaces first).
"""
from __future__ import annotations

import argparse
import datetime
from collections import Counter
import os
import shutil
import time

from .common import RESULTS, on_two_nodes, verdicts, write_result

SETTINGS = {"1x2": [0, 0], "1x4": [0, 0, 0, 0], "2x2": [0, 0, 1, 1]}
# Rounds by default: ranks sharing a machine's cores drift over minutes, so the cheap one-node
# runs take turns more often than the long, link-bound 2x2 ones.
ROUNDS = {"1x2": 5, "1x4": 5, "2x2": 3}
# The least two runs of one plan in one launch are taken to differ by (the repeated plan
# measures the actual spread in every launch, and the larger of the two counts).
MARGIN_NOISE = 0.05
UNIFORM = ["no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard", "rotate",
           "split:2", "split:4"]
# 12 M parameters: weights and Adam state dominate activations at this micro-batch, so
# replicating everything needs about 3x the tightest plan's memory.
MODEL = dict(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
             num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
             tie_word_embeddings=False, use_cache=False)
QUICK_MODEL = dict(MODEL, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=512)
SEQ, BATCH = 32, 2  # tokens per sequence, sequences per rank


def _measure(ctx, cfg, spec, steps, warmup, memory):
    """This rank's step times of ``spec`` (a plan or a strategy name) and, with ``memory``,
    its peak bytes over one more step (MemTracker), else 0."""
    import torch
    import torch.distributed as dist

    import torch_rsdp.plan as plan
    from . import training_models as tm
    W, r = ctx.world_size, ctx.rank
    model = plan.apply(tm.llama(**cfg), spec)
    opt = plan.make_optimizer(model, torch.optim.AdamW, lr=1e-4)

    def step(i):
        ids = tm.token_batch(cfg["vocab_size"], W * BATCH, SEQ + 1, i)[r * BATCH:(r + 1) * BATCH]
        tm.hf_step(model, opt, ids[:, :-1], ids[:, 1:])

    times = tm.timed_steps(step, steps, warmup)
    dist.barrier()
    if not memory:
        return times, 0
    # error-feedback residuals (compressed plans) are held all along, made before this step
    peak = tm.memtracker_peak(lambda: step(warmup + steps), model, opt,
                              *plan.feedback_state_dict(model).values())
    return times, peak.get("Total", 0)


def _measure_all(ctx, cfg, specs, rounds, steps, warmup):
    """[(step s, peak bytes, [step s of each round])] per spec, slowest / largest rank: the
    specs take turns over ``rounds`` rounds (a slow spell of the shared machine then touches
    every spec alike) and each one's step time is the median of all its timed steps; memory
    from the first round."""
    import statistics

    import torch
    import torch.distributed as dist
    times = [[[] for _ in range(rounds)] for _ in specs]
    peaks = [0] * len(specs)
    order = list(range(len(specs)))
    for rd in range(rounds):
        # each round starts one run later: what a run leaves behind (freed memory the next one
        # faults back in, the allocator's state) then touches each run in turn, not always
        # the same one
        for i in order[rd % len(order):] + order[:rd % len(order)]:
            spec = specs[i]
            ctx.set_progress(f"round {rd + 1}/{rounds}: run {i + 1}/{len(specs)}")
            t, peak = _measure(ctx, cfg, spec, steps, warmup, memory=rd == 0)
            times[i][rd] += t
            peaks[i] = max(peaks[i], peak)
    vals = torch.tensor([[statistics.median(sum(t, [])), float(p)]
                         + [statistics.median(x) for x in t] for t, p in zip(times, peaks)],
                        dtype=torch.float64)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    return [(float(v[0]), int(v[1]), [float(x) for x in v[2:]]) for v in vals.tolist()]


def bench_worker(ctx, cfg, budgets_n, steps, warmup, rate_Bps, uniform, one_node,
                 rounds, allow_compression=False):
    import torch

    import torch_rsdp.plan as plan
    torch.set_num_threads(1)
    r = ctx.rank
    from . import training_models as tm
    model = tm.llama(**cfg)
    ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
    example = {"input_ids": ids, "labels": ids, "use_cache": False}
    try:
        plan.auto(model, example, memory_budget=1)
    except plan.BudgetError as e:
        tightest = e.smallest_feasible_bytes
    loose = plan.auto(model, example, memory_budget=1 << 40, verify=0).prediction.peak_bytes
    # The fastest plan is timed: on a busy machine it can be a lean one whose peak lies below
    # the tightest budget (a budget, which keeps headroom over a peak); no budget below that fits
    loose = max(loose, tightest)
    budgets = [int(tightest + (loose - tightest) * i / (budgets_n - 1)) for i in range(budgets_n)]
    rows, specs = [], []
    for s in uniform:
        if s.startswith("hybrid_shard") and one_node:
            continue  # on one node hybrid_shard is full_shard
        if "+" in s and one_node:
            continue  # on one node compression changes nothing
        pred = plan.predict(model, example, plan.Plan.uniform(model, s))
        rows.append({"kind": "uniform", "plan": s, "pred_step_s": pred.step_time_s,
                     "pred_peak_bytes": pred.peak_bytes})
        specs.append(s)
    # the same plan measured twice: how far apart two runs of one plan land in this run
    again = "full_shard" if "full_shard" in specs else specs[0]
    rows.append({**next(r for r in rows if r["plan"] == again), "kind": "repeat",
                 "plan": again + " (again)"})
    specs.append(again)
    for b in budgets:
        ctx.set_progress(f"auto at {b} bytes")
        p = plan.auto(model, example, memory_budget=b, allow_compression=allow_compression)
        rows.append({"kind": "auto", "budget_bytes": b, "plan": p.to_dict(),
                     "pred_step_s": p.prediction.step_time_s,
                     "pred_peak_bytes": p.prediction.peak_bytes, "explain": p.explain()})
        specs.append(p)
    cluster = None
    if rate_Bps:
        from torch_rsdp.plan._planner import plan_profile  # the link fits auto measured
        fits = plan_profile(model, example).fits
        intra = fits["all_gather@intra"].bytes_per_s / 1e9
        cl = plan.Cluster(nodes=2, ranks_per_node=ctx.world_size // 2, intra_node_GBps=intra,
                          inter_node_GBps=rate_Bps / 1e9,
                          latency_us=fits["all_reduce@inter"].latency_s * 1e6)
        mid = budgets[len(budgets) // 2]
        p = plan.auto(model, example, memory_budget=mid, topology=cl)
        cluster = {"cluster": repr(cl), "budget_bytes": mid, "plan": p.to_dict(),
                   "pred_step_s": p.prediction.step_time_s,
                   "pred_peak_bytes": p.prediction.peak_bytes}
        specs.append(p)
    measured = _measure_all(ctx, cfg, specs, rounds, steps, warmup)
    for row, (t, peak, per_round) in zip(rows + ([cluster] if cluster else []), measured):
        row["step_s"], row["peak_bytes"], row["round_step_s"] = t, peak, per_round
    if r:
        return None
    return {"budgets": budgets, "tightest": tightest, "loose": loose, "rows": rows,
            "cluster": cluster}


# ------------------------------------------------------------------------------ launcher side
def run(setting, args, nodes, rate_Bps):
    from torch_rsdp.testing.launch import LaunchError, launch
    node_of = SETTINGS[setting]
    try:
        res = launch(bench_worker, len(node_of),
                     (args.model, args.budgets, args.steps, args.warmup,
                      rate_Bps if setting == "2x2" else None, args.uniform, setting != "2x2",
                      args.rounds or ROUNDS[setting], args.allow_compression),
                     node_of=node_of if setting == "2x2" else None,
                     netns=nodes if setting == "2x2" else None,
                     env={"OMP_NUM_THREADS": "1", "RSDP_SPIN_US": "0",
                          "RSDP_PLAN_CACHE": args.cache},
                     deadline=3600, pg_timeout=1800)
        out = dict(res[0])
    except LaunchError as e:
        out = {"error": str(e)[:3000]}
    out["setting"] = setting
    return out


def _pct(pred, meas):
    return (pred - meas) / meas if meas else float("nan")


def _hybrid_check(autos, unis):
    """hybrid_shard where the link makes it pay: it pays if uniform hybrid_shard measured more
    than 5 % faster than every other uniform strategy that needs no more memory; then the
    plans at budgets it fits must use it. Otherwise there is nothing to use it for, and the
    detail says which strategy was as fast in less memory."""
    text = "2x2: the plans use hybrid_shard where the link makes it pay"
    used = [r for r in autos if "hybrid_shard" in r["plan"]["mapping"].values()]
    hyb = next((u for u in unis if u["plan"] == "hybrid_shard"), None)
    if hyb is None:
        return text, bool(used), f"used at {len(used)} budgets (no uniform hybrid_shard run)"
    rivals = [u for u in unis if u is not hyb and u["peak_bytes"] <= hyb["peak_bytes"]]
    best = min(rivals, key=lambda u: u["step_s"], default=None)
    if best is None or hyb["step_s"] * 1.05 < best["step_s"]:
        need = [r for r in autos if r["budget_bytes"] >= hyb["peak_bytes"]]
        return text, all(r in used for r in need), (
            f"it pays; used at {len([r for r in need if r in used])} of the {len(need)} "
            f"budgets it fits")
    return text, True, (
        f"it does not pay here: uniform hybrid_shard {hyb['step_s'] * 1e3:.0f} ms at "
        f"{hyb['peak_bytes'] / 2**20:.1f} MiB, {best['plan']} {best['step_s'] * 1e3:.0f} ms at "
        f"{best['peak_bytes'] / 2**20:.1f} MiB; the plans use it at {len(used)} budgets")


def margin(auto_row, unis):
    """Best fitting uniform step time / auto's, pooled and per round (None: none fits);
    ``same``: auto picked that very plan (its margin is noise, not a difference)."""
    fit = [u for u in unis if u["peak_bytes"] <= auto_row["budget_bytes"]]
    if not fit:
        return None
    best = min(fit, key=lambda u: u["step_s"])
    per_round = [min(u["round_step_s"][i] for u in fit) / a
                 for i, a in enumerate(auto_row["round_step_s"])]
    p = auto_row["plan"]  # the same plan: Plan.uniform(model, best) itself
    return {"best": best["plan"], "pooled": best["step_s"] / auto_row["step_s"],
            "same": p["default"] == best["plan"] and set(p["mapping"].values()) <= {best["plan"]},
            "per_round": per_round,
            "rounds_won": sum(m >= 1 - MARGIN_NOISE for m in per_round)}


def noise_floor(rows) -> float:
    """How far apart the two runs of one plan landed (pooled medians), as a fraction."""
    rep = next((r for r in rows if r["kind"] == "repeat"), None)
    if rep is None:
        return 0.0
    first = next(r for r in rows if r["kind"] == "uniform"
                 and r["plan"] == rep["plan"].split(" ")[0])
    return abs(rep["step_s"] / first["step_s"] - 1)


def checks(results):
    out = []

    def add(text, ok, detail):
        out.append({"check": text, "ok": bool(ok), "detail": detail})

    best_gain = []
    for res in results:
        if "error" in res:
            continue
        st, rows = res["setting"], res["rows"]
        autos = [r for r in rows if r["kind"] == "auto"]
        unis = [r for r in rows if r["kind"] == "uniform"]
        over = [r for r in autos if r["peak_bytes"] > r["budget_bytes"]]
        add(f"{st}: measured peak <= budget at every budget", not over,
            f"{len(over)} of {len(autos)} over")
        perr = max(abs(_pct(r["pred_peak_bytes"], r["peak_bytes"])) for r in autos)
        add(f"{st}: predicted peak within 10% of measured", perr <= 0.10, f"worst {perr:.0%}")
        terr = max(abs(_pct(r["pred_step_s"], r["step_s"])) for r in autos)
        add(f"{st}: predicted step time within 25% of measured", terr <= 0.25,
            f"worst {terr:.0%}")
        margins = [m for m in map(lambda r: margin(r, unis), autos) if m is not None]
        gains = [m["pooled"] for m in margins]
        worst = min((m["pooled"] for m in margins if not m["same"]), default=1.0)
        same = sum(m["same"] for m in margins)
        rounds_won = sum(m["rounds_won"] for m in margins)
        rounds_all = sum(len(m["per_round"]) for m in margins)
        noise = noise_floor(rows)
        floor = 1 - max(MARGIN_NOISE, noise)
        add(f"{st}: auto at least as fast as the best uniform strategy that fits, at every "
            f"budget, within the noise (margin >= {floor:.2f})", worst >= floor,
            f"worst margin {worst:.3f}x where auto's plan differs; at {same} of "
            f"{len(margins)} budgets auto picked that uniform plan itself; auto as fast in "
            f"{rounds_won} of {rounds_all} (budget, round) pairs; one plan measured twice "
            f"differed by {noise:.1%}")
        best_gain.append(max(gains[1:-1] or [0]))
        if st == "2x2":
            add(*_hybrid_check(autos, unis))
            c = res.get("cluster")
            if c:
                e = _pct(c["pred_step_s"], c["step_s"])
                add("2x2: Cluster(nodes=2, ...) predicted step time within 25% of measured",
                    abs(e) <= 0.25, f"{e:+.0%}")
    if best_gain:
        add("auto >= 1.15x the best fitting uniform strategy at some budget between the "
            "extremes", max(best_gain) >= 1.15, f"best {max(best_gain):.2f}x")
    return out


def markdown(results, info, chk):
    from .common import fmt_bytes as fb, md_table
    rounds = ", ".join(f"{n} ({s})" for s, n in info["rounds"].items())
    lines = [f"## Planner vs uniform strategies: Llama {info['model']}, AdamW, rsdp backend", "",
             f"{info['steps']} timed steps after {info['warmup']} warm-up in each of {rounds} "
             f"rounds (runs take turns; median over all), seq {info['seq']}, "
             f"batch {info['batch']}/rank; 2x2 = {info['link']}; torch {info['torch']}; "
             f"load average at start {info['load']}. Memory: torch MemTracker over one step "
             f"(every tensor torch allocates), max over ranks.", ""]
    for res in results:
        st = res["setting"]
        if "error" in res:
            lines += [f"### {st}: failed", "", "```", res["error"], "```", ""]
            continue
        hdr = ["run", "budget", "step ms", "pred ms", "peak/rank", "pred peak", "fits",
               "vs best fitting uniform (per round)", "plan"]
        body = []
        for r in res["rows"]:
            if r["kind"] in ("uniform", "repeat"):
                body.append([r["plan"], "-", f"{r['step_s'] * 1e3:.0f}",
                             f"{r['pred_step_s'] * 1e3:.0f}", fb(r["peak_bytes"]),
                             fb(r["pred_peak_bytes"]), "", "", "uniform"])
            else:
                counts = Counter([*r["plan"]["mapping"].values(), r["plan"]["default"]])
                mix = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
                m = margin(r, [u for u in res["rows"] if u["kind"] == "uniform"])
                vs = "-" if m is None else (
                    f"{m['pooled']:.2f}x {m['best']}{' (same plan)' if m['same'] else ''} ("
                    + " ".join(f"{x:.2f}" for x in m["per_round"]) + ")")
                body.append(["auto", fb(r["budget_bytes"]), f"{r['step_s'] * 1e3:.0f}",
                             f"{r['pred_step_s'] * 1e3:.0f}", fb(r["peak_bytes"]),
                             fb(r["pred_peak_bytes"]),
                             "yes" if r["peak_bytes"] <= r["budget_bytes"] else "NO", vs, mix])
        lines += [f"### {st} (tightest feasible {fb(res['tightest'])}, unconstrained "
                  f"{fb(res['loose'])})", "", md_table(hdr, body), ""]
        c = res.get("cluster")
        if c:
            lines += [f"{c['cluster']} at {fb(c['budget_bytes'])}: predicted step "
                      f"{c['pred_step_s'] * 1e3:.0f} ms, measured {c['step_s'] * 1e3:.0f} ms; "
                      f"predicted peak {fb(c['pred_peak_bytes'])}, measured "
                      f"{fb(c['peak_bytes'])}.", ""]
    return "\n".join(lines) + "\n" + verdicts(chk) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="1x2,1x4,2x2")
    p.add_argument("--budgets", type=int, default=6)
    p.add_argument("--rate", default="100mbit", help="tc rate of each node link (2x2)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=None,
                   help="the runs take turns this many times (step time: median over all); "
                        "default 5 on one node, 3 on 2x2")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny model, 1x4, 3 budgets")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--allow-compression", action="store_true",
                   help="plan.auto(allow_compression=True); add compressed strategies "
                        "(full_shard+int8, ...) to --uniform to race them too")
    p.add_argument("--uniform", default=",".join(UNIFORM),
                   help="the uniform strategies to measure (default: every one)")
    args = p.parse_args(argv)
    args.model = dict(MODEL)
    args.uniform = [s.strip() for s in args.uniform.split(",") if s.strip()]
    if args.quick:
        args.model, args.settings, args.budgets, args.steps = QUICK_MODEL, "1x4", 3, 1
        args.rounds = 1
        args.uniform = ["no_shard", "full_shard"]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if any(s not in SETTINGS for s in settings) or args.budgets < 2:
        p.error(f"--settings from {list(SETTINGS)}, --budgets >= 2")
    import tempfile

    import torch
    from torch_rsdp.testing import netns
    args.cache = tempfile.mkdtemp(prefix="rsdp-plan-cache-")
    netns.cleanup_stale()
    info = {"model": args.model, "steps": args.steps, "warmup": args.warmup,
            "rounds": {s: args.rounds or ROUNDS[s] for s in settings}, "seq": SEQ,
            "batch": BATCH, "torch": torch.__version__,
            "load": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "link": "-"}
    t0 = time.perf_counter()
    results = []
    try:
        for one_node in ("1x2", "1x4"):
            if one_node in settings:
                results.append(run(one_node, args, None, None))
        if "2x2" in settings:
            results.append(on_two_nodes(args.rate, info, lambda nodes: run(
                "2x2", args, nodes, nodes and nodes.rate_bps / 8)))
    finally:
        shutil.rmtree(args.cache, ignore_errors=True)
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)
    chk = checks(results)
    text = markdown(results, info, chk)
    print(text)
    for res in results:
        for r in res.get("rows", []):
            if r["kind"] == "auto":
                print(f"# {res['setting']} budget {r['budget_bytes']}:\n{r['explain']}\n")
    write_result(args.out, "plans", {"info": info, "results": results, "checks": chk}, text,
                 argv)
    print(f"# took {info['elapsed_s']} s")
    return 1 if any("error" in r for r in results) else 0
