"""One handler per strategy: the only code that knows how a strategy works.

Owns: :mod:`.base` (the interface, :class:`StrategyHandler`, and the registry), one module per
strategy family (:mod:`.replicate`: ``no_shard``, ``shard_optim``; :mod:`.fsdp`:
``full_shard``, ``shard_grad_op``, ``hybrid_shard``; :mod:`.rotate`; :mod:`.split` with its
mechanism :mod:`.split_linear`).

May import: ``torch_rsdp.rsdp`` (its public API only), the backend's public modules
(``torch_rsdp._compression``, ``topology``, ``ring``), the shared modules ``torch_rsdp._utils``,
``_dtensor_params``, ``_grad_sync`` and ``_checkpoint_hooks``, and from ``torch_rsdp.plan`` the
modules below the handlers (``spec``, ``registry``, ``units``, ``mesh``, ``mixed_precision``,
``compression``, ``cost_terms``). ``apply``, ``accumulate``, ``checkpoint``, ``report`` and the
planner import this package (through ``__all__``), never the other way round.
"""
from .base import (ApplyContext, Cost, StrategyHandler, families, fsdp_kwargs, handler_for, kinds,
                   register)
# Each module registers its handlers; this order is the order strategies are listed in.
from . import replicate, fsdp, rotate, split  # noqa: F401,I001
from .split_linear import is_splittable

#: Every strategy name, with ``split:k`` standing for the whole family (the handlers
#: registered above, in their order).
STRATEGIES = tuple(f"{kind}:k" if takes_k else kind for kind, takes_k in families().items())

__all__ = ["StrategyHandler", "ApplyContext", "Cost", "handler_for", "kinds", "families",
           "register", "is_splittable", "STRATEGIES", "fsdp_kwargs"]
