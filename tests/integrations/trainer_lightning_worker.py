"""One torchrun rank of tests/integrations/test_trainers.py: Lightning's stock ``Trainer`` (DDP strategy
over the process group the script created, as a user who shards first does) over a
``LightningModule`` holding a small Llama, unsharded or sharded, for each case; then a second
Trainer resumes each case from its mid-run checkpoint (``ckpt_path``).

    torchrun --nproc_per_node 2 tests/integrations/trainer_lightning_worker.py OUT CASE [CASE ...]

An epoch is ``SAVE_AT`` optimizer steps, so the checkpoint falls between epochs and the
resumed run sees the batches the uninterrupted one saw (Lightning restarts an interrupted
epoch of a plain ``DataLoader`` from its start). Writes ``OUT/CASE.json`` (rank 0): the loss
of every micro-batch, of the whole run and of the resumed one; the checkpoints Lightning wrote
are ``OUT/CASE/step=6.ckpt`` and ``OUT/CASE/again/step=6.ckpt``.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import torch_rsdp  # noqa: F401
import lightning as L

from trainer_hf_worker import STEPS, Tokens, build

SAVE_AT = 3


class LitLM(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.losses = []

    def training_step(self, batch, i):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=STEPS)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit(how: str, out: str, ckpt=None):
    lit = LitLM(build(how))
    per_step = 2 * 2 * dist.get_world_size()  # batch 2, 2 micro-batches per step
    loader = torch.utils.data.DataLoader(Tokens(SAVE_AT * per_step), batch_size=2)
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=SAVE_AT,
                                                save_top_k=-1, filename="{step}")
    trainer = L.Trainer(accelerator="cpu", devices=dist.get_world_size(), max_steps=STEPS,
                        accumulate_grad_batches=2, gradient_clip_val=1.0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[saver], use_distributed_sampler=True)
    trainer.fit(lit, loader, ckpt_path=ckpt)
    return trainer, lit


def run(case: str, root: str) -> None:
    out = os.path.join(root, case)
    _, lit = fit(case, out)
    ckpt = os.path.join(out, f"step={SAVE_AT}.ckpt")
    _, again = fit(case, os.path.join(out, "again"), ckpt=ckpt)
    if dist.get_rank() == 0:
        with open(out + ".json", "w") as f:
            json.dump({"loss": lit.losses, "resumed_loss": again.losses}, f)


def main() -> None:
    dist.init_process_group("rsdp")
    try:
        for case in sys.argv[2:]:
            run(case, sys.argv[1])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
