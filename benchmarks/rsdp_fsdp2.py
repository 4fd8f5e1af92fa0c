"""RSDP variants against FSDP2 and DDP on a Hugging Face Llama, every variant in the same
processes, taking turns step by step: step time, its spread, the same under --load N busy
loops, peak memory per rank (torch's MemTracker on CPU, torch.cuda.max_memory_allocated with
--device cuda) and final losses. --quick is the CI guard. See docs/benchmarks.md, rsdp-fsdp2.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from . import training_models as tm
from .common import RESULTS, run_ranks, take_turns, write_result

SETTINGS = {
    "act": dict(vocab=2048, hidden=256, ffn=768, layers=4, heads=8, kv=4, seq=64, batch=4),
    "weights": dict(vocab=32000, hidden=256, ffn=512, layers=4, heads=8, kv=4, seq=32, batch=1),
}
VARIANTS = {"rsdp": dict(), "rsdp-units": dict(tp_plan="auto"),
            "rsdp-units-recompute": dict(tp_plan="auto", unit_recompute=True), "fsdp2": None,
            "rsdp-pershard": dict(), "rsdp-perlayer": dict(),
            "rsdp-units-pershard": dict(tp_plan="auto"), "ddp": None}
#: variants that compute every layer shard by shard ([Note: whole small layers] off)
PER_SHARD = {"rsdp-pershard"}
#: variants whose small layers rotate one by one, not as their block ([Note: block gathers])
PER_LAYER = {"rsdp-pershard", "rsdp-perlayer"}
#: unit variants whose units rotate shard by shard whatever their size ([Note: small units
#: computed whole] off)
UNITS_PER_SHARD = {"rsdp-units-pershard"}
MEM_CATS = ("params", "grads+optim", "rest")
MEM_NAME = {"cpu": "MemTracker", "cuda": "CUDA"}
MEM_METHOD = {"cpu": "torch's MemTracker (every tensor allocated)",
              "cuda": "torch.cuda.max_memory_allocated() less what the process held before the "
                      "step, plus the variant's parameters and optimizer state (the caching "
                      "allocator's; not what NCCL or rsdp allocate themselves)"}
_BUSY = "import time\nt = time.time() + 3600\nx = 0\nwhile time.time() < t:\n    x += 1\n"


def use_variant(v) -> None:
    """Sets the module switches variant ``v`` runs with (variants share the processes)."""
    # internal switches (private modules: this benchmark measures what they buy)
    from torch_rsdp.rsdp._layers import block_gather, sharded_linear
    from torch_rsdp.rsdp._units import unit_whole
    sharded_linear.WHOLE_SMALL = v not in PER_SHARD
    block_gather.ENABLED = v not in PER_LAYER
    unit_whole.MODE = "never" if v in UNITS_PER_SHARD else "auto"


def build_model(cfg):
    return tm.llama(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"],
                    intermediate_size=cfg["ffn"], num_hidden_layers=cfg["layers"],
                    num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv"],
                    max_position_embeddings=cfg["seq"], tie_word_embeddings=False,
                    use_cache=False, bos_token_id=0, eos_token_id=1)


def wrap(model, variant, group, device):
    """``variant`` over ``group`` (None: the default group)."""
    if VARIANTS[variant] is None:
        return tm.wrap(model, variant, device, group)
    import torch_rsdp.rsdp as rsdp
    return rsdp.shard(model, group, **VARIANTS[variant])


def _worker(rank, world, cfg, runs, a):
    """``runs``: (key, variant, backend) triples; the first backend is the default group's."""
    import torch
    import torch.distributed as dist
    cuda = a.device == "cuda"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    groups = {a.backends[0]: None, **{b: dist.new_group(backend=b) for b in a.backends[1:]}}
    losses = {k: [] for k, _, _ in runs}
    held = {k: wrap(build_model(cfg).to(dev), v, groups[b], dev) for k, v, b in runs}
    held = {k: (m, torch.optim.AdamW(m.parameters(), lr=1e-4)) for k, m in held.items()}
    kind = {k: v for k, v, _ in runs}

    def step(k, i):
        """One training step of run ``k`` on batch i of this rank (the same for every run)."""
        use_variant(kind[k])
        ids = tm.token_batch(cfg["vocab"], cfg["batch"], cfg["seq"], 1000 * i + rank)
        losses[k].append(tm.hf_step(*held[k], ids.to(dev)))  # .item() waits for the device

    keys = list(held)
    take_turns(keys, a.warmup, step)
    res = {"quiet": take_turns(keys, a.steps, step, a.warmup), "loaded": None, "memory": {}}
    if a.load:
        dist.barrier()
        busy = [subprocess.Popen([sys.executable, "-c", _BUSY])
                for _ in range(a.load if rank == 0 else 0)]
        dist.barrier()
        try:
            res["loaded"] = take_turns(keys, a.steps, step, a.warmup + a.steps)
        finally:
            for p in busy:
                p.kill()
                p.wait()
    # the losses of the timed steps: every variant saw the same batches
    res["final_loss"] = {k: sum(losses[k][-3:]) / 3 for k in keys}
    for k in keys if not a.no_memory else ():
        dist.barrier()
        if cuda:
            peak = _cuda_peak(lambda: step(k, 10_000), *held[k])
        else:
            # gradients that are views of a strategy's flat buffers (RSDP's) land in
            # MemTracker's optimizer-state category: the two are reported together
            peak = tm.memtracker_peak(lambda: step(k, 10_000), *held[k])
        cats = [peak.get("Parameter", 0), peak.get("Gradient", 0) + peak.get("Optstate", 0)]
        total = peak.get("Total", 0)
        every = [None] * world
        dist.all_gather_object(every, [total, *cats, total - sum(cats)])
        top = max(every)
        res["memory"][k] = dict(total=top[0], **dict(zip(MEM_CATS, top[1:])))
    return res


