"""Lightning's DDP strategies over a ``LightningModule`` holding a model sharded by torch_rsdp.

``DDPStrategy.configure_ddp`` wraps the ``LightningModule`` in ``DistributedDataParallel``,
which would broadcast rank 0's shards over every rank's own and all-reduce gradients the
sharded model already synchronised. For a module holding sharded parameters it is skipped:
the module trains as it is (everything else of the strategy, its process group, reductions
and barriers included, is Lightning's own). Gradient accumulation
(``accumulate_grad_batches``) then synchronises every micro-batch instead of the last (the
same gradient), and ``gradient_clip_val`` goes through torch's ``clip_grad_norm_``, exact
over torch_rsdp's DTensor parameters.

Lightning's FSDP, DeepSpeed and ModelParallel strategies would shard the model again: they
refuse a sharded one at setup, naming the DDP strategy.

Checkpoints: Lightning builds the checkpoint dictionary on every rank and rank 0 writes it,
so ``lightning_module_state_dict`` gathers the whole model and ``optimizer_state`` the whole
optimizer state (collectives, every rank is there); ``ckpt_path=`` loads them back on every
rank, where each sharded parameter and its optimizer state take their part: a run resumes
exactly, at any world size.
"""
from __future__ import annotations

import importlib

from .patching import wrap_method
from .sharded import full_model_state_dict, full_optimizer_state_dict, is_sharded

__all__ = ["patch"]


def _inner(opt):
    return getattr(opt, "_optimizer", opt)  # LightningOptimizer


def _steps_sharded(module, opt) -> bool:
    ours = {id(p) for p in module.parameters()}
    return any(id(p) in ours for g in _inner(opt).param_groups for p in g["params"])


def _configure_ddp(original):
    def configure_ddp(self):
        if is_sharded(self.model):
            return  # the model synchronises itself; DDP would overwrite its shards
        return original(self)
    return configure_ddp


def _lightning_module_state_dict(original):
    def lightning_module_state_dict(self):
        module = self.lightning_module
        if module is None or not is_sharded(module):
            return original(self)
        return full_model_state_dict(module)
    return lightning_module_state_dict


def _optimizer_state(original):
    def optimizer_state(self, optimizer):
        module = self.lightning_module
        if module is None or not is_sharded(module) or not _steps_sharded(module, optimizer):
            return original(self, optimizer)
        return full_optimizer_state_dict(module, _inner(optimizer))
    return optimizer_state


def _refuse_sharding_again(original):
    def setup(self, trainer):
        if is_sharded(self.model):
            import torch.distributed as dist
            rank = dist.get_rank() if dist.is_initialized() else 0
            raise ValueError(
                f"{type(self).__name__} (rank {rank}): the model is sharded by torch_rsdp "
                f"already, and this strategy would shard it again; use the DDP strategy "
                f"(strategy=\"ddp\", or devices=N), which trains it as torch_rsdp shards it")
        return original(self, trainer)
    return setup


def patch_sharding_strategy(module) -> None:
    """Makes the strategies of ``module`` that shard a model themselves (FSDP, DeepSpeed,
    ModelParallel) refuse one torch_rsdp sharded, at setup."""
    for name in ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy"):
        cls = getattr(module, name, None)
        if cls is not None:
            wrap_method(cls, "setup", _refuse_sharding_again)


def patch(module) -> None:
    """Patches the DDP strategy of ``module`` (``lightning.pytorch.strategies.ddp`` or
    ``pytorch_lightning.strategies.ddp``) and the base ``Strategy``'s checkpoint state."""
    wrap_method(module.DDPStrategy, "configure_ddp", _configure_ddp)
    base = importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".strategy").Strategy
    wrap_method(base, "lightning_module_state_dict", _lightning_module_state_dict)
    wrap_method(base, "optimizer_state", _optimizer_state)
