#!/usr/bin/env python3
"""Fine-tune a small causal language model on chess moves with RSDP, FSDP2 or DDP.

    torchrun --nproc-per-node 4 examples/finetune_chess.py --strategy rsdp
    python examples/finetune_chess.py --strategy rsdp --nproc 2          # spawns its own ranks
    python examples/finetune_chess.py --strategy fsdp2 --backend gloo --nproc 2
    python examples/finetune_chess.py --compare --nproc 2                # all strategies, one table
    python examples/finetune_chess.py --compare --preset weights --nproc 2  # where weights dominate
    python examples/finetune_chess.py --strategy plan --plan auto --memory-budget 80MiB --nproc 2
    python examples/finetune_chess.py --nproc 2 --save /tmp/chess.pt     # then, to fine-tune it:
    python examples/finetune_chess.py --nproc 2 --init-from /tmp/chess.pt --lr 3e-4 --seed 1
    torchrun --nproc-per-node 4 --max-restarts 3 examples/finetune_chess.py --strategy plan \
        --plan rotate --checkpoint-dir /tmp/ckpt --checkpoint-every 10  # survives restarts

The data (examples/chess_data.py) are games the project generates itself, in coordinate
notation, tokenised by character; nothing is downloaded. The model is a Hugging Face
``LlamaForCausalLM`` built from a config (grouped-query attention, the chess vocabulary, 0.99 M
parameters by default: 300 steps of 32 games teach it to propose legal moves in about a minute
on two cores; ``--model transformerlm`` trains the benchmark's TransformerLM from
benchmarks/training_models.py instead). Strategies:

* ``rsdp``  -- ``torch_rsdp.rsdp.shard(model)``: weights sharded, shards rotate around the ring;
* ``fsdp2`` -- ``fully_shard`` on every block, then on the root (1-D device mesh);
* ``ddp``   -- ``DistributedDataParallel`` (``no_sync`` on all but the last micro-batch);
* ``plan``  -- ``torch_rsdp.plan``: ``--plan auto --memory-budget 8MiB`` lets the planner
  choose each block's strategy under that per-rank budget (its explanation is printed);
  ``--plan full_shard`` (any strategy name, one unit per block) or ``--plan my.json`` applies
  that plan. In ``--runs`` a plan run is written ``plan=auto:rsdp`` or ``plan=rotate:rsdp``.

Batch sizes follow the usual recipe: ``--batch-size-per-device`` sequences per forward;
``--gradient-accumulation-steps`` micro-batches per optimizer step; the total batch is
per-device x world size x accumulation (``--total-batch-size`` sets the accumulation for you).
``--checkpoint-activations`` recomputes each block's activations in backward.

Rank 0 prints progress every ``--log-every`` steps (step i/N, loss, tokens/s, time left), the
peak memory per rank over the last step as torch's MemTracker measures it, split into its
categories (parameters, buffers, gradients, optimizer state, activations, backward's
temporaries; training_models.METHOD) and peak RSS, and at the end a summary: held-out loss and
the fraction of greedy next moves that are legal, on held-out games cut after 1, 2, ... moves
up to the end of the sequence (shown for the opening, middle and last third of those cuts),
with a sample completion.

``--compare`` trains every run of ``--runs`` (default rsdp:rsdp, fsdp2:rsdp, ddp:rsdp,
fsdp2:gloo, plan=auto:rsdp) in the same processes, from the same initial weights on the same
batches, and prints one comparison table. The runs are built first and then take turns, one
optimizer step each, so a machine that gets busier or quieter halfway slows them alike; each
run's step times and elapsed time are its own steps', and peak RSS is the processes', all runs
together (with ``--on-failure shrink`` they run one after another, peak RSS reset between
them where Linux allows). Backends other than ``--backend`` run on extra process groups. With
``--out DIR`` rank 0 writes ``chess.json`` (every figure), ``chess_loss.png`` (loss against
each run's own time) and ``chess_memory.png`` (memory split and throughput per run) there
(examples/chess_report.py).

``--preset weights`` (the main job's second comparison: ``--compare --preset weights``) trains a
wider Llama (15.7 M parameters) on 2 games per rank with RSDP, FSDP2 and DDP: there the
weights, gradients and optimizer state dominate each rank's memory, and RSDP's peak per rank is
well below FSDP2's and DDP's (the table's and plot's split shows where it goes).

``--checkpoint-dir DIR`` saves a checkpoint every ``--checkpoint-every`` steps
(``torch.distributed.checkpoint``: every rank writes its own shards; model, optimizer,
learning-rate schedule, step and RNG state) and, at start, resumes from the newest complete one
in DIR, under any strategy and world size (examples/training_checkpoints.py). A job restarted
by ``torchrun --max-restarts`` or a Slurm requeue therefore ends with the weights of one that
never stopped; ``--fail-at-step N`` kills rank 1 after step N on the first attempt to show it.

``--on-failure shrink`` (with ``--checkpoint-dir``) goes on without a restart instead: the
survivors of a lost rank agree on who is gone, call ``dist.shrink_group``, rebuild the model on
the smaller group, load the newest checkpoint onto it and raise gradient accumulation so the
global batch stays the same (examples/training_recovery.py); the time from the failure to the
next completed step is printed. With ``--nproc`` the launcher then lets the survivors finish
(and hosts the store, so any rank may be the one lost)::

    python examples/finetune_chess.py --nproc 3 --steps 40 --gradient-accumulation-steps 2 \
        --checkpoint-dir /tmp/ckpt --checkpoint-every 5 --on-failure shrink --fail-at-step 12
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import signal
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
import chess_report  # noqa: E402
from benchmarks import training_models as tm  # noqa: E402

DEFAULT_COMPARE = "rsdp:rsdp,fsdp2:rsdp,ddp:rsdp,fsdp2:gloo,plan=auto:rsdp"

#: ``--preset NAME``: defaults for a whole setting (any option given explicitly still wins).
#: ``weights``: the main job's second comparison, where the weights dominate memory -- a wider
#: Llama (hidden 512, FFN 2048, 15.7 M parameters) on 2 games per rank: parameters, gradients
#: and AdamW's state are four times the activations, so how a strategy holds the weights
#: decides its peak: DDP holds everything on every rank, FSDP2 a 1/W shard plus the layers it
#: gathers whole (and their gradients), RSDP a 1/W shard plus two shards of one layer.
PRESETS = {
    "weights": dict(d_model=512, ffn=2048, heads=8, kv_heads=4, layers=4,
                    batch_size_per_device=2, steps=80, lr=2e-3, warmup_steps=10,
                    log_every=20, runs="rsdp:rsdp,fsdp2:rsdp,ddp:rsdp"),
}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--strategy", choices=tm.STRATEGIES + ("plan",), default="rsdp")
    p.add_argument("--plan", default="auto",
                   help="with --strategy plan: 'auto', a strategy name, or a plan JSON file")
    p.add_argument("--memory-budget", default=None,
                   help="per-rank budget for --plan auto (e.g. 8MiB; default: halfway between "
                        "the smallest budget any plan fits and what no_shard needs, as the "
                        "planner predicts them)")
    p.add_argument("--backend", default="rsdp", help="rsdp, gloo (CPU) or nccl (GPU)")
    p.add_argument("--compare", action="store_true", help="train every run of --runs in turn")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="defaults for a whole setting; 'weights': a wider model on small "
                        "batches, where weights, gradients and optimizer state dominate memory")
    p.add_argument("--runs", default=DEFAULT_COMPARE, help="strategy:backend list for --compare")
    p.add_argument("--nproc", type=int, default=None,
                   help="spawn this many ranks on this machine (instead of torchrun)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when available and the backend is not gloo")
    # data and model
    p.add_argument("--model", choices=("llama", "transformerlm"), default="llama")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="llama: key/value heads (GQA)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--checkpoint-activations", action="store_true")
    # optimisation
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--batch-size-per-device", type=int, default=16)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--total-batch-size", type=int, default=None,
                   help="if set: accumulation = total / (per-device x world)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.95), help="AdamW's betas")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0, help="initial weights and data")
    # checkpoints, reporting
    p.add_argument("--init-from", default=None, help="full state dict to start from")
    p.add_argument("--save", default=None, help="rank 0 saves the full state dict here")
    p.add_argument("--save-pretrained", default=None,
                   help="rank 0 writes the first rsdp run's model here with save_pretrained "
                        "(what examples/finetune_lora.py fine-tunes)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="checkpoint here (torch.distributed.checkpoint, every rank its shards) "
                        "and resume from the newest complete checkpoint found there")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="fault injection: --fail-rank kills itself (SIGKILL) after this step, "
                        "on the first attempt only (TORCHELASTIC_RESTART_COUNT unset or 0)")
    p.add_argument("--fail-rank", type=int, default=1, help="the rank --fail-at-step kills")
    p.add_argument("--on-failure", choices=("raise", "shrink"), default="raise",
                   help="raise: a lost rank ends the job (for torchrun --max-restarts or a "
                        "requeue to restart it); shrink: the survivors go on in process")
    p.add_argument("--failure-window", type=float, default=3.0,
                   help="--on-failure shrink: seconds the survivors wait for each other "
                        "before deciding who is gone")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--skip-steps", type=int, default=3, help="warm-up steps not timed")
    p.add_argument("--eval-prompts", type=int, default=64, help="legal-move prompts per rank")
    p.add_argument("--no-memory", action="store_true", help="do not track memory in the last step")
    p.add_argument("--threads", type=int, default=None, help="torch threads per rank")
    p.add_argument("--timeout", type=int, default=600, help="process-group timeout, seconds")
    p.add_argument("--json-out", default=None, help="rank 0 writes the results here")
    p.add_argument("--out", default=None,
                   help="rank 0 writes chess.json, chess_loss.png and chess_memory.png here")
    return p


# --------------------------------------------------------------------------------- the model


def build_model(a, vocab_size: int):
    """The model of ``--model``, from the seed (the same weights on every rank)."""
    if a.model == "transformerlm":
        return tm.TransformerLM(vocab_size, a.d_model, a.ffn, a.heads, a.layers, a.seq_len,
                                checkpoint_activations=a.checkpoint_activations)
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=a.d_model, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq_len,
                      tie_word_embeddings=False, use_cache=False,
                      pad_token_id=chess_data.PAD)
    model = LlamaForCausalLM(cfg)
    if a.checkpoint_activations:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    return model


def eval_max_plies(seq_len: int) -> int:
    """The most moves a legal-move prompt holds: room is left for one more (a move is at most
    5 characters and a space, after ``<bos>``)."""
    return max(1, (seq_len - 8) // 5)


def logits_of(out):
    return out.logits if hasattr(out, "logits") else out


# --------------------------------------------------------------------------------- one run


class Run:
    """One strategy on one process group: model, optimizer, data, training, evaluation."""

    def __init__(self, args, strategy, backend, group, device, data, recovery=None):
        self.args, self.strategy, self.backend = args, strategy, backend
        self.group, self.device, self.data = group, device, data
        self.recovery = recovery  # --on-failure shrink: training_recovery.ShrinkOnFailure
        self.turns = [self]  # the runs taking turns with this one (--compare), itself included
        # this run's own seconds, steps done and steps it will train (for the time left)
        self.spent, self.done, self.planned = 0.0, 0, 0
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.log = print if dist.get_rank() == 0 else (lambda *a, **k: None)

    def build(self):
        a = self.args
        torch.manual_seed(a.seed)
        model = build_model(a, self.data.vocab_size)
        self.n_params = tm.count_params(model)
        if a.init_from:
            model.load_state_dict(torch.load(a.init_from, map_location="cpu", weights_only=True))
        model.to(self.device)
        self.plan_text = None
        if self.strategy.startswith("plan"):
            model = self.build_plan(model)
        else:
            model = tm.wrap(model, self.strategy, self.device, self.group)
        self.model = model
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        other = [p for n, p in model.named_parameters() if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": a.weight_decay},
                  {"params": other, "weight_decay": 0.0}]
        if self.strategy.startswith("plan"):
            import torch_rsdp.plan as plan
            self.opt = plan.make_optimizer(model, torch.optim.AdamW, lr=a.lr,
                                           betas=tuple(a.betas), weight_decay=a.weight_decay)
        else:
            self.opt = torch.optim.AdamW(groups, lr=a.lr, betas=tuple(a.betas))
        warm, total = max(1, a.warmup_steps), max(1, a.steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min((s + 1) / warm, 0.5 * (1 + math.cos(
                math.pi * min(1.0, max(0, s - warm) / max(1, total - warm)))) * 0.9 + 0.1))

    def build_plan(self, model):
        """``plan=SPEC`` (or ``--strategy plan --plan SPEC``): apply a plan, or plan first."""
        import torch_rsdp.plan as plan
        a = self.args
        spec = self.strategy.partition("=")[2] or a.plan
        if spec != "auto":
            return plan.apply(model, tm.load_plan(spec), group=self.group)
        x, _ = self.data.batch(self.indices(0, 0))
        inputs = (x.to(self.device),)
        budget = a.memory_budget
        if budget is None:  # halfway between the tightest plan and replicating everything
            acc = a.gradient_accumulation_steps
            loose = plan.auto(model, inputs, memory_budget=1 << 40, group=self.group,
                              strategies=["no_shard"], accumulation=acc, verify=0)
            try:
                plan.auto(model, inputs, memory_budget=1, group=self.group, accumulation=acc,
                          verify=0)
            except plan.BudgetError as e:
                budget = (e.smallest_feasible_bytes + loose.prediction.peak_bytes) // 2
        p = plan.auto(model, inputs, memory_budget=budget, group=self.group,
                      accumulation=a.gradient_accumulation_steps)
        self.plan_text = p.explain()
        self.log(f"=== {self.strategy}:{self.backend}: the planner's choice\n{self.plan_text}",
                 flush=True)
        self.prediction = p.prediction
        return plan.apply(model, p, group=self.group)

    def indices(self, step, micro):
        a = self.args
        B = a.batch_size_per_device
        base = (step * a.gradient_accumulation_steps + micro) * self.world * B
        return range(base + self.rank * B, base + (self.rank + 1) * B)

    def mean(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return t.item() / self.world

    def train(self):
        for _ in self.steps():
            pass

    def steps(self):
        """Trains, yielding after every optimizer step (``--compare`` interleaves its runs'
        steps; the times and losses are this run's own)."""
        a = self.args
        accum, B = a.gradient_accumulation_steps, a.batch_size_per_device
        tokens_per_step = self.world * B * accum * a.seq_len
        ckpt, start, load_s = None, 0, 0.0
        if a.checkpoint_dir:
            from training_checkpoints import TrainingCheckpoints
            ckpt = TrainingCheckpoints(a.checkpoint_dir, a.checkpoint_every, log=self.log)
            t_load = time.perf_counter()
            start = ckpt.resume(self.model, self.opt, self.sched)
            load_s = time.perf_counter() - t_load
        self.data.prefetch(i for s in range(start, a.steps) for m in range(accum)
                           for i in self.indices(s, m))
        times, losses, mem = [], [], None
        skip = min(a.skip_steps, max(0, a.steps - start - 2))  # >= 1 timed step if possible
        spent = 0.0  # this run's own time: the others' turns in between are not counted
        self.planned = a.steps - start
        for step in range(start, a.steps):
            t_turn = time.perf_counter()
            last = step == a.steps - 1
            tracker = (tm.memtracker(self.model, self.opt)
                       if last and not a.no_memory and a.steps > 1 else None)
            t0 = time.perf_counter()
            with tracker if tracker is not None else contextlib.nullcontext():
                step_loss = 0.0
                for micro in range(accum):
                    if tracker is not None and micro:
                        # MemTracker refuses a root module's second forward in one tracking
                        # unless its per-module statistics (not used here) are cleared
                        tracker.reset_mod_stats()
                    x, y = self.data.batch(self.indices(step, micro))
                    x, y = x.to(self.device), y.to(self.device)
                    sync = micro == accum - 1 or not (self.strategy == "ddp"
                                                      or self.strategy.startswith("plan"))
                    with contextlib.nullcontext() if sync else self.no_sync():
                        loss = tm.lm_loss(logits_of(self.model(x)), y, chess_data.IGNORE) / accum
                        loss.backward()
                    step_loss += loss.item()
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            rec = self.recovery
            if rec is not None and rec.failed_at is not None and not hasattr(self, "recovery_s"):
                # the first step completed after a failure: what going on in process cost
                after = time.perf_counter() - rec.failed_at
                self.recovery_s = dict(rec.timings, load_s=load_s, failure_to_step_s=after,
                                       resumed_step=start, world_size=self.world)
                self.log(f"recovery: step {step + 1} completed {after:.2f} s after the failure "
                         f"(agreeing {rec.timings['agree_s']:.2f} s, shrinking "
                         f"{rec.timings['shrink_s']:.2f} s, loading step {start} "
                         f"{load_s:.2f} s; the rest is rebuilding the model and the step "
                         f"itself)", flush=True)
            if tracker is not None:
                mem = tm.tracked_peak(tracker)
            elif step - start >= skip:
                times.append(dt)
            if ckpt is not None:
                ckpt.maybe_save(step + 1, self.model, self.opt, self.sched)
            if self.fail_here(step + 1):
                os.kill(os.getpid(), 9)  # --fail-at-step: as a node failure would
            if step % a.log_every == 0 or last:
                mean_loss = self.mean(step_loss)
                spent += time.perf_counter() - t_turn
                t_turn = time.perf_counter()
                losses.append((step + 1, mean_loss, spent))
                recent = times[-a.log_every:] or [dt]
                self.spent, self.done = spent, step + 1 - start
                left = sum(r.left_s() for r in self.turns)  # every run's turns to come
                self.log(f"[{self.strategy}:{self.backend}] step {step + 1:4d}/{a.steps}  "
                         f"loss {mean_loss:.4f}  lr {self.sched.get_last_lr()[0]:.2e}  "
                         f"{tm.median(recent) * 1e3:6.1f} ms/step  "
                         f"{tokens_per_step / tm.median(recent):8,.0f} tokens/s  "
                         f"{spent:5.0f} s, {left:4.0f} s left", flush=True)
            spent += time.perf_counter() - t_turn
            self.spent, self.done = spent, step + 1 - start
            yield step
        elapsed = spent
        if not times:  # a single step: it was also the memory-tracked one
            times.append(dt)
        mem = mem or {}
        per_rank = tm.gather_floats([tm.median(times), tm.proc_status_kib("VmHWM") * 1024.0,
                                     mem.get("Total", float("nan")),
                                     *(mem.get(c, 0.0) for c in tm.MEM_CATS)], self.device)
        step_s = max(r[0] for r in per_rank)
        peak_rank = max(range(self.world), key=lambda r: per_rank[r][2]
                        if per_rank[r][2] == per_rank[r][2] else -1)
        self.result = {
            "strategy": self.strategy, "backend": self.backend, "world_size": self.world,
            "params": self.n_params, "tokens_per_step": tokens_per_step, "steps": a.steps,
            "timed_steps": len(times), "step_s": step_s, "tokens_per_s": tokens_per_step / step_s,
            "mem_peak_bytes": per_rank[peak_rank][2],
            # MemTracker's split of that peak (the rank with the highest)
            "mem_breakdown_bytes": dict(zip(tm.MEM_CATS.values(), per_rank[peak_rank][3:])),
            "rss_peak_bytes": max(r[1] for r in per_rank),
            "losses": [{"step": s, "loss": v, "elapsed_s": e} for s, v, e in losses],
            "final_loss": losses[-1][1], "elapsed_s": elapsed,
        }
        if hasattr(self, "recovery_s"):
            self.result["recovery"] = self.recovery_s
        pred = getattr(self, "prediction", None)
        if pred is not None:
            # the planner prices one micro-batch's forward, backward and step: one step here
            # is that times the accumulation (communication then counted in every micro-batch,
            # an upper bound: no_sync skips it)
            self.result.update(predicted_step_s=pred.step_time_s * a.gradient_accumulation_steps,
                               predicted_peak_bytes=pred.peak_bytes,
                               memory_budget_bytes=pred.budget_bytes)

    def left_s(self) -> float:
        """Seconds this run's remaining steps should take, at its pace so far."""
        return (self.planned - self.done) * self.spent / self.done if self.done else 0.0

    def fail_here(self, step: int) -> bool:
        """--fail-at-step: this rank dies after ``step``, on the first attempt only (neither
        restarted by torchrun nor recovered in process)."""
        a = self.args
        return (a.fail_at_step == step and self.rank == a.fail_rank
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
                and (self.recovery is None or self.recovery.failures == 0))

    def no_sync(self):
        if self.strategy.startswith("plan"):
            import torch_rsdp.plan as plan
            return plan.no_sync(self.model)
        return self.model.no_sync()

    @torch.no_grad()
    def evaluate(self):
        """Held-out loss, and the share of greedy next moves that are legal.

        Prompts are held-out games cut after ``1 .. max_plies`` moves in turn (``max_plies``:
        the most that leave room for one more move in the sequence), so the rate covers the
        whole sequence, not only the opening; it is also given per third of those cuts."""
        a, data = self.args, self.data
        B = a.batch_size_per_device
        base = data.EVAL_OFFSET + self.rank * max(B, a.eval_prompts)
        x, y = data.batch(range(base, base + B))
        eval_loss = self.mean(tm.lm_loss(logits_of(self.model(x.to(self.device))), y.to(self.device),
                                         chess_data.IGNORE).item())
        self.result.update(eval_loss=eval_loss, legal_move_rate=float("nan"))
        if a.eval_prompts <= 0:
            return
        max_plies = eval_max_plies(a.seq_len)
        first = self.rank * a.eval_prompts  # global prompt number: cuts cycle over all ranks
        cuts = [1 + (first + j) % max_plies for j in range(a.eval_prompts)]
        prompts = data.move_prompts(range(base, base + a.eval_prompts), plies=cuts)
        texts = chess_lm.greedy_next_words(lambda x: logits_of(self.model(x)), prompts,
                                           a.seq_len, self.device)
        ok = [chess_data.legal_fraction([t], [p]) for t, (_, p) in zip(texts, prompts)]
        # per third of the cuts: [legal, prompts] summed over ranks
        thirds = torch.zeros(3, 2, dtype=torch.float64, device=self.device)
        for (_, prefix), v in zip(prompts, ok):
            third = min(2, 3 * (len(prefix) - 1) // max_plies)
            thirds[third, 0] += v
            thirds[third, 1] += 1
        dist.all_reduce(thirds, group=self.group)
        thirds = thirds.cpu()
        self.result.update(
            legal_move_rate=float(thirds[:, 0].sum() / thirds[:, 1].sum()),
            legal_move_rate_by_third=[float(t[0] / t[1]) if t[1] else float("nan")
                                      for t in thirds],
            legal_move_prompts=int(thirds[:, 1].sum()),
            sample_completion={"moves": " ".join(prompts[-1][1]),
                               "next": texts[-1].strip().split(" ")[0] if texts[-1].strip()
                               else "", "legal": bool(ok[-1])})

    def save_pretrained(self, path):
        """The trained Llama as a Hugging Face checkpoint: gathered whole on rank 0, which
        writes it into an unsharded copy of the architecture (collective)."""
        import torch_rsdp.plan as plan
        sd = plan.full_state_dict(self.model)  # planned and rsdp.shard models alike
        if dist.get_rank() == 0:
            plain = build_model(self.args, self.data.vocab_size)
            plain.load_state_dict(sd)
            plain.save_pretrained(path)
            self.log(f"saved the pretrained model to {path} (save_pretrained)")

    def save(self, path):
        if self.strategy.startswith("plan") or self.strategy == "rsdp":
            import torch_rsdp.plan as plan
            sd = plan.full_state_dict(self.model)
        elif self.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                                 get_model_state_dict)
            sd = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        else:
            sd = self.model.module.state_dict()
        if dist.get_rank() == 0:
            torch.save({k: v.detach().cpu() for k, v in sd.items()}, path)
            self.log(f"saved full state dict ({len(sd)} tensors) to {path}")


# --------------------------------------------------------------------------------- per process


def resolve_device(args):
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()
                                 and args.backend != "gloo"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def process_main(args) -> int:
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")  # FSDP2 root output
    backends = {args.backend} | ({b for _, b in args.runs} if args.compare else set())
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_env)))
    torch.set_num_threads(args.threads or tm.default_threads(local_world))
    rsdp_env = tm.tune_for_oversubscription(local_world)  # ranks > cores: no spinning
    unavailable = {b: tm.backend_import(b) for b in backends}
    main_backend = args.backend if unavailable[args.backend] is None else "gloo"
    device = resolve_device(args)
    dist.init_process_group(main_backend, timeout=datetime.timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    def log(*a, **k):  # rank 0's, whoever that is after a shrink
        if dist.get_rank() == 0:
            print(*a, **k)

    recovery = None
    if args.on_failure == "shrink":
        from training_recovery import ShrinkOnFailure
        recovery = ShrinkOnFailure(args.failure_window)
    if args.total_batch_size:
        per = args.batch_size_per_device * world
        if args.total_batch_size % per:
            raise SystemExit(f"--total-batch-size {args.total_batch_size} is not a multiple of "
                             f"per-device {args.batch_size_per_device} x world {world}")
        args.gradient_accumulation_steps = args.total_batch_size // per
    groups = {main_backend: None}
    for b in sorted(backends):
        if b not in groups and unavailable[b] is None:
            groups[b] = dist.new_group(backend=b)
    runs = args.runs if args.compare else [(args.strategy, args.backend)]
    runs = [(f"plan={args.plan}" if s == "plan" else s, b) for s, b in runs]
    data = chess_data.ChessMoves(args.seq_len, args.seed)
    total = args.batch_size_per_device * world * args.gradient_accumulation_steps
    log(f"chess fine-tuning: {world} ranks ({local_world} per node), device {device}, "
        f"{torch.get_num_threads()} thread(s)/rank; batch {args.batch_size_per_device}/device x "
        f"{world} x accumulation {args.gradient_accumulation_steps} = {total} sequences of "
        f"{args.seq_len} tokens per step; {args.steps} steps; vocab {data.vocab_size}; {rsdp_env}; "
        f"load average {tm.load_average()}", flush=True)
    log(f"sample game: {data.text(0)}", flush=True)
    # [Note: runs take turns] With --compare the runs are built first and then take turns,
    # one optimizer step each: a machine that gets busier or quieter halfway (other work, a
    # CPU warming up) then slows every run alike, where runs one after another would hand
    # the whole change to whichever ran then (the same reason the rsdp-fsdp2 benchmark suite
    # interleaves its variants). Each run's times are its own steps'. --on-failure shrink
    # rebuilds a run after a lost rank, so it keeps runs one after another.
    turns = args.compare and recovery is None
    slots = []  # per run: its Run, or the result of one that could not start
    if turns:
        tm.reset_peak_rss()
    for strategy, backend in runs:
        why = unavailable.get(backend)
        if why is None and strategy == "rsdp":
            why = tm.rsdp_import()[1]
            why = None if why is None else f"rsdp: not available: {why}"
        if why is not None:
            log(f"=== {strategy}:{backend}: skipped: {why}", flush=True)
            slots.append({"strategy": strategy, "backend": backend, "error": why})
            continue
        if turns:
            run = Run(args, strategy, backend, groups[backend], device, data)
            run.build()
            log_built(run, args, log)
            slots.append(run)
            continue
        tm.reset_peak_rss()
        while True:
            run = Run(args, strategy, backend, groups[backend], device, data, recovery)
            run.build()
            log_built(run, args, log)
            try:
                run.train()
                break
            except RuntimeError as e:  # a collective failed: a rank (or node) was lost
                if recovery is None:
                    raise
                old_world = dist.get_world_size()
                del run
                gc.collect()
                recovery.recover(e)
                keep_global_batch(args, old_world, log)
        slots.append(finish(run, args, log))
        del run
        gc.collect()
        dist.barrier()
    if turns:
        take_turns([x for x in slots if isinstance(x, Run)])
    results = [finish(x, args, log, shared_rss=True) if isinstance(x, Run) else x
               for x in slots]
    del slots
    rank, world = dist.get_rank(), dist.get_world_size()  # smaller after a shrink
    log("\n" + chess_report.table(results))
    for r in results:
        if "predicted_step_s" in r:
            log(f"{r['strategy']}: predicted step {r['predicted_step_s'] * 1e3:.1f} ms "
                f"(per micro-batch x {args.gradient_accumulation_steps}), measured "
                f"{r['step_s'] * 1e3:.1f} ms; predicted peak/rank "
                f"{tm.fmt_bytes(r['predicted_peak_bytes'])}, measured "
                f"{tm.fmt_bytes(r['mem_peak_bytes'])}, budget "
                f"{tm.fmt_bytes(r['memory_budget_bytes'])}")
    if turns:
        log("\nthe runs took turns, one optimizer step each, in the same processes: step "
            "times are each run's own; peak RSS/rank is the processes', all runs together")
    log(f"\nmemory = {tm.METHOD}\nlegal moves: held-out games cut after 1 to "
        f"{eval_max_plies(args.seq_len)} moves, greedy next move; opening/middle/end: the "
        f"thirds of those cuts\nload average now: {tm.load_average()}", flush=True)
    n_params = next((r["params"] for r in results if "params" in r), 0)
    meta = {"args": {k: v for k, v in vars(args).items() if k != "runs"},
            "runs": [f"{s}:{b}" for s, b in runs], "world_size": world,
            "runs_took_turns": turns,
            "load_average": tm.load_average(),
            "title": (f"{args.model} {n_params / 1e6:.1f} M parameters, batch "
                      f"{args.batch_size_per_device}x{args.seq_len} per rank, {world} ranks"
                      + (f" (--preset {args.preset})" if args.preset else ""))}
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({**meta, "results": results}, f, indent=1)
    if rank == 0 and args.out:
        paths = chess_report.write(results, meta, args.out)
        log("written: " + ", ".join(paths), flush=True)
    dist.destroy_process_group()
    return 0 if any("error" not in r for r in results) else 2


def log_built(run: Run, args, log) -> None:
    log(f"=== {run.strategy}:{run.backend}: {run.n_params / 1e6:.2f} M parameters"
        + (", activation checkpointing" if args.checkpoint_activations else ""), flush=True)


def take_turns(runs) -> None:
    """Trains ``runs`` one optimizer step each in turn until all are done ([Note: runs take
    turns]); every rank steps them in the same order, as their collectives need."""
    for r in runs:
        r.turns = runs
    steps = [r.steps() for r in runs]
    while steps:
        for s in list(steps):
            if next(s, None) is None:
                steps.remove(s)


def finish(run: Run, args, log, shared_rss: bool = False) -> dict:
    """Evaluates ``run``, logs its summary line and returns its result. ``shared_rss``: the
    runs took turns in these processes, so peak RSS is theirs together."""
    run.evaluate()
    if args.save and not args.compare:
        run.save(args.save)
    if args.save_pretrained and run.strategy == "rsdp" and not args.__dict__.get("_saved"):
        run.save_pretrained(args.save_pretrained)
        args._saved = True
    r = run.result
    r["rss_all_runs"] = shared_rss
    sample = r.get("sample_completion")
    log(f"=== {run.strategy}:{run.backend}: {r['tokens_per_s']:,.0f} tokens/s "
        f"({r['step_s'] * 1e3:.0f} ms/step, median of {r['timed_steps']} timed steps), "
        f"peak memory/rank {tm.fmt_bytes(r['mem_peak_bytes'])} (MemTracker), peak RSS/rank "
        f"{tm.fmt_bytes(r['rss_peak_bytes'])}{' (all runs)' if shared_rss else ''}, final "
        f"loss {r['final_loss']:.4f}, held-out loss {r['eval_loss']:.4f}, legal next moves "
        + (f"{100 * r['legal_move_rate']:.0f}% of {r['legal_move_prompts']}"
           if r.get("legal_move_prompts") else "not checked (--eval-prompts 0)")
        + f", {r['elapsed_s']:.0f} s", flush=True)
    if sample:
        log(f"    sample: after {sample['moves']!r} it plays {sample['next']!r} "
            f"({'legal' if sample['legal'] else 'not legal'})", flush=True)
    return r


def keep_global_batch(args, old_world: int, log) -> None:
    """After a shrink: the same sequences per step, by more micro-batches per rank."""
    B, world = args.batch_size_per_device, dist.get_world_size()
    total = old_world * B * args.gradient_accumulation_steps
    accum, rest = divmod(total, world * B)
    if rest:
        accum = max(1, round(total / (world * B)))
        log(f"recovery: {total} sequences per step do not split over {world} ranks x {B}; "
            f"now {world * B * accum} per step (from here the run differs from one that never "
            f"failed)", flush=True)
    else:
        log(f"recovery: gradient accumulation {args.gradient_accumulation_steps} -> {accum}: "
            f"still {total} sequences per step on {world} ranks", flush=True)
    args.gradient_accumulation_steps = accum


def spawn_tolerant(args) -> int:
    """``--nproc`` with ``--on-failure shrink``: the survivors of a killed rank finish
    (torch.multiprocessing would stop them all), and this process hosts the store, so the
    rank lost may be rank 0."""
    port = tm.free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # every rank a client of this store
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=spawned, args=(i, args, port)) for i in range(args.nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    del store
    codes = [p.exitcode for p in procs]
    lost = [r for r, c in enumerate(codes) if c == -signal.SIGKILL]
    failed = [r for r, c in enumerate(codes) if c not in (0, -signal.SIGKILL)]
    if lost:
        print(f"launcher: rank(s) {lost} were killed; {len(codes) - len(lost)} went on", flush=True)
    if failed:
        print(f"launcher: rank(s) {failed} failed (exit codes {[codes[r] for r in failed]})",
              flush=True)
    return 1 if failed or len(lost) == len(codes) else 0


def spawned(local_rank, args, port):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(args.nproc), LOCAL_WORLD_SIZE=str(args.nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rc = process_main(args)
    if rc:
        sys.exit(rc)


def main(argv=None) -> int:
    parser = build_parser()
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    runs = []
    for item in args.runs.split(","):
        s, _, b = item.strip().partition(":")
        if s:
            if s not in tm.STRATEGIES and not s.startswith("plan="):
                raise SystemExit(f"unknown strategy {s!r} in --runs")
            runs.append((s, b or args.backend))
    args.runs = runs
    if args.checkpoint_dir and args.compare:
        raise SystemExit("--checkpoint-dir trains one run: not with --compare")
    if args.on_failure == "shrink" and not args.checkpoint_dir:
        raise SystemExit("--on-failure shrink reloads the newest checkpoint: give --checkpoint-dir")
    if args.nproc and "RANK" not in os.environ and args.on_failure == "shrink":
        return spawn_tolerant(args)
    if args.nproc and "RANK" not in os.environ:
        try:
            mp.start_processes(spawned, args=(args, tm.free_port()), nprocs=args.nproc,
                               start_method="spawn")
        except mp.ProcessExitedException as exc:
            return exc.exit_code or 1
        return 0
    return process_main(args)


if __name__ == "__main__":
    sys.exit(main())
