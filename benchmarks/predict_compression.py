"""What compression would gain at 64 x 8 ranks, as the planner predicts it from a profile of
the strategies suite's model taken here (no ranks started). See docs/benchmarks.md,
predict-compression.
"""
from __future__ import annotations

import argparse

from .common import RESULTS, free_port, md_table, write_result

CONFIGS = {"small": dict(vocab=2048, d_model=256, ffn=512, heads=4, layers=4, seq=32, batch=8),
           "medium": dict(vocab=8192, d_model=512, ffn=2048, heads=8, layers=6, seq=64,
                          batch=4)}
PLANS = ["no_shard", "no_shard+int8", "full_shard", "full_shard+int8", "full_shard+int4",
         "hybrid_shard", "hybrid_shard+int8"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="medium", choices=sorted(CONFIGS))
    p.add_argument("--links", default="1.25,3.125,12.5,50",
                   help="inter-node GB/s per node link (10, 25, 100, 400 Gbit/s)")
    p.add_argument("--intra", type=float, default=20.0, help="intra-node GB/s per rank")
    p.add_argument("--budget", default="8GiB")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import torch_rsdp  # noqa: F401  (registers the backend)
    import torch_rsdp.plan as plan

    from . import training_models as tm

    dist.init_process_group("rsdp", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    cfg = CONFIGS[args.config]
    torch.manual_seed(0)
    model = tm.TransformerLM(cfg["vocab"], cfg["d_model"], cfg["ffn"], cfg["heads"],
                             cfg["layers"], cfg["seq"])
    x = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]))
    n = sum(q.numel() for q in model.parameters())
    rows, table = [], []
    for gbps in (float(v) for v in args.links.split(",")):
        cl = plan.Cluster(nodes=64, ranks_per_node=8, intra_node_GBps=args.intra,
                          inter_node_GBps=gbps)
        t = {q: plan.predict(model, x, q, topology=cl).step_time_s for q in PLANS}
        a = plan.auto(model, x, memory_budget=args.budget, topology=cl, allow_compression=True)
        picked = sorted({str(v) for v in a.mapping.values()} | {str(a.default)})
        row = {"inter_node_GBps": gbps, "step_s": t, "auto_step_s": a.prediction.step_time_s,
               "auto_strategies": picked}
        rows.append(row)
        cells = []
        for q in PLANS:
            base = t[q.partition("+")[0]]
            cells.append(f"{t[q] * 1e3:.1f}" + (f" ({base / t[q]:.2f}x)" if "+" in q else ""))
        table.append([gbps, *cells, f"{a.prediction.step_time_s * 1e3:.1f} {','.join(picked)}"])
    text = (f"TransformerLM {args.config}: {n / 1e6:.1f} M parameters, micro-batch "
            f"{cfg['batch']} x {cfg['seq']}; Cluster(64 nodes x 8 ranks, intra {args.intra} "
            f"GB/s); predicted step ms (speed-up over the same plan exact)\n\n"
            + md_table(["link GB/s", *PLANS, "auto (compression)"], table))
    print(text)
    write_result(args.out, "predict_compression", {"config": cfg, "params": n,
                 "intra_node_GBps": args.intra, "rows": rows}, text, argv)
    dist.destroy_process_group()
    return 0
