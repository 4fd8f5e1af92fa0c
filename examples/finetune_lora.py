#!/usr/bin/env python3
"""Fine-tune a pretrained chess model with LoRA on a notation it never saw, RSDP against FSDP2.

    python examples/finetune_chess.py --nproc 2 --save-pretrained /tmp/chess-hf   # pretrain
    python examples/finetune_lora.py --pretrained /tmp/chess-hf --nproc 2         # fine-tune
    torchrun --nproc-per-node 2 examples/finetune_lora.py --pretrained /tmp/chess-hf

The pretrained model (a ``save_pretrained`` directory: the main job's first phase writes one)
learnt games in coordinate notation, ``e2e4 e7e5 g1f3``. The task here is the same games seen
from Black's side of the board, every rank mirrored (``e7e5 e2e4 g8f6``): the moves and the
characters are the ones it knows, the squares are not. Every strategy fine-tunes it as a user
with a model too big for one rank would (docs/finetuning.md):

1. build the architecture on ``meta`` (``from_config``: no weights anywhere);
2. wrap it with peft's LoRA (rank ``--lora-r`` on all seven projections; the base frozen);
3. shard it: ``rsdp.shard`` (RSDP) or ``fully_shard`` on every decoder layer, then the root
   (FSDP2), both over the rsdp backend;
4. ``to_empty(device="cpu")``: each rank allocates its own share only;
5. ``rsdp.load_pretrained``: each rank reads the slices of the checkpoint it holds.

The learning check runs before and after training on held-out mirrored games: their loss, and
the share of greedy next moves that are legal (read back in the ordinary notation). Printed
side by side: this rank's share of the model, the peak of what a step holds beyond it
(torch's ``MemTracker``), tokens/s, and the check. The strategies start from the same
checkpoint and see the same batches; they live in the same processes and take turns, one
step each, so a machine that slows down halfway slows them alike. ``--out DIR``: rank 0
writes ``lora.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the repository root: torch_rsdp, benchmarks
import chess_data  # noqa: E402
import chess_lm  # noqa: E402
import torch_rsdp  # noqa: E402,F401  (registers the "rsdp" backend)
from benchmarks import training_models as tm  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def mirror(move: str) -> str:
    """A move seen from Black's side: every rank r becomes 9 - r (``e2e4`` -> ``e7e5``)."""
    return (move[0] + str(9 - int(move[1])) + move[2] + str(9 - int(move[3])) + move[4:])


class MirroredMoves(chess_data.ChessMoves):
    """The chess games of :class:`chess_data.ChessMoves`, every move mirrored."""

    def game(self, index):
        return [mirror(m) for m in super().game(index)]

    @staticmethod
    def legal_fraction(completions, prefixes) -> float:
        """The share of ``completions`` that are legal, read back in the ordinary notation."""
        back = [" ".join(mirror(w) if len(w) >= 4 and w[1].isdigit() and w[3].isdigit() else w
                         for w in c.strip().split(" ")[:1]) for c in completions]
        return chess_data.legal_fraction(back, [[mirror(m) for m in p] for p in prefixes])


def build(strategy, path, lora_r):
    """The pretrained model, fine-tunable: meta, peft, sharded, materialised, loaded."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    import torch_rsdp.rsdp as rsdp
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r,
                                             target_modules=TARGETS, lora_dropout=0.0))
    if strategy == "rsdp":
        rsdp.shard(model, tp_plan="auto")  # attention and MLP as rotation units
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(0)  # the adapters' initialisation: the same on every rank and strategy
    rsdp.load_pretrained(model, path, init_adapters=True)
    return model


def check(model, data, a, rank):
    """(held-out loss, legal share of greedy next moves), the same on every rank."""
    model.eval()
    base = data.EVAL_OFFSET + rank * a.eval_prompts
    with torch.no_grad():
        x, y = data.batch(range(base, base + a.batch_size_per_device))
        loss = tm.lm_loss(model(input_ids=x).logits, y, chess_data.IGNORE)
        max_plies = max(1, (a.seq_len - 8) // 5)
        prompts = data.move_prompts(range(base, base + a.eval_prompts),
                                    plies=[1 + j % max_plies for j in range(a.eval_prompts)])
    texts = chess_lm.greedy_next_words(lambda x: model(input_ids=x).logits, prompts,
                                       a.seq_len)
    legal = MirroredMoves.legal_fraction(texts, [p for _, p in prompts])
    out = torch.tensor([loss.item(), legal], dtype=torch.float64)
    dist.all_reduce(out)
    model.train()
    return (out / dist.get_world_size()).tolist()


class Run:
    """One strategy's model, optimizer and measurements."""

    def __init__(self, strategy, a, data, rank, world):
        self.strategy, self.a, self.data, self.rank, self.world = strategy, a, data, rank, world
        self.model = build(strategy, a.pretrained, a.lora_r)
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                     lr=a.lr)
        self.before = check(self.model, data, a, rank)
        self.times, self.loss = [], float("nan")

    def step(self, i: int) -> float:
        B = self.a.batch_size_per_device
        first = (i * self.world + self.rank) * B
        x, y = self.data.batch(range(first, first + B))
        loss = tm.lm_loss(self.model(input_ids=x).logits, y, chess_data.IGNORE)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def timed_step(self, i: int) -> None:
        dist.barrier()
        t = time.perf_counter()
        self.loss = self.step(i)
        dist.barrier()
        if i >= 2:  # warm-up steps are not timed
            self.times.append(time.perf_counter() - t)

    def result(self) -> dict:
        a, model = self.a, self.model
        beyond = tm.peak_beyond(lambda: self.step(a.steps), model, self.opt)
        after = check(model, self.data, a, self.rank)
        step_s = tm.median(self.times)
        return dict(strategy=self.strategy, resident=tm.resident_bytes(model), beyond=beyond,
                    step_s=step_s,
                    tokens_per_s=self.world * a.batch_size_per_device * a.seq_len / step_s,
                    loss_before=self.before[0], legal_before=self.before[1],
                    loss_after=after[0], legal_after=after[1],
                    trainable=sum(p.numel() for p in model.parameters() if p.requires_grad))


