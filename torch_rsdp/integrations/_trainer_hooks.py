"""``transformers.Trainer`` over a model sharded by torch_rsdp.

Training goes through accelerate (:mod:`._accelerate_hooks`: no DDP around the model). What the
Trainer does itself and gets wrong for a sharded model is saving: ``save_model`` writes
``self.model.state_dict()`` from the main process alone, which holds rank 0's shards only,
and a checkpoint's ``optimizer.pt`` is rank 0's optimizer state. So, for a sharded model:

* ``save_model`` (also inside every checkpoint) gathers the whole state dict on every rank
  (the Trainer calls it on every process) and the main process writes it with
  ``save_pretrained``: the files ``from_pretrained`` loads, equal to an unsharded run's;
* a checkpoint's ``optimizer.pt`` holds the whole optimizer state (torch's full optimizer state
  dict, keyed by parameter name); the Trainer's own ``resume_from_checkpoint`` loads it on
  every rank, where the optimizer's hooks keep each rank's part, so a run resumes exactly at
  the same or another world size (the model's weights come back through ``load_state_dict``
  of the whole tensors, which every sharded parameter takes its part of);
* gradient clipping (``max_grad_norm``) and the logged gradient norm are one process's
  (``plan.clip_grad_norm_`` for a planned model);
* ``model.save_pretrained(dir, is_main_process=...)`` called on every rank (transformers'
  distributed convention) gathers the whole model; called on rank 0 alone it waits for the
  others until the group's timeout, as any collective would.

``Trainer.__init__`` is the guard: a sharded model passed in, or built by ``model_init``, is
refused there when a row it needs is missing (:mod:`._refusal`).
"""
from __future__ import annotations

import torch

from ._refusal import refuse_if_missing
from ._sharded import clip_grad_norm_, full_model_state_dict, full_optimizer_state_dict, is_sharded

__all__ = ["guard_init", "save_model", "save_optimizer_and_scheduler", "clip_grad_norm",
           "get_grad_norm", "save_pretrained"]


def _ours(trainer) -> bool:
    return (is_sharded(trainer.model) and not getattr(trainer, "is_fsdp_enabled", False)
            and not getattr(trainer, "is_deepspeed_enabled", False))


def _inner_optimizer(opt):
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer  # accelerate's AcceleratedOptimizer
    return opt


class _SavedState:
    """Stands in for the optimizer while the Trainer writes ``optimizer.state_dict()``."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def guard_init(original):
    def __init__(self, *args, **kwargs):
        model = kwargs["model"] if "model" in kwargs else (args[0] if args else None)
        if is_sharded(model):
            refuse_if_missing("transformers.Trainer", ("transformers", "accelerate"))
        original(self, *args, **kwargs)
        if model is None and is_sharded(getattr(self, "model", None)):  # model_init's
            refuse_if_missing("transformers.Trainer", ("transformers", "accelerate"))
    return __init__


def save_model(original):
    def save_model(self, output_dir=None, _internal_call=False):
        if not _ours(self):
            return original(self, output_dir, _internal_call)
        whole = full_model_state_dict(self.model)  # collective: every process is here
        self._save(output_dir if output_dir is not None else self.args.output_dir,
                   state_dict=whole)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
    return save_model


def save_optimizer_and_scheduler(original):
    def _save_optimizer_and_scheduler(self, output_dir):
        if not _ours(self):
            return original(self, output_dir)
        whole = full_optimizer_state_dict(self.model, _inner_optimizer(self.optimizer))
        optimizer, self.optimizer = self.optimizer, _SavedState(whole)
        try:  # the Trainer's own code writes optimizer.pt (main process), scheduler, scaler
            original(self, output_dir)
        finally:
            self.optimizer = optimizer
    return _save_optimizer_and_scheduler


def clip_grad_norm(original):
    def _clip_grad_norm(self, model):
        if not _ours(self):
            return original(self, model)
        return clip_grad_norm_(self.model, self.args.max_grad_norm)
    return _clip_grad_norm


def get_grad_norm(original):
    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None and _ours(self):
            grad_norm = clip_grad_norm_(self.model, float("inf"))
        return original(self, model, grad_norm)
    return _get_grad_norm


def save_pretrained(original):
    def save_pretrained(self, save_directory, *args, state_dict=None, **kwargs):
        if state_dict is None and is_sharded(self):
            # collective: every rank calls save_pretrained (is_main_process says who writes),
            # as transformers documents it for distributed training
            state_dict = full_model_state_dict(self)
        return original(self, save_directory, *args, state_dict=state_dict, **kwargs)
    return save_pretrained
