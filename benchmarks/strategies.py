"""Every sharding strategy of torch_rsdp.plan, alone, mixed and compressed (`PLAN+int8`), on
1x4 ranks and 2x2 emulated nodes behind a `tc`-limited link: tokens/s, memory by category
(torch's MemTracker), bytes across the link, losses. See docs/benchmarks.md, strategies.

Only the standard library is imported at the top: worker processes import this file before
they move into their node's namespace.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

from .common import RESULTS, on_two_nodes, write_result

ALONE = ["no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard", "rotate",
         "split:2"]
MIXED = {"tok": "rotate", "pos": "no_shard", "blocks.0": "full_shard",
         "blocks.1": "shard_grad_op", "blocks.2": "hybrid_shard", "blocks.3": "split:2",
         "out": "shard_optim"}
SETTINGS = {"1x4": [0, 0, 0, 0], "2x2": [0, 0, 1, 1]}
SMALL = dict(vocab=2048, d_model=256, ffn=512, heads=4, layers=4, seq=32, batch=8)
CATS = ("params", "buffers", "grads", "optim", "activations", "temp")  # MemTracker's


def plan_of(spec: str):
    """(label, plan, compression) of a strategy name, ``mixed`` or a JSON file, with an
    optional ``+int8`` / ``+int4``: ``plan.apply(compression={"grads": ...})``."""
    base, _, suffix = spec.partition("+")
    if suffix not in ("", "int8", "int4"):
        raise SystemExit(f"unknown compression suffix {suffix!r} in {spec!r}: int8 or int4")
    comp = {"grads": suffix} if suffix else None
    if base == "mixed":
        return spec, {"mapping": MIXED, "default": "no_shard"}, comp
    if base.endswith(".json"):
        with open(base) as f:
            return os.path.basename(base)[:-5] + spec[len(base):], json.load(f), comp
    return spec, base, comp


def bench_worker(ctx, plan_json, cfg, steps, warmup, lr, compression=None, repeat=0):
    """One plan on every rank; returns rank 0's summary (other ranks: None)."""
    import torch
    import torch.distributed as dist

    import torch_rsdp
    import torch_rsdp.plan as plan
    from . import training_models as tm

    torch.set_num_threads(1)
    W, r, B = ctx.world_size, ctx.rank, cfg["batch"]
    torch.manual_seed(0)
    model = tm.TransformerLM(cfg["vocab"], cfg["d_model"], cfg["ffn"], cfg["heads"],
                             cfg["layers"], cfg["seq"])
    spec = plan_json if isinstance(plan_json, str) else plan.Plan(plan_json["mapping"],
                                                                  plan_json["default"])
    model = plan.apply(model, spec, compression=compression)
    opt = plan.make_optimizer(model, torch.optim.Adam, lr=lr)  # shards shard_optim's state
    groups = plan.plan_state(model).meshes.groups()
    losses = []

    def step(i):
        # repeat > 0: the same `repeat` batches in turn, which the model can learn (a loss
        # curve that falls); else fresh random tokens every step
        toks = tm.token_batch(cfg["vocab"], W * B, cfg["seq"] + 1, i % repeat if repeat else i)
        toks = toks[r * B:(r + 1) * B]
        loss = tm.lm_loss(model(toks[:, :-1]), toks[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())

    times = tm.timed_steps(step, steps, warmup)
    curve = list(losses)  # the tracked step's loss is not the curve's
    for g in groups:
        torch_rsdp.reset_comm_stats(g)
    # error-feedback residuals (compressed plans) are held all along, made before this step
    mt = tm.memtracker(model, opt, *plan.feedback_state_dict(model).values())
    dist.barrier()
    with mt:
        step(warmup + steps)
    peak = tm.tracked_peak(mt)
    stats = [torch_rsdp.comm_stats(g) for g in groups]
    mine = {"step_s": sorted(times)[len(times) // 2], "loss": curve[-1],
            "mem": peak.get("Total", 0),
            "mem_breakdown": {c: peak.get(k, 0) for k, c in tm.MEM_CATS.items()},
            "inter_node_bytes": sum(s["inter_node_bytes"] for s in stats),
            "intra_node_bytes": sum(s["intra_node_bytes"] for s in stats)}
    every = [None] * W
    dist.all_gather_object(every, mine)
    if r:
        return None
    peak = max(every, key=lambda e: e["mem"])
    step_s = max(e["step_s"] for e in every)
    return {"step_s": step_s, "tokens_per_s": W * B * cfg["seq"] / step_s,
            "loss": every[0]["loss"], "losses": curve,
            "mem_peak_bytes": peak["mem"], "mem_breakdown_bytes": peak["mem_breakdown"],
            "inter_node_bytes": sum(e["inter_node_bytes"] for e in every) / W,
            "intra_node_bytes": sum(e["intra_node_bytes"] for e in every) / W,
            "report": str(plan.report(model, opt))}


def run(setting, spec, args, nodes):
    from torch_rsdp.testing.launch import LaunchError, launch
    label, p, comp = plan_of(spec)
    node_of = SETTINGS[setting]
    t0 = time.perf_counter()
    try:
        res = launch(bench_worker, len(node_of),
                     (p, args.config, args.steps, args.warmup, args.lr, comp,
                      args.repeat_batches),
                     node_of=node_of if setting != "1x4" else None,
                     netns=nodes if setting != "1x4" else None,
                     env={"OMP_NUM_THREADS": "1", "RSDP_SPIN_US": "0"},
                     deadline=600, pg_timeout=300, check_shm=True)
        row = dict(res[0])
    except LaunchError as e:
        row = {"error": str(e).splitlines()[0][:300]}
    row.update(setting=setting, plan=label, wall_s=round(time.perf_counter() - t0, 1))
    from .common import fmt_bytes
    if "error" in row:
        print(f"# {setting} {label}: FAILED {row['error']}", flush=True)
    else:
        print(f"# {setting} {label}: {row['tokens_per_s']:,.0f} tokens/s, peak "
              f"{fmt_bytes(row['mem_peak_bytes'])}, across the link "
              f"{fmt_bytes(row['inter_node_bytes'])}/step/rank", flush=True)
    return row


def checks(rows):
    by = {(r["setting"], r["plan"]): r for r in rows if "error" not in r}
    h, f = by.get(("2x2", "hybrid_shard")), by.get(("2x2", "full_shard"))
    out = []
    if h and f:
        ratio = h["inter_node_bytes"] / max(f["inter_node_bytes"], 1)
        out.append({"check": "2x2: hybrid_shard sends fewer bytes across the node link than "
                             "full_shard", "ratio": ratio, "ok": ratio < 1})
        speed = h["tokens_per_s"] / f["tokens_per_s"]
        out.append({"check": "2x2: hybrid_shard faster than full_shard behind the limited link",
                    "ratio": speed, "ok": speed > 1})
    # compressed variants against their plan in fp32, on 2x2
    for r in rows:
        base = by.get((r["setting"], r["plan"].partition("+")[0]))
        if "+" not in r["plan"] or "error" in r or base is None or r["setting"] != "2x2":
            continue
        speed = r["tokens_per_s"] / base["tokens_per_s"]
        out.append({"check": f"2x2: {r['plan']} >= {TARGET_COMPRESSED_SPEEDUP}x the tokens/s of "
                             f"{base['plan']} (fp32) behind the limited link", "ratio": speed,
                    "ok": speed >= TARGET_COMPRESSED_SPEEDUP})
        drift = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base["losses"]))
        out.append({"check": f"2x2: {r['plan']}'s loss curve ({len(r['losses'])} steps) within "
                             f"3% of {base['plan']}'s", "ratio": drift, "ok": drift <= 0.03})
    return out


