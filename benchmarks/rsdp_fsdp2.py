"""RSDP against FSDP2 on a Hugging Face Llama, every variant in the same processes.

Settings: `act` (activations dominate: 4.2 M parameters, 4 x 64 tokens per rank) and `weights`
(18.7 M parameters, a 32,000-token untied head, 1 x 32 tokens). One launch per setting and world
size builds every --variants model from the same weights and trains them on the same batches,
taking turns step by step (each round starting with the next), so a slow spell touches each
alike. Per variant: median step time (slowest rank), throughput over FSDP2's, step-time spread
(max / median) and its ratio to FSDP2's, the same under --load N competing busy loops, and
peak memory per rank (MemTracker, without its per-module split, whose hooks raise inside
rotation units' backward) split into parameters, gradients with optimizer state and the rest.
Final losses agree. --backend rsdp,gloo runs every variant over each backend (the others as
`new_group(backend=...)`). --quick (the CI guard): act, 2 ranks, rsdp and fsdp2, plus a 4 MiB
all-reduce over rsdp and gloo. See docs/benchmarks.md, rsdp-fsdp2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from . import training_models as tm
from .common import RESULTS, write_result

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


def _worker(rank, world, port, cfg, runs, a, out_path):
    """``runs``: (key, variant, backend) triples; the first backend is the default group's."""
    import torch
    import torch.distributed as dist
    tm.tune_for_oversubscription(world)
    import torch_rsdp  # noqa: F401  (registers "rsdp")
    torch.set_num_threads(a.threads or tm.default_threads(world))
    backends = a.backends
    dist.init_process_group(backends[0], init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    groups = {backends[0]: None}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    check = a.backend is not None  # --backend given: check each variant's group
    models = {k: wrap(build_model(cfg), v, groups[b], b if check else None)
              for k, v, b in runs}
    kind = {k: v for k, v, _ in runs}
    variants = [k for k, _, _ in runs]
    opts = {v: torch.optim.AdamW(m.parameters(), lr=1e-4) for v, m in models.items()}
    losses = {v: [] for v in variants}

    def batch(i):
        g = torch.Generator().manual_seed(1000 * i + rank)
        return torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)

    def step(v, i):
        use_variant(kind[v])
        ids = batch(i)
        loss = models[v](input_ids=ids, labels=ids).loss
        loss.backward()
        opts[v].step()
        opts[v].zero_grad(set_to_none=True)
        losses[v].append(loss.item())

    def phase(n_steps, first):
        times = {v: [] for v in variants}
        for s in range(n_steps):
            k = s % len(variants)
            for v in variants[k:] + variants[:k]:
                dist.barrier()
                t0 = time.perf_counter()
                step(v, first + s)
                times[v].append(time.perf_counter() - t0)
        out = {}
        for v in variants:  # the slowest rank's time per step
            t = torch.tensor(times[v], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[v] = t.tolist()
        return out

    res = {"quiet": None, "loaded": None, "memory": {}, "allreduce": None}
    phase(a.warmup, 0)
    res["quiet"] = phase(a.steps, a.warmup)
    if a.load:
        dist.barrier()
        busy = []
        if rank == 0:
            busy = [subprocess.Popen([sys.executable, "-c", _BUSY.format(secs=3600)])
                    for _ in range(a.load)]
        dist.barrier()
        try:
            res["loaded"] = phase(a.steps, a.warmup + a.steps)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    # the losses of the timed steps: every variant saw the same batches
    res["final_loss"] = {v: sum(losses[v][-3:]) / 3 for v in variants}
    if not a.no_memory:
        for v in variants:
            res["memory"][v] = _memory(models[v], opts[v], lambda: step(v, 10_000), world)
    if a.allreduce and backends[0] == "rsdp":
        res["allreduce"] = _allreduce_ratio(world)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def _memory(model, opt, run_step, world):
    """Peak memory per rank over one step, max over ranks: torch's MemTracker (every tensor
    torch allocates), split at the peak into parameters, gradients with optimizer state, and
    the rest (activations, gathered or rotating weights, temporaries)."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    mt._mod_tracker = tm.NoModuleTracking()
    mt.track_external(model, opt)
    dist.barrier()
    with mt:
        run_step()
    snap = mt.get_tracker_snapshot("peak")
    peak = max(snap.values(), key=lambda d: d.get("Total", 0)) if snap else {}
    total = float(peak.get("Total", 0))
    # gradients that are views of a strategy's flat buffers (RSDP's, DDP's buckets) land in
    # MemTracker's optimizer-state category: the two are reported together
    cats = [float(peak.get("Parameter", 0)),
            float(peak.get("Gradient", 0)) + float(peak.get("Optstate", 0))]
    vals = [total] + cats + [total - sum(cats)]
    t = torch.tensor(vals, dtype=torch.float64)
    gathered = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(gathered, t)
    top = max(gathered, key=lambda x: x[0].item()).tolist()
    return dict(total=top[0], **dict(zip(MEM_CATS, top[1:])))


def _allreduce_ratio(world, nbytes=4 << 20, iters=10):
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
        x = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        out.setdefault(name, []).extend(x.tolist())
    dist.destroy_process_group(gloo)
    return {k: statistics.median(v) for k, v in out.items()}


def run_one(setting, world, runs, a):
    import tempfile

    import torch.multiprocessing as mp
    cfg = SETTINGS[setting]
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        mp.spawn(_worker, args=(world, tm.free_port(), cfg, runs, a, path), nprocs=world)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


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
            raw = run_one(setting, w, runs, a)
            res = summarise(setting, w, runs, raw, SETTINGS[setting], base_key)
            res["wall_s"] = time.time() - t0
            results.append(res)
            print(render([res], a).split("\n", 3)[3], flush=True)
    write_result(a.out, a.name, results, render(results, a), argv)
    return 0
