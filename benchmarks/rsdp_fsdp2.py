"""RSDP variants against FSDP2 on a Hugging Face Llama, every variant in the same processes,
taking turns step by step: step time, its spread, the same under --load N busy loops, peak
memory (MemTracker) and final losses. --quick is the CI guard. See docs/benchmarks.md,
rsdp-fsdp2.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from . import training_models as tm
from .common import RESULTS, run_ranks, slowest, take_turns, write_result

SETTINGS = {
    "act": dict(vocab=2048, hidden=256, ffn=768, layers=4, heads=8, kv=4, seq=64, batch=4),
    "weights": dict(vocab=32000, hidden=256, ffn=512, layers=4, heads=8, kv=4, seq=32, batch=1),
}
VARIANTS = {"rsdp": dict(), "rsdp-units": dict(tp_plan="auto"),
            "rsdp-units-recompute": dict(tp_plan="auto", unit_recompute=True), "fsdp2": None,
            "rsdp-pershard": dict(), "rsdp-perlayer": dict(),
            "rsdp-units-pershard": dict(tp_plan="auto")}
#: variants that compute every layer shard by shard ([Note: whole small layers] off)
PER_SHARD = {"rsdp-pershard"}
#: variants whose small layers rotate one by one, not as their block ([Note: block gathers])
PER_LAYER = {"rsdp-pershard", "rsdp-perlayer"}
#: unit variants whose units rotate shard by shard whatever their size ([Note: small units
#: computed whole] off)
UNITS_PER_SHARD = {"rsdp-units-pershard"}


def use_variant(v) -> None:
    """Sets the module switches variant ``v`` runs with (variants share the processes)."""
    # internal switches (private modules: this benchmark measures what they buy)
    from torch_rsdp.rsdp._layers import block_gather, sharded_linear
    from torch_rsdp.rsdp._units import unit_whole
    sharded_linear.WHOLE_SMALL = v not in PER_SHARD
    block_gather.ENABLED = v not in PER_LAYER
    unit_whole.MODE = "never" if v in UNITS_PER_SHARD else "auto"
MEM_CATS = ("params", "grads+optim", "rest")

_BUSY = "import time\nt = time.time() + {secs}\nx = 0\nwhile time.time() < t:\n    x += 1\n"


def build_model(cfg):
    import torch
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv"], max_position_embeddings=cfg["seq"],
        tie_word_embeddings=False, use_cache=False, bos_token_id=0, eos_token_id=1))


def wrap(model, variant, group=None, backend=None):
    """``variant`` over ``group`` (None: the default group); with ``backend`` given, checks that
    the group the variant runs on is on that backend."""
    import torch.distributed as dist
    if backend is not None and dist.get_backend(group) != backend:
        raise RuntimeError(f"{variant}: group on {dist.get_backend(group)!r}, not {backend!r}")
    if VARIANTS[variant] is not None:
        import torch_rsdp.rsdp as rsdp
        return rsdp.shard(model, group, **VARIANTS[variant])
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if group is None:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    else:
        mesh = DeviceMesh.from_group(group, "cpu")
    if backend is not None and dist.get_backend(mesh.get_group()) != backend:
        raise RuntimeError(f"fsdp2: mesh group on {dist.get_backend(mesh.get_group())!r}")
    for blk in model.model.layers:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _worker(rank, world, cfg, runs, a):
    """``runs``: (key, variant, backend) triples; the first backend is the default group's."""
    import torch
    import torch.distributed as dist
    groups = {a.backends[0]: None}
    for b in a.backends[1:]:
        groups[b] = dist.new_group(backend=b)
    check = a.backend is not None  # --backend given: check each variant's group
    models = {k: wrap(build_model(cfg), v, groups[b], b if check else None) for k, v, b in runs}
    kind = {k: v for k, v, _ in runs}
    variants = [k for k, _, _ in runs]
    opts = {v: torch.optim.AdamW(m.parameters(), lr=1e-4) for v, m in models.items()}
    losses = {v: [] for v in variants}

    def step(v, i):
        use_variant(kind[v])
        g = torch.Generator().manual_seed(1000 * i + rank)
        ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
        loss = models[v](input_ids=ids, labels=ids).loss
        loss.backward()
        opts[v].step()
        opts[v].zero_grad(set_to_none=True)
        losses[v].append(loss.item())

    res = {"quiet": None, "loaded": None, "memory": {}, "allreduce": None}
    take_turns(variants, a.warmup, step)
    res["quiet"] = take_turns(variants, a.steps, step, a.warmup)
    if a.load:
        dist.barrier()
        busy = [subprocess.Popen([sys.executable, "-c", _BUSY.format(secs=3600)])
                for _ in range(a.load if rank == 0 else 0)]
        dist.barrier()
        try:
            res["loaded"] = take_turns(variants, a.steps, step, a.warmup + a.steps)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    # the losses of the timed steps: every variant saw the same batches
    res["final_loss"] = {v: sum(losses[v][-3:]) / 3 for v in variants}
    for v in variants if not a.no_memory else ():
        dist.barrier()
        # gradients that are views of a strategy's flat buffers (RSDP's) land in MemTracker's
        # optimizer-state category: the two are reported together
        peak = tm.memtracker_peak(lambda: step(v, 10_000), models[v], opts[v])
        cats = [peak.get("Parameter", 0), peak.get("Gradient", 0) + peak.get("Optstate", 0)]
        total = peak.get("Total", 0)
        every = [None] * world
        dist.all_gather_object(every, [total, *cats, total - sum(cats)])
        top = max(every)
        res["memory"][v] = dict(total=top[0], **dict(zip(MEM_CATS, top[1:])))
    if a.allreduce and a.backends[0] == "rsdp":
        res["allreduce"] = _allreduce_ratio()
    return res


