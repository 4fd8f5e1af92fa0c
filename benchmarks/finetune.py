"""LoRA fine-tuning of a pretrained Llama as a user would (built on meta, sharded, loaded from a
save_pretrained checkpoint), RSDP and RSDP units against FSDP2, each without and with gradient
checkpointing, taking turns in the same 2 ranks: resident share, what a step allocates beyond
it, load peak, step time, bytes sent, first loss. See docs/benchmarks.md, finetune.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from . import training_models as tm
from .common import RESULTS, run_ranks, take_turns, write_result

SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv=8, ffn=8192, vocab=128256, tied=True),
    "small": dict(hidden=1024, layers=4, heads=16, kv=4, ffn=2816, vocab=32000, tied=False),
    "tiny": dict(hidden=64, layers=2, heads=4, kv=2, ffn=128, vocab=512, tied=False),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
KINDS = ("rsdp", "rsdp-units", "fsdp2")
RUNS = tuple(k + c for k in KINDS for c in ("", "+ckpt"))


def config(shape, seq, dtype="bfloat16"):
    import transformers as tf
    s = SHAPES[shape]
    return tf.LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"], max_position_embeddings=max(seq, 128),
        tie_word_embeddings=s["tied"], use_cache=False, bos_token_id=0, eos_token_id=1,
        dtype=dtype)


def write_checkpoint(shape, seq, path, dtype) -> int:
    """A save_pretrained directory of the shape with random weights; returns the parameters."""
    import torch
    import transformers as tf
    tf.logging.set_verbosity_error()
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(config(shape, seq, dtype)).to(getattr(torch, dtype))
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave the head a Parameter of its own
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path, max_shard_size="1GB")
    return n


def build(kind, shape, seq, path, mesh, dtype):
    """The peft-wrapped model, sharded by ``kind`` on meta, materialised and loaded."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model
    import torch_rsdp.rsdp as rsdp
    with torch.device("meta"):  # the class itself builds in the default dtype: cast on meta
        model = tf.LlamaForCausalLM(config(shape, seq, dtype)).to(getattr(torch, dtype))
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS,
                                             lora_dropout=0.0))
    if kind.startswith("rsdp"):
        # every projection rotating on its own, or attention and MLP as rotation units
        rsdp.shard(model, tp_plan="auto" if kind == "rsdp-units" else None)
    else:
        tm.fully_shard_blocks(model, model.base_model.model.model.layers, mesh)
    model.to_empty(device="cpu")
    load_peak = tm.peak_beyond(lambda: rsdp.load_pretrained(model, path, init_adapters=True),
                               model)
    return model, load_peak


def worker(rank, world, a, path):
    import statistics
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import torch_rsdp
    import transformers as tf
    tf.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*DTensor random operators.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    mesh = init_device_mesh("cpu", (world,))
    models, res = {}, {"runs": {}}
    for kind in KINDS:
        models[kind], load_peak = build(kind, a.shape, a.seq, path, mesh, a.dtype)
        res["runs"][kind] = {"resident": tm.resident_bytes(models[kind]),
                             "load_peak": load_peak}
    opts = {k: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
            for k, m in models.items()}
    g = torch.Generator().manual_seed(1000 + rank)
    vocab = SHAPES[a.shape]["vocab"]
    batches = [torch.randint(0, vocab, (1, a.seq), generator=g) for _ in range(a.steps + 2)]
    losses, sent = {r: [] for r in RUNS}, {r: [] for r in RUNS}

    def step(run, i):
        kind = run.split("+")[0]
        model, opt = models[kind], opts[kind]
        hf = model.base_model.model
        # transformers 5 renamed gradient_checkpointing_enable / _disable
        enable = getattr(hf, "activation_checkpointing_enable", None) or \
            hf.gradient_checkpointing_enable
        disable = getattr(hf, "activation_checkpointing_disable", None) or \
            hf.gradient_checkpointing_disable
        if run.endswith("+ckpt"):
            enable({"use_reentrant": False})
        else:
            disable()
        model.train()
        torch_rsdp.reset_comm_stats()
        losses[run].append(tm.hf_step(model, opt, batches[i]))
        sent[run].append(torch_rsdp.comm_stats()["intra_node_bytes"])

    take_turns(list(RUNS), 1, step)  # the warm-up
    times = take_turns(list(RUNS), a.steps, step, 1)
    for r in RUNS:  # one more step each under MemTracker: the peak beyond the resident share
        dist.barrier()
        kind = r.split("+")[0]
        beyond = tm.peak_beyond(lambda: step(r, a.steps + 1), models[kind], opts[kind])
        # a model's first step (its plain run's, which goes first) starts from the checkpoint
        res["runs"][r] = dict(res["runs"].get(kind, {}), beyond=beyond,
                              step_s=statistics.median(times[r]), loss_first=losses[kind][0],
                              sent=statistics.median(sent[r][1:a.steps + 1]))
    return res


def render(shape, n_params, a, res) -> str:
    runs = res["runs"]
    base = {r: "fsdp2+ckpt" if r.endswith("+ckpt") else "fsdp2" for r in RUNS}
    rows = []
    for r in RUNS:
        x, b = runs[r], runs[base[r]]
        tok = a.seq / x["step_s"]
        rows.append([r, tm.fmt_bytes(x["resident"]), tm.fmt_bytes(x["beyond"]),
                     f"{x['beyond'] / b['beyond']:.2f}", tm.fmt_bytes(x["load_peak"]),
                     f"{x['load_peak'] / x['resident']:.2f}", f"{x['step_s']:.2f}",
                     f"{tok:.0f}", f"{b['step_s'] / x['step_s']:.2f}",
                     f"{x['sent'] / 1e6:.1f}", f"{x['loss_first']:.4f}"])
    s = SHAPES[shape]
    head = (f"### {shape}: hidden {s['hidden']}, {s['layers']} layers, vocabulary {s['vocab']}"
            f"{', tied' if s['tied'] else ''}; {n_params / 1e9:.2f} B parameters, {a.dtype}, LoRA "
            f"r=16 on {len(TARGETS)} projections, {a.seq} tokens per rank, 2 ranks\n\n")
    return head + tm.md_table(
        ["run", "resident", "beyond", "beyond / FSDP2's", "load peak", "load / resident",
         "step s", "tokens/s", "speed / FSDP2's", "MB sent/step", "first loss"],
        rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1b,small", help="comma list of " + ", ".join(SHAPES))
    ap.add_argument("--seq", type=int, default=256, help="tokens per rank per step")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (after a warm-up)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="the weights' dtype (results go to finetune-float32.* for float32)")
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args(argv)
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or a.steps < 1 or a.seq < 2:
        ap.error(f"unknown shape(s) {bad}" if bad else "--steps >= 1 and --seq >= 2")
    report = []
    results = {}
    for shape in shapes:
        a.shape = shape
        tmp = tempfile.mkdtemp(prefix="bench_finetune_")
        try:
            n = write_checkpoint(shape, a.seq, os.path.join(tmp, "ckpt"), a.dtype)
            results[shape] = dict(run_ranks(worker, 2, a, os.path.join(tmp, "ckpt")), params=n)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        report.append(render(shape, n, a, results[shape]))
        print(report[-1], flush=True)
    name = "finetune" if a.dtype == "bfloat16" else f"finetune-{a.dtype}"
    write_result(a.out, name, results, "\n".join(report), argv)
    return 0