TARGET_COMPRESSED_SPEEDUP = 1.6


def markdown(rows, info, chk):
    from .common import fmt_bytes as fb, md_table
    lines = [f"## Strategies: TransformerLM {info['config']}, {info['params'] / 1e6:.2f} M "
             f"parameters, Adam, rsdp backend", "",
             f"{info['steps']} timed steps after {info['warmup']} warm-up, {info['threads']} "
             f"thread(s) per rank on {info['cores']} cores; Adam lr {info.get('lr')}; "
             f"2x2 = {info['link']}; "
             f"torch {info['torch']}; load average at start {info['load']}.", ""]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        sub = [r for r in rows if r["setting"] == setting]
        best = max((r["tokens_per_s"] for r in sub if "error" not in r), default=1)
        hdr = ["plan", "tokens/s", "vs best", "step ms", "peak mem/rank", *CATS,
               "link bytes/step", "node bytes/step", "loss"]
        body = []
        for r in sub:
            if "error" in r:
                body.append([r["plan"], "failed: " + r["error"][:80]] + ["-"] * (len(hdr) - 2))
                continue
            body.append([r["plan"], f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s'] / best:.2f}",
                         f"{r['step_s'] * 1e3:.0f}", fb(r["mem_peak_bytes"]),
                         *(fb(r["mem_breakdown_bytes"][c]) for c in CATS),
                         fb(r["inter_node_bytes"]), fb(r["intra_node_bytes"]),
                         f"{r['loss']:.4f}"])
        lines += [f"### {setting} ({'one node' if setting == '1x4' else '2 nodes x 2 ranks'})",
                  "", md_table(hdr, body), ""]
    lines += ["Memory: torch's MemTracker over one step, its categories at the peak "
              "(benchmarks/training_models.py, METHOD); max over ranks. Link/node bytes: what "
              "one rank sent across its node link / to its own node in that step (comm_stats "
              "over every group the plan uses), mean over ranks.", ""]
    for c in chk:
        lines.append(f"- {'PASS' if c['ok'] else 'MISS'}: {c['check']} (ratio {c['ratio']:.2f})")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", default=",".join(ALONE + ["mixed"]),
                   help="comma-separated strategy names, 'mixed', or plan JSON files")
    p.add_argument("--settings", default="1x4,2x2", help="1x4 and/or 2x2")
    p.add_argument("--rate", default="200mbit", help="tc rate of each node link (2x2)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4, help="Adam's learning rate")
    p.add_argument("--repeat-batches", type=int, default=0,
                   help="train on this many batches in turn (0: fresh random tokens each "
                        "step); with a higher --lr the loss then falls, for the loss curves")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 2x2, full_shard and hybrid_shard, 1 step, 2 layers")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    args.config = dict(SMALL)
    if args.quick:
        args.plans, args.settings, args.steps, args.warmup = "full_shard,hybrid_shard", "2x2", 1, 1
        args.config["layers"] = 2
    plans = [s.strip() for s in args.plans.split(",") if s.strip()]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        p.error(f"unknown setting(s) {bad}; choose from {list(SETTINGS)}")

    import torch

    import torch_rsdp.plan as plan
    from . import training_models as tm
    from torch_rsdp.testing import netns
    for spec in plans:  # fail on a bad plan before starting anything
        pl = plan_of(spec)[1]
        if isinstance(pl, str):
            plan.Plan({"": pl})  # a bad name fails here
        else:
            plan.Plan(pl["mapping"], pl["default"])
    with torch.device("meta"):
        c = args.config
        n_params = tm.count_params(tm.TransformerLM(c["vocab"], c["d_model"], c["ffn"],
                                                    c["heads"], c["layers"], c["seq"]))
    netns.cleanup_stale()
    info = {"config": args.config, "params": n_params, "steps": args.steps,
            "warmup": args.warmup, "threads": 1, "cores": os.cpu_count(),
            "lr": args.lr,
            "torch": torch.__version__, "load": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
    rows = []
    t0 = time.perf_counter()
    info["link"] = "-"
    if "2x2" in settings:
        rows += on_two_nodes(args.rate, info, lambda nodes: [run("2x2", s, args, nodes)
                                                            for s in plans])
    if "1x4" in settings:
        rows = [run("1x4", s, args, None) for s in plans] + rows
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)
    chk = checks(rows)
    text = markdown(rows, info, chk)
    print("\n" + text)
    write_result(args.out, "strategies", {"info": info, "rows": rows, "checks": chk}, text, argv)
    print(f"# took {info['elapsed_s']} s")
    return 1 if any("error" in r for r in rows) else 0