def _cuda_peak(fn, model, opt) -> dict:
    """What MemTracker's peak is, from the caching allocator: torch.cuda.max_memory_allocated
    over ``fn()`` less what the process held before it (the other variants' share too), plus
    this variant's parameters and optimizer state."""
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    params = tm.resident_bytes(model)
    state = sum(t.numel() * t.element_size() for st in opt.state.values()
                for t in (getattr(v, "_local_tensor", v) for v in st.values())  # DTensor's shard
                if torch.is_tensor(t) and t.is_cuda)
    return {"Total": torch.cuda.max_memory_allocated() - before + params + state,
            "Parameter": params, "Optstate": state}


def summarise(setting, world, runs, raw, cfg, base_key):
    """``runs``: (key, variant, backend) triples; ratios are against the row ``base_key``."""
    tokens = world * cfg["batch"] * cfg["seq"]
    rows = {}
    for k, variant, backend in runs:
        r = rows[k] = dict(variant=variant, backend=backend, final_loss=raw["final_loss"][k])
        for ph in ("quiet", "loaded"):
            ts = (raw.get(ph) or {}).get(k)
            if ts:
                med = statistics.median(ts)
                r[ph] = dict(step_s=med, tokens_per_s=tokens / med, spread=max(ts) / med,
                             steps=ts)
        if k in raw["memory"]:
            r["memory"] = raw["memory"][k]
    base = rows.get(base_key, {})
    for r in rows.values():
        for ph in ("quiet", "loaded"):
            if ph in r and ph in base:
                r[ph]["x_fsdp2"] = base[ph]["step_s"] / r[ph]["step_s"]
                r[ph]["spread_vs_fsdp2"] = r[ph]["spread"] / base[ph]["spread"]
        if "memory" in r and "memory" in base:
            r["memory"]["x_fsdp2"] = r["memory"]["total"] / base["memory"]["total"]
    out = dict(setting=setting, world_size=world, config=cfg, rows=rows,
               baseline=base_key if base else None)
    return out


