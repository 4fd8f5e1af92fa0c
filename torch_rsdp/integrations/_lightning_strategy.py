"""``Trainer(strategy="rsdp")``: Lightning's strategy for models sharded by torch_rsdp.

Lightning chooses how a model is distributed by the strategy the ``Trainer`` is given, by name
from its strategy registry or as an object. ``import torch_rsdp`` registers ``"rsdp"`` in that
registry (``lightning`` and ``pytorch_lightning`` alike) once Lightning is imported, so::

    trainer = L.Trainer(strategy="rsdp", accelerator="cpu", devices=4)        # rsdp.shard
    trainer = L.Trainer(strategy=RSDPStrategy(plan="rotate"))                  # plan.apply
    trainer = L.Trainer(strategy=RSDPStrategy(shard_options={"tp_plan": "auto"}))

At setup, before the optimizers are built, the strategy shards the ``LightningModule`` (its
parameter names are the keys a plan's mapping uses, e.g. ``"model.layers.*"``):
``torch_rsdp.plan.apply(module, plan, **shard_options)`` when a plan is given, else
``torch_rsdp.rsdp.shard(module, **shard_options)``. A module that holds a model sharded
already (by the user, before the Trainer) trains as it is. Then, unlike DDP, nothing wraps it:
the sharded model synchronises its own gradients; checkpoints hold whole tensors (gathered on
every rank, written by rank 0) and load back at any world size; validate/test/predict leave
the shards alone. Everything else (process group, devices, launchers, precision, reductions,
barriers) is Lightning's ``DDPStrategy``, whose subclass this is, over the ``"rsdp"`` backend.

It patches nothing. The methods it overrides are rows of :mod:`._patch_table` (kind
``override``): if a Lightning release drops one of them from ``DDPStrategy``, the strategy
refuses to be built instead of leaving the override silently uncalled.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from ._lightning_hooks import leave_shards_to_torch_rsdp
from ._refusal import refuse_if_missing
from ._sharded import full_model_state_dict, full_optimizer_state_dict, is_sharded

__all__ = ["strategy_class", "register"]

NAME = "rsdp"
_CLASSES: Dict[str, type] = {}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _is_mean(reduce_op) -> bool:
    if isinstance(reduce_op, str):
        return reduce_op.lower() in ("mean", "avg")
    return reduce_op == dist.ReduceOp.AVG


def _shard_function(plan):
    if plan is None:
        from ..rsdp import shard
        return shard
    from ..plan import apply
    return apply


def _check_options(fn, options: Dict[str, Any], skip: int) -> None:
    params = list(inspect.signature(fn).parameters)[skip:]
    unknown = sorted(set(options) - set(params))
    if unknown:
        public = "torch_rsdp.rsdp.shard" if fn.__name__ == "shard" else "torch_rsdp.plan.apply"
        raise TypeError(f"RSDPStrategy: shard_options {unknown} are not options of {public} "
                        f"(it takes {params})")


def _through_forward(module, step: str, *args, **kwargs):
    """``module.<step>(*args, **kwargs)`` called as ``module``'s forward, so that the hooks on
    the sharded root's forward run around the step: FSDP2's for the root unit of a plan (the
    parameters no inner unit holds) and torch_rsdp's (replicas read as local tensors). A
    LightningModule's step calls its submodules, never its own forward; Lightning's strategies
    that wrap the module redirect the same way (``_ForwardRedirection``)."""
    own = module.__dict__.get("forward")
    method = getattr(module, step)

    def forward(*a, **k):
        _restore(module, own)  # the step's own self(...) calls, if any, are plain forwards
        return method(*a, **k)

    module.forward = forward
    try:
        return module(*args, **kwargs)
    finally:
        _restore(module, own)


def _restore(module, own) -> None:
    if own is not None:
        module.forward = own
    else:
        module.__dict__.pop("forward", None)


def _make(strategies) -> type:
    lib = strategies.__name__.split(".")[0]
    DDPStrategy = strategies.DDPStrategy
    ddp_params = set(inspect.signature(DDPStrategy.__init__).parameters) - {"self", "kwargs"}

    class RSDPStrategy(DDPStrategy):
        """Lightning's DDP strategy for a module torch_rsdp shards (see the module's doc).

        Args:
            plan: ``None`` (``torch_rsdp.rsdp.shard``), or what ``torch_rsdp.plan.apply``
                takes: a strategy name for the whole module, a mapping ``module name or
                pattern -> strategy`` (names of the ``LightningModule``), or a ``Plan``.
            shard_options: keyword arguments of that function (``group``, ``mp_policy``,
                ``tp_plan``, ...).
            **kwargs: ``DDPStrategy``'s (``accelerator``, ``parallel_devices``, ``timeout``,
                ``process_group_backend`` (default ``"rsdp"``), ...).
        """

        strategy_name = NAME
        _torch_rsdp_strategy = True

        def __init__(self, plan=None, *, shard_options: Optional[Dict[str, Any]] = None,
                     process_group_backend: Optional[str] = "rsdp", **kwargs):
            refuse_if_missing("RSDPStrategy", (lib,), ("override",))
            unknown = sorted(set(kwargs) - ddp_params)
            if unknown:
                raise TypeError(f"RSDPStrategy got unexpected keyword arguments {unknown} "
                                f"(DDPStrategy's are {sorted(ddp_params)}; options of the "
                                f"sharding go in shard_options)")
            self._plan, self._shard_options = plan, dict(shard_options or {})
            _check_options(_shard_function(plan), self._shard_options, 2 if plan else 1)
            super().__init__(process_group_backend=process_group_backend, **kwargs)

        def _shard(self, module) -> None:
            asked = (self._plan, self._shard_options)
            if getattr(module, "_rsdp_strategy_sharding", None) == asked:
                return  # sharded by an RSDPStrategy like this one (fit, then validate)
            if is_sharded(module):
                if self._plan is not None or self._shard_options:
                    raise ValueError(
                        f"RSDPStrategy (rank {_rank()}): the module holds a model sharded by "
                        f"torch_rsdp already, and the strategy was given a plan or options to "
                        f"shard it again; pass the unsharded model, or RSDPStrategy() alone")
                return
            fn = _shard_function(self._plan)
            if self._plan is None:
                fn(module, **self._shard_options)
            else:
                fn(module, self._plan, **self._shard_options)
            module._rsdp_strategy_sharding = asked

        def setup(self, trainer) -> None:
            self._shard(self.model)  # collective, before the optimizers see the parameters
            leave_shards_to_torch_rsdp(self.model)
            super().setup(trainer)

        def configure_ddp(self) -> None:
            pass  # no DDP: the sharded model synchronises its own gradients

        def training_step(self, *args, **kwargs):
            with self.precision_plugin.train_step_context():
                return _through_forward(self.lightning_module, "training_step", *args, **kwargs)

        def validation_step(self, *args, **kwargs):
            with self.precision_plugin.val_step_context():
                return _through_forward(self.lightning_module, "validation_step", *args,
                                        **kwargs)

        def test_step(self, *args, **kwargs):
            with self.precision_plugin.test_step_context():
                return _through_forward(self.lightning_module, "test_step", *args, **kwargs)

        def predict_step(self, *args, **kwargs):
            with self.precision_plugin.predict_step_context():
                return _through_forward(self.lightning_module, "predict_step", *args, **kwargs)

        def reduce(self, tensor, group=None, reduce_op="mean"):
            # Lightning averages an int64 batch size when it logs with sync_dist=True; rsdp
            # averages integers on CPU tensors only (as NCCL does, truncating), so this does
            # what Lightning does for gloo on either device: sum, then divide (exactly)
            if (isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()
                    and not tensor.is_complex() and _is_mean(reduce_op)):
                total = super().reduce(tensor, group, "sum")
                return total / dist.get_world_size(group)
            return super().reduce(tensor, group, reduce_op)

        def lightning_module_state_dict(self):
            module = self.lightning_module
            if module is None or not is_sharded(module):
                return super().lightning_module_state_dict()
            return full_model_state_dict(module)  # collective; whole tensors on rank 0

        def optimizer_state(self, optimizer):
            module = self.lightning_module
            if module is None or not is_sharded(module):
                return super().optimizer_state(optimizer)
            return full_optimizer_state_dict(module, getattr(optimizer, "_optimizer", optimizer))

    RSDPStrategy.__module__ = __name__
    RSDPStrategy.__qualname__ = "RSDPStrategy"
    return RSDPStrategy


def strategy_class(lib: str = "lightning") -> type:
    """``RSDPStrategy`` for ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``."""
    if lib not in _CLASSES:
        root = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}[lib]
        _CLASSES[lib] = _make(importlib.import_module(root + ".strategies"))
    return _CLASSES[lib]


def register(strategies) -> None:
    """Registers ``"rsdp"`` in ``strategies.StrategyRegistry`` (``strategies`` is
    ``lightning.pytorch.strategies`` or ``pytorch_lightning.strategies``)."""
    registry = strategies.StrategyRegistry
    if NAME not in registry:
        cls = strategy_class(strategies.__name__.split(".")[0])
        registry.register(NAME, cls, description="torch_rsdp: shard with torch_rsdp.rsdp.shard "
                          "or a plan (torch_rsdp.integrations.RSDPStrategy)")
