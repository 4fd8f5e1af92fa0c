"""Lightning's stock DDP strategies over a ``LightningModule`` holding a model sharded by
torch_rsdp (the route from before ``strategy="rsdp"``, :mod:`._lightning_strategy`, which
needs none of these patches).

``DDPStrategy.configure_ddp`` wraps the ``LightningModule`` in ``DistributedDataParallel``,
which would broadcast rank 0's shards over every rank's own and all-reduce gradients the
sharded model already synchronised. For a module holding sharded parameters it is skipped:
the module trains as it is (everything else of the strategy, its process group, reductions
and barriers included, is Lightning's own). Gradient accumulation
(``accumulate_grad_batches``) then synchronises every micro-batch instead of the last (the
same gradient), and ``gradient_clip_val`` goes through torch's ``clip_grad_norm_``, exact
over torch_rsdp's DTensor parameters. ``validate`` / ``test`` / ``predict`` broadcast the
module's state from rank 0 instead of wrapping it: the sharded roots are left out of that.

Lightning's FSDP, DeepSpeed and ModelParallel strategies would shard the model again: they
refuse a sharded one at setup, naming the rsdp strategy.

Checkpoints: Lightning builds the checkpoint dictionary on every rank and rank 0 writes it,
so ``lightning_module_state_dict`` gathers the whole model and ``optimizer_state`` the whole
optimizer state (collectives, every rank is there); ``ckpt_path=`` loads them back on every
rank, where each sharded parameter and its optimizer state take their part: a run resumes
exactly, at any world size.

``Strategy.connect`` is the guard: a sharded model coming into a strategy whose patches (or,
for ``RSDPStrategy``, whose overridden methods) are missing in this Lightning is refused there.
"""
from __future__ import annotations

from ._refusal import refuse_if_missing
from ._sharded import full_model_state_dict, full_optimizer_state_dict, is_sharded, sharded_roots

__all__ = ["guard_connect", "ddp_setup", "configure_ddp", "lightning_module_state_dict",
           "optimizer_state", "refuse_sharding_again", "leave_shards_to_torch_rsdp"]


def _inner(opt):
    return getattr(opt, "_optimizer", opt)  # LightningOptimizer


def _steps_sharded(module, opt) -> bool:
    ours = {id(p) for p in module.parameters()}
    return any(id(p) in ours for g in _inner(opt).param_groups for p in g["params"])


def leave_shards_to_torch_rsdp(module) -> None:
    """Tells DDP's state broadcast (``_sync_module_states``, which Lightning's DDP strategy runs
    at the start of validate/test/predict) to leave the sharded roots of ``module`` alone:
    it would broadcast rank 0's shards over every rank's own (torch's
    ``_ddp_params_and_buffers_to_ignore``, as :func:`torch_rsdp._dtensor_params.refuse_ddp`
    sets on the roots themselves). What lies outside every root is broadcast as DDP would."""
    names = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    for prefix, root in sharded_roots(module):
        names.update(prefix + n for n, _ in root.named_parameters(remove_duplicate=False))
        names.update(prefix + n for n, _ in root.named_buffers(remove_duplicate=False))
    module._ddp_params_and_buffers_to_ignore = sorted(names)


def guard_connect(original):
    def connect(self, model):
        if is_sharded(model):
            lib = type(self).__module__.split(".")[0]  # lightning or pytorch_lightning
            # RSDPStrategy relies on the methods it overrides, the other strategies on patches
            kinds = ("override",) if getattr(self, "_torch_rsdp_strategy", False) else (
                "patch", "guard")
            refuse_if_missing(f"{type(self).__name__}.connect", (lib,), kinds)
        return original(self, model)
    return connect


def ddp_setup(original):
    def setup(self, trainer):
        if self.model is not None and is_sharded(self.model):
            leave_shards_to_torch_rsdp(self.model)
        return original(self, trainer)
    return setup


def configure_ddp(original):
    def configure_ddp(self):
        if is_sharded(self.model):
            return  # the model synchronises itself; DDP would overwrite its shards
        return original(self)
    return configure_ddp


def lightning_module_state_dict(original):
    def lightning_module_state_dict(self):
        module = self.lightning_module
        if module is None or not is_sharded(module):
            return original(self)
        return full_model_state_dict(module)
    return lightning_module_state_dict


def optimizer_state(original):
    def optimizer_state(self, optimizer):
        module = self.lightning_module
        if module is None or not is_sharded(module) or not _steps_sharded(module, optimizer):
            return original(self, optimizer)
        return full_optimizer_state_dict(module, _inner(optimizer))
    return optimizer_state


def refuse_sharding_again(original):
    def setup(self, trainer):
        if is_sharded(self.model):
            import torch.distributed as dist
            rank = dist.get_rank() if dist.is_initialized() else 0
            raise ValueError(
                f"{type(self).__name__} (rank {rank}): the model is sharded by torch_rsdp "
                f"already, and this strategy would shard it again; use strategy=\"rsdp\" "
                f"(torch_rsdp.integrations.RSDPStrategy), which trains it as torch_rsdp "
                f"shards it")
        return original(self, trainer)
    return setup
