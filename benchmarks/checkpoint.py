"""Checkpoint cost under each plan: torch.distributed.checkpoint's sharded save and load and
async_save (DCP's stager and plan.CopyOnceStager) against a gathered torch.save, and the bytes
each rank writes. See docs/benchmarks.md, checkpoint.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import tempfile
import time

from . import training_models as tm
from .common import RESULTS, md_table, run_ranks, slowest, verdicts, write_result


def _model():
    return tm.llama(vocab_size=24, hidden_size=384, intermediate_size=1024,
                    num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                    max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)


def _timed(fn) -> float:
    import torch.distributed as dist
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return slowest([time.perf_counter() - t0])[0]


def worker(rank, world, args, root):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    import torch_rsdp.plan as plan
    # async_save plans over collectives from its background thread: a group of its own
    ckpt_group = dist.new_group()
    rows = []
    for name in args.plans:
        model = plan.apply(_model(), name)
        opt = plan.make_optimizer(model, torch.optim.AdamW, lr=1e-4)
        tm.hf_step(model, opt, tm.token_batch(24, 2, 32, rank))  # optimizer state to save
        res = {"plan": name, "world": world}
        times = {k: [] for k in ("sharded_save", "gathered_save", "async_block",
                                 "async_once_block", "sharded_load", "gathered_load")}
        for i in range(args.repeats):
            path = os.path.join(root, f"{name}-{i}")
            full = os.path.join(root, f"{name}-{i}.pt")

            def state():
                msd, osd = get_state_dict(model, opt)
                return {"model": msd, "optim": osd}

            def gathered_save():
                msd, osd = get_state_dict(model, opt, options=StateDictOptions(
                    full_state_dict=True, cpu_offload=True))
                if rank == 0:
                    torch.save({"model": msd, "optim": osd}, full)

            def async_save(suffix, **stager):
                """The time async_save blocks; then waits for the write to finish."""
                future = []
                t = _timed(lambda: future.append(dcp.async_save(
                    state(), checkpoint_id=path + suffix, process_group=ckpt_group, **stager)))
                future[0].result()
                dist.barrier()
                return t

            def sharded_load():
                sd = state()
                dcp.load(sd, storage_reader=plan.CheckpointReader(path))
                set_state_dict(model, opt, model_state_dict=sd["model"],
                               optim_state_dict=sd["optim"])

            def gathered_load():
                sd = torch.load(full, weights_only=False)
                set_state_dict(model, opt, model_state_dict=sd["model"],
                               optim_state_dict=sd["optim"],
                               options=StateDictOptions(full_state_dict=True))

            times["sharded_save"].append(_timed(lambda: dcp.save(state(), checkpoint_id=path)))
            times["gathered_save"].append(_timed(gathered_save))
            times["async_block"].append(async_save("-async"))
            # the hooks' copies are the staged state dict
            times["async_once_block"].append(async_save("-once",
                                                        async_stager=plan.CopyOnceStager()))
            times["sharded_load"].append(_timed(sharded_load))
            times["gathered_load"].append(_timed(gathered_load))
            mine = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, f"__{rank}_*")))
            sizes = [0] * world
            dist.all_gather_object(sizes, mine)
            res["bytes_per_rank"] = sizes
            res["full_file_bytes"] = os.path.getsize(full) if rank == 0 else 0
        for k, v in times.items():
            res[k + "_s"] = statistics.median(v)
        rows.append(res)
        del model, opt
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--plans", default="rotate,full_shard")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    args.plans = [s.strip() for s in args.plans.split(",") if s.strip()]
    root = tempfile.mkdtemp(prefix="rsdp-ckpt-")
    try:
        rows = run_ranks(worker, args.nproc, args, root, threads=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    body, checks = [], []
    for r in rows:
        W, share = r["world"], max(r["bytes_per_rank"]) / sum(r["bytes_per_rank"])
        save, asyn, once = (r[k] / d for k, d in (
            ("sharded_save_s", r["gathered_save_s"]), ("async_block_s", r["sharded_save_s"]),
            ("async_once_block_s", r["sharded_save_s"])))
        body.append([r["plan"], W, *(f"{r[k + '_s']:.3f}" for k in (
            "sharded_save", "gathered_save")), f"{save:.2f}x", f"{r['async_block_s']:.3f}",
            f"{asyn:.2f}x", f"{r['async_once_block_s']:.3f}", f"{once:.2f}x",
            f"{r['sharded_load_s']:.3f}", f"{r['gathered_load_s']:.3f}",
            f"{max(r['bytes_per_rank']):,}", f"{share:.3f}"])
        checks += [dict(check=f"{r['plan']}: each rank writes <= 1/W + 5% ({1 / W + 0.05:.3f})",
                        ok=share <= 1 / W + 0.05, detail=f"{share:.3f}"),
                   dict(check=f"{r['plan']}: sharded save <= 0.5x gathered", ok=save <= 0.5,
                        detail=f"{save:.2f}x"),
                   dict(check=f"{r['plan']}: async_save blocks <= 0.2x sync", ok=asyn <= 0.2,
                        detail=f"{asyn:.2f}x"),
                   dict(check=f"{r['plan']}: async_save with CopyOnceStager blocks <= 0.2x "
                              f"sync", ok=once <= 0.2, detail=f"{once:.2f}x")]
    text = md_table(["plan", "ranks", "sharded save s", "gathered save s", "ratio",
                     "async blocks s", "ratio to sync", "async, CopyOnceStager, blocks s",
                     "ratio to sync", "sharded load s", "gathered load s", "max bytes/rank",
                     "share"], body) + "\n\n" + verdicts(checks)
    print(text)
    write_result(args.out, "checkpoint", {"rows": rows, "checks": checks}, text, argv)
    return 0
