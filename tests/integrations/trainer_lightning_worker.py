"""One torchrun rank of tests/integrations/test_trainers.py: Lightning's stock ``Trainer`` over a
``LightningModule`` holding a small Llama, for each case; then a second Trainer resumes each
case from its mid-run checkpoint (``ckpt_path``), and validates.

    torchrun --nproc_per_node 2 tests/integrations/trainer_lightning_worker.py OUT CASE [CASE ...]

A case is ``none`` (the unsharded model under ``strategy="ddp"``, the reference),
``rsdp:HOW`` (``strategy="rsdp"``: the strategy shards the module, by ``rsdp.shard`` for
``HOW=rsdp``, else by ``RSDPStrategy(plan=HOW)``; ``rsdp-units`` and ``auto`` shard the model
before the Trainer, which trains it as it is) or ``ddp:HOW`` (the model sharded before the
Trainer, under the stock ``strategy="ddp"``, torch_rsdp's patches of ``DDPStrategy``).

An epoch is ``SAVE_AT`` optimizer steps, so the checkpoint falls between epochs and the
resumed run sees the batches the uninterrupted one saw (Lightning restarts an interrupted
epoch of a plain ``DataLoader`` from its start). Writes ``OUT/CASE.json`` (rank 0): the loss
of every micro-batch, of the whole run and of the resumed one, and the resumed model's
validation loss; the checkpoints Lightning wrote are ``OUT/CASE/step=6.ckpt`` and
``OUT/CASE/again/step=6.ckpt``.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import torch_rsdp  # noqa: F401  (registers the backend and Lightning's "rsdp" strategy)
import lightning as L
from torch_rsdp.integrations import RSDPStrategy

from trainer_hf_worker import MIX, STEPS, Tokens, build

SAVE_AT = 3
BUILT_FIRST = {"rsdp-units", "auto"}  # sharded before the Trainer sees them


class LitLM(L.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.losses = []

    def training_step(self, batch, i):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, i):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=STEPS)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def module_and_strategy(case: str):
    route, _, how = case.partition(":")
    if route == "none":
        return LitLM(build("none")), "ddp"
    if route == "ddp":
        return LitLM(build(how)), "ddp"
    if how in BUILT_FIRST:
        return LitLM(build(how)), "rsdp"
    if how == "rsdp":
        return LitLM(build("none")), "rsdp"  # by name: rsdp.shard of the module
    plan = {"model." + k: v for k, v in MIX.items()} if how == "mix" else how
    return LitLM(build("none")), RSDPStrategy(plan=plan)


def fit(case: str, out: str, ckpt=None):
    lit, strategy = module_and_strategy(case)
    per_step = 2 * 2 * dist.get_world_size()  # batch 2, 2 micro-batches per step
    loader = torch.utils.data.DataLoader(Tokens(SAVE_AT * per_step), batch_size=2)
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=SAVE_AT,
                                                save_top_k=-1, filename="{step}")
    trainer = L.Trainer(accelerator="cpu", devices=dist.get_world_size(), strategy=strategy,
                        max_steps=STEPS, accumulate_grad_batches=2, gradient_clip_val=1.0,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[saver], use_distributed_sampler=True)
    trainer.fit(lit, loader, ckpt_path=ckpt)
    return trainer, lit


def run(case: str, root: str) -> None:
    out = os.path.join(root, case)
    _, lit = fit(case, out)
    ckpt = os.path.join(out, f"step={SAVE_AT}.ckpt")
    trainer, again = fit(case, os.path.join(out, "again"), ckpt=ckpt)
    # validate leaves the shards alone (DDP's state broadcast would overwrite them)
    val = trainer.validate(again, torch.utils.data.DataLoader(Tokens(8), batch_size=2),
                           verbose=False)[0]["val_loss"]
    if dist.get_rank() == 0:
        with open(out + ".json", "w") as f:
            json.dump({"loss": lit.losses, "resumed_loss": again.losses, "val_loss": val}, f)


def main() -> None:
    # the backend the caller names (RSDP_TEST_TRAINER_BACKEND=gloo: torch's own), rsdp by default
    dist.init_process_group(os.environ.get("RSDP_TEST_TRAINER_BACKEND", "rsdp"))
    try:
        for case in sys.argv[2:]:
            run(case, sys.argv[1])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
