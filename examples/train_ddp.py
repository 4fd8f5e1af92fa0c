#!/usr/bin/env python3
"""Train a small causal transformer language model with DistributedDataParallel on CPU.

The data set is synthetic and generated on the fly from --seed: token sequences drawn from a
fixed random Markov chain (every token has four possible successors with probabilities
0.55/0.25/0.15/0.05), so the loss falls from ln(vocab) ~ 6.2 towards the chain's entropy
(~1.1 nats) within a few hundred steps. Each step draws one global batch and gives rank r rows
[r*B, (r+1)*B), so a run is the same for every backend with the same seed and world size.

Launch with torchrun, or let the script spawn the ranks itself:

    torchrun --nproc-per-node 4 examples/train_ddp.py --backend rsdp
    python examples/train_ddp.py --backend rsdp --nproc 4
    python examples/train_ddp.py --backend gloo --nproc 4 --steps 50

A backend other than gloo/nccl/mpi/ucc is loaded with `import torch_<backend>` (torch_rsdp
registers "rsdp"). Rank 0 prints the loss (mean over ranks) every --log-every steps, the time
per step split into forward / backward (which includes DDP's gradient all-reduce) / optimizer,
tokens/s, and at the end a checksum of the parameters (also checked equal on every rank).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import importlib.util
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

BUILTIN_BACKENDS = {"gloo", "nccl", "mpi", "ucc", "xccl"}
# Let an uninstalled checkout work: torch_rsdp is found in the repository root as a fallback
# (appended, so an installed torch_rsdp takes precedence).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_backend(name: str) -> None:
    """Import torch_<name> (it registers the backend) and its compiled torch_<name>._C, if any."""
    if name not in BUILTIN_BACKENDS:
        importlib.import_module(f"torch_{name}")
        if importlib.util.find_spec(f"torch_{name}._C") is not None:
            importlib.import_module(f"torch_{name}._C")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", default="gloo", help="torch.distributed backend, e.g. rsdp, gloo")
    p.add_argument("--nproc", type=int, default=None,
                   help="spawn this many ranks (when not launched by torchrun); default 1")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=512, help="feed-forward width")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--skip-steps", type=int, default=5,
                   help="first steps left out of the timing statistics (warm-up)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: cores // local ranks)")
    p.add_argument("--timeout", type=int, default=300, help="process-group timeout, seconds")
    p.add_argument("--json-out", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--save-params", default=None, help="rank 0 saves the final state_dict here")
    return p


# --------------------------------------------------------------------------- data and model


class MarkovData:
    """Deterministic synthetic token sequences from a sparse random Markov chain."""

    PROBS = torch.tensor([0.55, 0.25, 0.15, 0.05])

    def __init__(self, vocab: int, seq_len: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.successors = torch.randint(0, vocab, (vocab, len(self.PROBS)), generator=g)

    def entropy(self) -> float:
        return float(-(self.PROBS * self.PROBS.log()).sum())

    def global_batch(self, step: int, rows: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.empty(rows, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (rows,), generator=g)
        choice = torch.multinomial(self.PROBS, rows * self.seq_len, replacement=True,
                                   generator=g).view(rows, self.seq_len)
        for i in range(self.seq_len):
            tokens[:, i + 1] = self.successors[tokens[:, i], choice[:, i]]
        return tokens

    def batch(self, step: int, rank: int, world: int, batch_size: int):
        tokens = self.global_batch(step, world * batch_size)[rank * batch_size:(rank + 1) * batch_size]
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class TinyCausalLM(nn.Module):
    def __init__(self, vocab, d_model, layers, heads, ffn, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("causal_mask",
                             nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, x):
        t = x.size(1)
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        h = self.encoder(h, mask=self.causal_mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def param_checksum(model: nn.Module) -> dict:
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    return {
        "sum": flat.double().sum().item(),
        "abs_sum": flat.double().abs().sum().item(),
        "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16],
        "numel": flat.numel(),
    }


# --------------------------------------------------------------------------- training


def train(args) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    log = print if rank == 0 else (lambda *a, **k: None)
    torch.manual_seed(args.seed)
    data = MarkovData(args.vocab, args.seq_len, args.seed)
    model = TinyCausalLM(args.vocab, args.d_model, args.layers, args.heads, args.ffn, args.seq_len)
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = world * args.batch_size * args.seq_len
    log(f"backend {args.backend}, {world} ranks, {args.threads} thread(s)/rank, "
        f"{n_params / 1e6:.2f} M params, {tokens_per_step} tokens/step, seed {args.seed}; "
        f"loss starts near ln({args.vocab}) = {math.log(args.vocab):.2f}, "
        f"floor ~ {data.entropy():.2f}", flush=True)

    fwd, bwd, optim, total, losses = [], [], [], [], []
    t_run = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = data.batch(step, rank, world, args.batch_size)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()  # DDP all-reduces the gradient buckets here
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if step > args.skip_steps or args.steps <= args.skip_steps:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optim.append(t3 - t2)
            total.append(t3 - t0)
        if step % args.log_every == 0 or step == args.steps or step == 1:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            mean_loss = mean_loss.item() / world
            losses.append((step, mean_loss))
            recent = total[-args.log_every:] or [t3 - t0]
            ms = statistics.median(recent) * 1e3
            log(f"step {step:5d}/{args.steps}  loss {mean_loss:.4f}  {ms:7.1f} ms/step  "
                f"{tokens_per_step / (ms / 1e3):10,.0f} tok/s", flush=True)
    elapsed = time.perf_counter() - t_run

    step_s = statistics.mean(total)
    check = param_checksum(model)
    # Every rank must hold the same parameters after DDP training.
    mine = torch.tensor([check["sum"], check["abs_sum"]], dtype=torch.float32)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    same = all(torch.equal(t, every[0]) for t in every)
    summary = {
        "backend": args.backend, "world_size": world, "steps": args.steps, "seed": args.seed,
        "batch_size_per_rank": args.batch_size, "seq_len": args.seq_len,
        "tokens_per_step": tokens_per_step, "params": n_params, "threads_per_rank": args.threads,
        "timed_steps": len(total),
        "step_ms_mean": step_s * 1e3, "step_ms_median": statistics.median(total) * 1e3,
        "forward_ms": statistics.mean(fwd) * 1e3, "backward_allreduce_ms": statistics.mean(bwd) * 1e3,
        "optimizer_ms": statistics.mean(optim) * 1e3,
        "steps_per_s": 1.0 / step_s, "tokens_per_s": tokens_per_step / step_s,
        "elapsed_s": elapsed, "losses": losses, "final_loss": losses[-1][1],
        "checksum": check, "params_equal_on_all_ranks": same,
    }
    log(f"time/step (mean of {len(total)} steps after {min(args.skip_steps, args.steps)} warm-up): "
        f"{step_s * 1e3:.1f} ms = forward {summary['forward_ms']:.1f} + backward incl. all-reduce "
        f"{summary['backward_allreduce_ms']:.1f} + optimizer {summary['optimizer_ms']:.1f}")
    log(f"throughput: {summary['steps_per_s']:.2f} steps/s, {summary['tokens_per_s']:,.0f} tokens/s; "
        f"wall {elapsed:.1f} s for {args.steps} steps")
    log(f"final loss {summary['final_loss']:.4f}")
    log(f"param checksum: sum={check['sum']:.10e} abs_sum={check['abs_sum']:.10e} "
        f"sha256[:16]={check['sha256']} ({check['numel']} values); "
        f"identical on all {world} ranks: {'yes' if same else 'NO'}", flush=True)
    if rank == 0:
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=1)
        if args.save_params:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                       args.save_params)
    if not same:
        raise RuntimeError("parameters differ across ranks after training")


def run_rank(args) -> None:
    """Body of one rank; RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are in the environment."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(args.threads)
    if args.backend not in BUILTIN_BACKENDS:
        load_backend(args.backend)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        train(args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawned_rank(rank: int, args, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    run_rank(args)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "vocab", "d_model", "layers", "heads",
                 "ffn", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.d_model % args.heads:
        parser.error("--d-model must be divisible by --heads")
    if args.backend not in BUILTIN_BACKENDS:
        try:
            load_backend(args.backend)
        except Exception as exc:  # noqa: BLE001
            parser.error(f"backend {args.backend!r}: cannot import torch_{args.backend} ({exc})")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        if args.nproc is not None and args.nproc != int(os.environ["WORLD_SIZE"]):
            print(f"note: --nproc {args.nproc} ignored under torchrun "
                  f"(WORLD_SIZE={os.environ['WORLD_SIZE']})", file=sys.stderr)
        run_rank(args)
        return 0
    world = args.nproc or 1
    if world < 1:
        parser.error("--nproc must be >= 1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if world == 1:
        spawned_rank(0, args, 1, port)
    else:
        mp.spawn(spawned_rank, args=(args, world, port), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
