"""The stock trainers over models sharded by torch_rsdp.

A model from ``torch_rsdp.plan.apply`` / ``plan.auto`` / ``torch_rsdp.rsdp.shard``
synchronises its own gradients and holds its parameters as DTensors. The stock trainers
assume otherwise: Hugging Face's ``Trainer`` and ``Accelerator.prepare`` wrap every model in
``DistributedDataParallel`` (whose start-up broadcast would overwrite every rank's shards with
rank 0's), Lightning's DDP strategy too, and both save from rank 0 alone what only every rank
together holds. ``import torch_rsdp`` installs these integrations (no line to add), each of
which changes nothing for a model torch_rsdp did not shard:

* ``accelerate`` (:mod:`.accelerate_hooks`): ``Accelerator.prepare_model`` keeps a sharded
  model as it is (mixed-precision autocast and ``torch.compile`` still applied) instead of
  wrapping it in DDP; ``get_state_dict`` / ``save_model`` gather whole tensors;
  ``clip_grad_norm_`` computes one process's norm.
* ``transformers`` (:mod:`.trainer_hooks`): ``Trainer.save_model`` and the checkpoints of
  ``save_strategy`` write the whole model (what ``from_pretrained`` loads) and the whole
  optimizer state, which ``resume_from_checkpoint`` loads back at any world size; gradient
  clipping is one process's; ``save_pretrained`` called on every rank gathers the whole model.
* ``lightning`` / ``pytorch_lightning`` (:mod:`.lightning_hooks`): the DDP strategies keep a
  module holding sharded parameters unwrapped, and checkpoints hold whole tensors.

Each library is patched when it is imported (before or after torch_rsdp); set
``TORCH_RSDP_INTEGRATIONS=0`` to leave them alone.
"""
from __future__ import annotations

import os

from .post_import import when_imported
from .sharded import (clip_grad_norm_, full_model_state_dict, full_optimizer_state_dict,
                      is_sharded, sharded_roots)

__all__ = ["install", "is_sharded", "sharded_roots", "full_model_state_dict",
           "full_optimizer_state_dict", "clip_grad_norm_"]

_INSTALLED = [False]


def install() -> None:
    """Patches accelerate, transformers and Lightning as each is imported (idempotent)."""
    if _INSTALLED[0] or os.environ.get("TORCH_RSDP_INTEGRATIONS", "1") == "0":
        return
    _INSTALLED[0] = True
    from . import accelerate_hooks, lightning_hooks, trainer_hooks

    when_imported("accelerate.accelerator", accelerate_hooks.patch)
    when_imported("transformers.trainer", trainer_hooks.patch)
    when_imported("transformers.modeling_utils", trainer_hooks.patch_pretrained)
    when_imported("lightning.pytorch.strategies.ddp", lightning_hooks.patch)
    when_imported("pytorch_lightning.strategies.ddp", lightning_hooks.patch)
    for pkg in ("lightning.pytorch", "pytorch_lightning"):
        for mod in ("fsdp", "deepspeed", "model_parallel"):
            when_imported(f"{pkg}.strategies.{mod}", lightning_hooks.patch_sharding_strategy)
