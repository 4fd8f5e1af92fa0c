"""RSDP rotation units against per-layer rotation on a Hugging Face Llama built from a config.

Runs, each in fresh processes, same model and batches: `layer` (`shard(model)`, every Linear
rotates on its own), `units` (`tp_plan="auto"`: attention and MLP rotate as one buffer each),
`units-recompute` (`unit_recompute=True`). Median forward and backward time (slowest rank),
ring shifts per forward, loss. With more ranks than cores, RSDP_SPIN_US=0 unless set (a
spinning rank steals its peer's core).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .common import RESULTS, free_port, md_table, write_result

RUNS = {"layer": dict(), "units": dict(tp_plan="auto"),
        "units-recompute": dict(tp_plan="auto", unit_recompute=True)}


def _worker(rank, args, run, port, out):
    import transformers as tf

    import torch_rsdp  # noqa: F401  (registers "rsdp")
    import torch_rsdp.rsdp as rsdp

    tf.logging.set_verbosity_error()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))
    dist.init_process_group("rsdp", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world_size)
    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    cfg = tf.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.ffn, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = rsdp.shard(tf.LlamaForCausalLM(cfg).to(dev), **RUNS[run])
    ring = rsdp.rsdp_state(model).ring
    gen = torch.Generator().manual_seed(rank)
    fwd, bwd, per_fwd = [], [], 0

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for step in range(args.steps + 1):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        before = ring.hops
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        sync()
        t1 = time.perf_counter()
        per_fwd = ring.hops - before
        loss.backward()
        sync()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if step:  # the first step warms up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    out[rank] = (statistics.median(fwd), statistics.median(bwd), per_fwd, loss.item())
    dist.destroy_process_group()



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    if args.world_size > (os.cpu_count() or 1):
        os.environ.setdefault("RSDP_SPIN_US", "0")
    rows = {}
    for run in args.runs.split(","):
        out = mp.Manager().dict()
        mp.spawn(_worker, args=(args, run, free_port(), out), nprocs=args.world_size)
        res = [out[r] for r in range(args.world_size)]
        rows[run] = dict(fwd_ms=1e3 * max(r[0] for r in res), bwd_ms=1e3 * max(r[1] for r in res),
                         shifts_per_forward=res[0][2],
                         loss=sum(r[3] for r in res) / len(res))
    text = md_table([f"run ({args.world_size} ranks, {args.device})", "forward ms",
                     "backward ms", "ring shifts per forward", "loss"],
                    [[run, f"{r['fwd_ms']:.1f}", f"{r['bwd_ms']:.1f}", r["shifts_per_forward"],
                      f"{r['loss']:.6f}"] for run, r in rows.items()])
    print(text)
    write_result(args.out, "rsdp_units", rows, text, argv)
    return 0