def _allreduce_ratio(nbytes=4 << 20, iters=10):
    """Median all-reduce time over rsdp and gloo (both in this process group's processes)."""
    import torch
    import torch.distributed as dist
    gloo = dist.new_group(backend="gloo")
    t = torch.ones(nbytes // 4)
    out = {}
    for name, g in (("rsdp", None), ("gloo", gloo), ("rsdp", None), ("gloo", gloo)):
        for _ in range(2):
            dist.all_reduce(t, group=g)
        ts = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, group=g)
            ts.append(time.perf_counter() - t0)
        out.setdefault(name, []).extend(slowest(ts))
    dist.destroy_process_group(gloo)
    return {k: statistics.median(v) for k, v in out.items()}


def summarise(setting, world, runs, raw, cfg, base_key="fsdp2"):
    """``runs``: (key, variant, backend) triples; ratios are against the row ``base_key``."""
    tokens = world * cfg["batch"] * cfg["seq"]
    rows = {}
    for v, variant, backend in runs:
        r = dict(variant=variant, backend=backend)
        for ph in ("quiet", "loaded"):
            ts = raw[ph][v] if raw.get(ph) else None
            if ts:
                med = statistics.median(ts)
                r[ph] = dict(step_s=med, tokens_per_s=tokens / med, spread=max(ts) / med,
                             steps=ts)
        if v in raw.get("memory", {}):
            r["memory"] = raw["memory"][v]
        r["final_loss"] = raw["final_loss"][v]
        rows[v] = r
    base = rows.get(base_key)
    for v, r in rows.items():
        for ph in ("quiet", "loaded"):
            if base and ph in r and ph in base:
                r[ph]["x_fsdp2"] = base[ph]["step_s"] / r[ph]["step_s"]
                r[ph]["spread_vs_fsdp2"] = r[ph]["spread"] / base[ph]["spread"]
        if base and "memory" in r and "memory" in base:
            r["memory"]["x_fsdp2"] = r["memory"]["total"] / base["memory"]["total"]
    out = dict(setting=setting, world_size=world, config=cfg, rows=rows,
               params=None, baseline=base_key if base else None)
    gains = backend_gains(runs, rows)
    if gains:
        out["rsdp_backend_gain"] = gains
    if raw.get("allreduce"):
        ar = raw["allreduce"]
        out["allreduce"] = dict(ar, speedup=ar["gloo"] / ar["rsdp"])
    return out


def backend_gains(runs, rows):
    """Per variant and backend B other than rsdp: tokens/s over rsdp / over B, and peak memory
    over rsdp / over B (what the rsdp backend adds to that variant)."""
    by = {(v, b): k for k, v, b in runs}
    out = {}
    for (v, b), k in by.items():
        kr = by.get((v, "rsdp"))
        if b == "rsdp" or kr is None or "quiet" not in rows[k] or "quiet" not in rows[kr]:
            continue
        g = dict(variant=v, over=b,
                 tokens_per_s=rows[kr]["quiet"]["tokens_per_s"] / rows[k]["quiet"]["tokens_per_s"])
        if "memory" in rows[k] and "memory" in rows[kr]:
            g["memory"] = rows[kr]["memory"]["total"] / rows[k]["memory"]["total"]
        out[f"{v} rsdp/{b}"] = g
    return out