def render(results, a) -> str:
    multi = a.backend is not None
    base = f"FSDP2 over {a.baseline}" if multi else "FSDP2"
    lines = ["# RSDP vs FSDP2", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average at "
             f"start {a.load_at_start}, {a.steps} timed steps after {a.warmup} warm-up, "
             f"competing processes in the loaded phase: {a.load}. Memory: {MEM_METHOD[a.device]} "
             f"over one step, peak per rank, max over ranks.", ""]
    if multi:
        lines += [f"Backends: {', '.join(a.backends)} (default group: {a.backends[0]}); "
                  f"ratios against FSDP2 over {a.baseline}.", ""]
    nan = float("nan")

    def phase(d):
        return [f"{d.get('step_s', 0) * 1e3:.1f}", f"{d.get('x_fsdp2', nan):.2f}",
                f"{d.get('spread', 0):.2f}", f"{d.get('spread_vs_fsdp2', nan):.2f}"]

    for res in results:
        cfg = res["config"]
        lines += [f"## {res['setting']}, {res['world_size']} ranks "
                  f"(batch {cfg['batch']}x{cfg['seq']} per rank, vocab {cfg['vocab']})", ""]
        hdr = (["variant"] + (["backend"] if multi else [])
               + ["step ms", "tokens/s", f"x {base}", "spread", f"spread / {base}'s"]
               + (["loaded ms", f"loaded x {base}", "loaded spread", f"/ {base}'s"]
                  if a.load else [])
               + ([] if a.no_memory else [f"peak/rank ({MEM_NAME[a.device]})",
                                          f"x {base} mem", "params", "grads + optim",
                                          "activations, buffers, temporaries"])
               + ["final loss"])
        body = []
        for k, r in res["rows"].items():
            q = r.get("quiet", {})
            row = ([r["variant"], r["backend"]] if multi else [k]) + phase(q)
            row.insert(len(row) - 3, f"{q.get('tokens_per_s', 0):,.0f}")
            if a.load:
                row += phase(r.get("loaded", {}))
            m = r.get("memory")
            if m:
                row += [tm.fmt_bytes(m["total"]), f"{m.get('x_fsdp2', nan):.2f}",
                        *(tm.fmt_bytes(m[c]) for c in MEM_CATS)]
            elif not a.no_memory:
                row += ["-"] * 5
            body.append(row + [f"{r['final_loss']:.4f}"])
        lines += [tm.md_table(hdr, body), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="act,weights", help=", ".join(SETTINGS))
    p.add_argument("--world-sizes", default="4,2")
    p.add_argument("--variants", default="rsdp,rsdp-units,fsdp2", help=", ".join(VARIANTS))
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant and phase")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--load", type=int, default=0,
                   help="competing busy processes during a second timed phase")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--backend", default=None,
                   help="comma list of backends every variant runs over (default: rsdp); the "
                        "first is the default group's; ratios against FSDP2 over gloo where "
                        "listed, else over the first")
    p.add_argument("--quick", action="store_true",
                   help="the CI guard: act, 2 ranks, rsdp and fsdp2, no memory")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: rank r on GPU r %% device count")
    p.add_argument("--single-gpu", action="store_true", help="--device cuda, every rank on GPU 0")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    a.device = "cuda" if a.single_gpu else a.device
    gpus = 0
    if a.device == "cuda":
        import torch
        import torch_rsdp
        if not torch.cuda.is_available() or not torch_rsdp.cuda_available():
            p.error(f"--device cuda: torch.cuda.is_available() {torch.cuda.is_available()}, "
                    f"torch_rsdp.cuda_available() {torch_rsdp.cuda_available()}")
        gpus = 1 if a.single_gpu else torch.cuda.device_count()
    if a.quick:
        a.settings, a.world_sizes, a.variants = "act", "2", "rsdp,fsdp2"
        a.steps, a.warmup, a.no_memory = min(a.steps, 6), 2, True
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    bad += [s for s in a.settings.split(",") if s not in SETTINGS]
    if bad:
        p.error(f"unknown variant or setting {bad}")
    a.backends = (a.backend or "rsdp").split(",")
    if len(set(a.backends)) != len(a.backends):
        p.error(f"--backend lists a backend twice: {a.backend}")
    if "nccl" in a.backends and max(map(int, a.world_sizes.split(","))) > gpus:
        p.error("nccl needs --device cuda and a GPU per rank (it refuses ranks sharing one)")
    a.baseline = "gloo" if "gloo" in a.backends else a.backends[0]
    # row keys: the variant's name alone without --backend, else "<v> over <b>"
    runs = [(v if a.backend is None else f"{v} over {b}", v, b)
            for v in a.variants.split(",") for b in a.backends]
    base_key = "fsdp2" if a.backend is None else f"fsdp2 over {a.baseline}"
    a.load_at_start = tm.load_average()
    results = []
    for setting in a.settings.split(","):
        for w in (int(x) for x in a.world_sizes.split(",")):
            t0 = time.time()
            raw = run_ranks(_worker, w, SETTINGS[setting], runs, a, backend=a.backends[0],
                            cuda_devices=gpus)
            res = summarise(setting, w, runs, raw, SETTINGS[setting], base_key)
            res["wall_s"] = time.time() - t0
            results.append(res)
            print(render([res], a).split("\n", 3)[3], flush=True)
    write_result(a.out, "rsdp_fsdp2", results, render(results, a), argv)
    return 0
