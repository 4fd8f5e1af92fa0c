"""Lightning's stock ``Trainer`` with ``strategy=RSDPStrategy(plan=...)``: the strategy shards
the ``LightningModule`` with a torch_rsdp plan, as Lightning's FSDP strategy would with FSDP.

    torchrun --nproc_per_node 2 examples/lightning.py                  # plan "rotate"
    torchrun --nproc_per_node 2 examples/lightning.py --plan full_shard
    torchrun --nproc_per_node 2 examples/lightning.py --plan rsdp      # strategy="rsdp"
    torchrun --nproc_per_node 2 examples/lightning.py --resume         # from the last checkpoint

A ``LlamaForCausalLM`` built from a config learns the chess games of ``chess_data.py``, with
gradient accumulation, clipping and a learning-rate schedule, Lightning's checkpoints every 20
steps. The lines that are not a stock Lightning script: ``import torch_rsdp`` (which registers
``strategy="rsdp"``) and the strategy. Its checkpoints hold whole tensors, which load back at
any world size (docs/integrations.md).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

# This file is examples/lightning.py: its own directory must not shadow the lightning package.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != HERE]
import lightning as L  # noqa: E402

import torch_rsdp  # noqa: E402,F401  (registers the backend and Lightning's "rsdp" strategy)
from torch_rsdp.integrations import RSDPStrategy  # noqa: E402

sys.path.append(HERE)
from chess_data import ChessMoves  # noqa: E402
from chess_lm import Games, chess_llama  # noqa: E402



class ChessLM(L.LightningModule):
    def __init__(self, model, steps: int):
        super().__init__()
        self.model, self.steps = model, steps

    def training_step(self, batch, i):
        loss = self.model(**batch).loss
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        decay = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=self.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default="rotate",
                    help='a strategy of torch_rsdp.plan for the whole module, "rsdp" '
                         '(rsdp.shard), or "none" (Lightning\'s DDP, unsharded)')
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default="examples/results/lightning")
    ap.add_argument("--resume", action="store_true", help="from --out/last.ckpt")
    args = ap.parse_args()

    dist.init_process_group("rsdp")  # optional: the strategy creates it from torchrun's env
    data = ChessMoves(seq_len=64)
    model = chess_llama(data)
    strategy = {"none": "ddp", "rsdp": "rsdp"}.get(args.plan) or RSDPStrategy(plan=args.plan)

    loader = torch.utils.data.DataLoader(Games(data, args.steps * 16 * dist.get_world_size()),
                                         batch_size=8)
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=args.out, every_n_train_steps=20,
                                                save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=dist.get_world_size(), strategy=strategy,
                        max_steps=args.steps,
                        accumulate_grad_batches=2, gradient_clip_val=1.0, logger=False,
                        callbacks=[saver], log_every_n_steps=10)
    lit = ChessLM(model, args.steps)
    trainer.fit(lit, loader, ckpt_path=os.path.join(args.out, "last.ckpt") if args.resume
                else None)
    trainer.save_checkpoint(os.path.join(args.out, "final.ckpt"))  # whole tensors
    if trainer.is_global_zero:
        weights = torch.load(os.path.join(args.out, "final.ckpt"), weights_only=False)
        print(f"final.ckpt: {len(weights['state_dict'])} whole tensors, "
              f"{sum(v.numel() for v in weights['state_dict'].values()):,} parameters; "
              f"last loss {float(trainer.callback_metrics['loss']):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
