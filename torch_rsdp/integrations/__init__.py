"""The stock trainers over models sharded by torch_rsdp.

A model from ``torch_rsdp.plan.apply`` / ``plan.auto`` / ``torch_rsdp.rsdp.shard``
synchronises its own gradients and holds its parameters as DTensors. The stock trainers
assume otherwise: Hugging Face's ``Trainer`` and ``Accelerator.prepare`` wrap every model in
``DistributedDataParallel`` (whose start-up broadcast would overwrite every rank's shards with
rank 0's), Lightning's DDP strategy too, and both save from rank 0 alone what only every rank
together holds. ``import torch_rsdp`` installs these integrations (no line to add), each of
which changes nothing for a model torch_rsdp did not shard:

* ``accelerate`` (:mod:`._accelerate_hooks`): ``Accelerator.prepare_model`` keeps a sharded
  model as it is (mixed-precision autocast and ``torch.compile`` still applied) instead of
  wrapping it in DDP; ``get_state_dict`` / ``save_model`` gather whole tensors;
  ``clip_grad_norm_`` computes one process's norm.
* ``transformers`` (:mod:`._trainer_hooks`): ``Trainer.save_model`` and the checkpoints of
  ``save_strategy`` write the whole model (what ``from_pretrained`` loads) and the whole
  optimizer state, which ``resume_from_checkpoint`` loads back at any world size; gradient
  clipping is one process's; ``save_pretrained`` called on every rank gathers the whole model.
* ``lightning`` / ``pytorch_lightning``: ``Trainer(strategy="rsdp")`` (registered in
  Lightning's strategy registry; :mod:`._lightning_strategy`, ``RSDPStrategy``) shards the
  module and trains, checkpoints and resumes it; the stock DDP strategy also keeps a module
  holding sharded parameters unwrapped (:mod:`._lightning_hooks`).

Every patched method is a row of :mod:`._patch_table`, with the library versions it was tested
with. Each library is patched when it is imported (before or after torch_rsdp); a version
outside the tested range, or a method a release renamed, is reported once as a warning (a
method a release moved into a base class is found there and patched on the named class), and a
sharded model that reaches a library whose patch is missing is refused (``IntegrationError``)
instead of silently saving rank 0's shards: at the library's door (the guard rows), or, where no
guard stands, at the model's first training step inside the library (:mod:`._first_step`).
:func:`status` says what is active and why not; set ``TORCH_RSDP_INTEGRATIONS=0`` to leave every
library alone.
"""
from __future__ import annotations

import os

from collections import defaultdict

from . import _lightning_strategy
from ._patch_table import LIBRARIES, PATCHES
from ._patching import IntegrationWarning, apply_rows, set_disabled
from ._post_import import when_imported
from ._refusal import IntegrationError
from ._status import status

__all__ = ["status", "RSDPStrategy", "IntegrationError", "IntegrationWarning"]

_INSTALLED = [False]


def _install() -> None:
    """Patches the libraries of :mod:`._patch_table` as each is imported, and registers
    Lightning's ``"rsdp"`` strategy (idempotent; run when this package is imported, which
    ``import torch_rsdp`` does)."""
    if _INSTALLED[0]:
        return
    _INSTALLED[0] = True
    if os.environ.get("TORCH_RSDP_INTEGRATIONS", "1") == "0":
        set_disabled()
        return
    by_module = defaultdict(list)
    for row in PATCHES:
        by_module[f"{LIBRARIES[row.library].root}.{row.module}"].append(row)
    for module, rows in by_module.items():
        when_imported(module, lambda m, rows=rows: apply_rows(rows, m))
    for root in ("lightning.pytorch", "pytorch_lightning"):
        when_imported(f"{root}.strategies", _lightning_strategy.register)


def __getattr__(name):
    if name == "RSDPStrategy":  # imports Lightning: only when asked for
        return _lightning_strategy.strategy_class("lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_install()