def render(results, a) -> str:
    lines = ["# RSDP vs FSDP2", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average at "
             f"start {a.load_at_start}, {a.steps} timed steps after {a.warmup} warm-up, "
             f"competing processes in the loaded phase: {a.load}. Memory: torch's MemTracker "
             f"(every tensor allocated) over one step, peak per rank, max over ranks.", ""]
    multi = a.backend is not None
    if multi:
        lines += [f"Backends: {', '.join(a.backends)} (default group: {a.backends[0]}); "
                  f"ratios against FSDP2 over {a.baseline}.", ""]
    base = f"FSDP2 over {a.baseline}" if multi else "FSDP2"
    for res in results:
        cfg = res["config"]
        lines += [f"## {res['setting']}, {res['world_size']} ranks "
                  f"(batch {cfg['batch']}x{cfg['seq']} per rank, vocab {cfg['vocab']})", ""]
        hdr = ["variant"] + (["backend"] if multi else []) + [
            "step ms", "tokens/s", f"x {base}", "spread", f"spread / {base}'s"]
        if a.load:
            hdr += ["loaded ms", f"loaded x {base}", "loaded spread", f"/ {base}'s"]
        if not a.no_memory:
            hdr += ["peak/rank (MemTracker)", f"x {base} mem", "params", "grads + optim",
                    "activations, buffers, temporaries"]
        hdr += ["final loss"]
        body = []
        for v, r in res["rows"].items():
            q = r.get("quiet", {})
            row = ([r["variant"], r["backend"]] if multi else [v]) + [
                   f"{q.get('step_s', 0) * 1e3:.1f}", f"{q.get('tokens_per_s', 0):,.0f}",
                   f"{q.get('x_fsdp2', float('nan')):.2f}", f"{q.get('spread', 0):.2f}",
                   f"{q.get('spread_vs_fsdp2', float('nan')):.2f}"]
            if a.load:
                ld = r.get("loaded", {})
                row += [f"{ld.get('step_s', 0) * 1e3:.1f}",
                        f"{ld.get('x_fsdp2', float('nan')):.2f}",
                        f"{ld.get('spread', 0):.2f}",
                        f"{ld.get('spread_vs_fsdp2', float('nan')):.2f}"]
            m = r.get("memory")
            if m:
                row += [tm.fmt_bytes(m["total"]), f"{m.get('x_fsdp2', float('nan')):.2f}",
                        *(tm.fmt_bytes(m[c]) for c in MEM_CATS)]
            elif not a.no_memory:
                row += ["-"] * 5
            row.append(f"{r['final_loss']:.4f}")
            body.append(row)
        lines += [tm.md_table(hdr, body), ""]
        for g in res.get("rsdp_backend_gain", {}).values():
            mem = f", peak memory {g['memory']:.2f}x" if "memory" in g else ""
            lines += [f"{g['variant']} over rsdp / over {g['over']}: tokens/s "
                      f"{g['tokens_per_s']:.2f}x{mem}", ""]
        if res.get("allreduce"):
            ar = res["allreduce"]
            lines += [f"all-reduce 4 MiB: rsdp {ar['rsdp'] * 1e3:.2f} ms, gloo "
                      f"{ar['gloo'] * 1e3:.2f} ms: {ar['speedup']:.1f}x", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="act,weights")
    p.add_argument("--world-sizes", default="4,2")
    p.add_argument("--variants", default="rsdp,rsdp-units,fsdp2")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant and phase")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--load", type=int, default=0,
                   help="competing busy processes during a second timed phase")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--allreduce", action="store_true",
                   help="also time a 4 MiB all-reduce over rsdp and gloo")
    p.add_argument("--backend", default=None,
                   help="comma list of backends every variant runs over (default: rsdp); the "
                        "first is the default group's")
    p.add_argument("--baseline", default=None,
                   help="the backend whose FSDP2 row the ratios are against (default: gloo "
                        "where listed, else the first backend)")
    p.add_argument("--quick", action="store_true", help="the CI guard's short mode")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--name", default="rsdp_fsdp2")
    a = p.parse_args(argv)
    if a.quick:
        a.settings, a.world_sizes, a.variants = "act", "2", "rsdp,fsdp2"
        a.steps, a.warmup, a.no_memory, a.allreduce = min(a.steps, 6), 2, True, True
    for v in a.variants.split(","):
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {list(VARIANTS)}")
    a.backends = (a.backend or "rsdp").split(",")
    if len(set(a.backends)) != len(a.backends):
        raise SystemExit(f"--backend lists a backend twice: {a.backend}")
    if a.baseline is None:
        a.baseline = "gloo" if "gloo" in a.backends else a.backends[0]
    if a.baseline not in a.backends:
        raise SystemExit(f"--baseline {a.baseline!r} is not among --backend {a.backend}")
    if a.allreduce and a.backends[0] != "rsdp":
        raise SystemExit("--allreduce times the default group against gloo: list rsdp first")
    # row keys: the variant's name alone without --backend (as before), else "<v> over <b>"
    runs = [(v if a.backend is None else f"{v} over {b}", v, b)
            for v in a.variants.split(",") for b in a.backends]
    base_key = "fsdp2" if a.backend is None else f"fsdp2 over {a.baseline}"
    a.load_at_start = tm.load_average()
    results = []
    for setting in a.settings.split(","):
        for w in (int(x) for x in a.world_sizes.split(",")):
            t0 = time.time()
            raw = run_ranks(_worker, w, SETTINGS[setting], runs, a, backend=a.backends[0],
                            threads=a.threads)
            res = summarise(setting, w, runs, raw, SETTINGS[setting], base_key)
            res["wall_s"] = time.time() - t0
            results.append(res)
            print(render([res], a).split("\n", 3)[3], flush=True)
    write_result(a.out, a.name, results, render(results, a), argv)
    return 0
