"""One handler per strategy: the only code that knows how a strategy works.

Owns: :mod:`.base` (the interface, :class:`StrategyHandler`, and the registry), one module per
strategy family (:mod:`.replicate`: ``no_shard``, ``shard_optim``; :mod:`.fsdp`:
``full_shard``, ``shard_grad_op``, ``hybrid_shard``; :mod:`.rotate`; :mod:`.split` with its
mechanism :mod:`.split_linear`).

May import: ``torch_rsdp.rsdp`` (its public API only), ``torch_rsdp._utils``, and from
``torch_rsdp.plan`` the modules below the handlers (``units``, ``mixed_precision``).
``apply``, ``accumulate``, ``checkpoint``, ``report`` and the planner import this package,
never the other way round.
"""
from .base import ApplyContext, Cost, StrategyHandler, families, handler_for, kinds, register
# Each module registers its handlers; this order is the order strategies are listed in.
from . import replicate, fsdp, rotate, split  # noqa: F401,I001

__all__ = ["StrategyHandler", "ApplyContext", "Cost", "handler_for", "kinds", "families",
           "register"]