def table(results) -> str:
    rows = []
    base = next(r for r in results if r["strategy"] == "fsdp2") if any(
        r["strategy"] == "fsdp2" for r in results) else results[0]
    for r in results:
        rows.append([r["strategy"], tm.fmt_bytes(r["resident"]), tm.fmt_bytes(r["beyond"]),
                     f"{(r['resident'] + r['beyond']) / (base['resident'] + base['beyond']):.2f}",
                     f"{r['tokens_per_s']:,.0f}", f"{r['loss_before']:.3f} -> {r['loss_after']:.3f}",
                     f"{100 * r['legal_before']:.0f}% -> {100 * r['legal_after']:.0f}%"])
    return tm.md_table(["run", "model share/rank", "step beyond it", "peak / FSDP2's",
                        "tokens/s", "held-out loss", "legal next moves"], rows)


def process_main(a) -> int:
    warnings.filterwarnings("ignore", message=".*DTensor random operators.*")
    import transformers
    transformers.logging.set_verbosity_error()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(a.threads or tm.default_threads(world))
    log = print if rank == 0 else (lambda *x, **k: None)
    data = MirroredMoves(seq_len=a.seq_len, seed=a.seed)
    runs = [Run(strategy, a, data, rank, world) for strategy in a.runs.split(",")]
    for i in range(a.steps):  # the runs take turns, one step each, each round led by the next
        for run in runs[i % len(runs):] + runs[:i % len(runs)]:
            run.timed_step(i)
        if (i + 1) % a.log_every == 0 or i + 1 == a.steps:
            log(f"step {i + 1:4d}/{a.steps} loss "
                + ", ".join(f"{r.strategy} {r.loss:.4f}" for r in runs), flush=True)
    results = []
    for run in runs:
        results.append(run.result())
        r = results[-1]
        log(f"=== {r['strategy']}: {r['trainable'] / 1e3:.1f} k trainable parameters, "
            f"{r['tokens_per_s']:,.0f} tokens/s, held-out loss {r['loss_before']:.3f} -> "
            f"{r['loss_after']:.3f}, legal next moves {100 * r['legal_before']:.0f}% -> "
            f"{100 * r['legal_after']:.0f}%", flush=True)
    log("\nLoRA fine-tuning of the pretrained chess model on mirrored games, "
        f"{world} ranks; memory: torch's MemTracker, rank 0\n" + table(results), flush=True)
    if rank == 0 and a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "lora.json"), "w") as f:
            json.dump({"args": vars(a), "world_size": world, "results": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


def spawned(rank, a, port):
    tm.tune_for_oversubscription(a.nproc)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(a.backend, rank=rank, world_size=a.nproc)
    process_main(a)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pretrained", required=True, help="a save_pretrained directory")
    p.add_argument("--runs", default="rsdp,fsdp2", help="strategies, in order: rsdp, fsdp2")
    p.add_argument("--nproc", type=int, default=None, help="spawn this many ranks")
    p.add_argument("--backend", default="rsdp")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--batch-size-per-device", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--eval-prompts", type=int, default=32, help="legal-move prompts per rank")
    p.add_argument("--seed", type=int, default=1, help="the games (pretraining used 0)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    bad = [s for s in a.runs.split(",") if s not in ("rsdp", "fsdp2")]
    if bad or a.steps < 3:
        p.error(f"unknown run(s) {bad}" if bad else "--steps must be at least 3")
    if not os.path.isfile(os.path.join(a.pretrained, "config.json")):
        p.error(f"--pretrained {a.pretrained!r} is not a save_pretrained directory")
    if a.nproc:
        mp.spawn(spawned, args=(a, tm.free_port()), nprocs=a.nproc)
        return 0
    dist.init_process_group(a.backend)
    return process_main(a)


if __name__ == "__main__":
    sys.exit(main())
