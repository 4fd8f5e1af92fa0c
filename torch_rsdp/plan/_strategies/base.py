"""The interface every strategy handler implements, and the registry of handlers.

A *strategy* is data (:class:`~torch_rsdp.plan._spec.Strategy`: a name and, for ``split``, a
``k``); its *handler* is the code, and the only place that knows how that strategy

* applies itself to a unit (:meth:`StrategyHandler.apply`), after the local checks
  :func:`~torch_rsdp.plan.apply` runs on every rank before anything changes
  (:meth:`StrategyHandler.check`);
* turns its gradient synchronisation off and on (:meth:`StrategyHandler.set_gradient_sync`,
  for ``plan.no_sync``);
* presents its state: a parameter's whole value from this rank's part
  (:meth:`StrategyHandler.full_value`, collective) and this rank's part of a whole value
  (:meth:`StrategyHandler.local_value`);
* costs itself for the planner (:meth:`StrategyHandler.applicable`,
  :meth:`StrategyHandler.cost`);
* reports what it holds (:meth:`StrategyHandler.report_row`).

``apply``, ``no_sync``, the full state dict, ``report`` and the planner's cost model loop over
handlers; adding a strategy means adding one module that registers its handler
(:func:`register`, kept by :mod:`.._registry`).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

from .._plan_compression import for_unit
from .._cost_terms import Cost, Links, UnitProfile
from .._mesh import Meshes
from .._mixed_precision import cast_replicated
from .._registry import families, handler_for, kinds, register
from .._spec import Strategy
from .._ownership import Unit

# Cost is defined in ..cost_terms (the planner reads it too); the registry is ..registry
# (spec checks names against it); both stay importable from here.
__all__ = ["StrategyHandler", "ApplyContext", "Cost", "cast_unit", "register", "handler_for",
           "kinds", "families", "fsdp_kwargs"]


@dataclass
class ApplyContext:
    """What every handler may need while :func:`~torch_rsdp.plan.apply` runs."""

    group: Optional[dist.ProcessGroup]
    meshes: Meshes
    mp: Optional[MixedPrecisionPolicy]
    #: Parameters whose optimizer state ``make_optimizer`` shards (ZeRO-1); handlers add to it.
    optim_sharded: List[nn.Parameter]
    #: ``plan.apply(compression=)`` parsed (:func:`~torch_rsdp.plan._plan_compression.parse`), or
    #: None: the setting of the compressible units without a ``+`` suffix of their own.
    compression: Optional[dict] = None
    #: ``plan.apply(offload_policy=)``: FSDP2's ``CPUOffloadPolicy`` or None.
    offload: Optional[OffloadPolicy] = None

    def unit_compression(self, unit: Unit) -> Optional[dict]:
        """The unit's compression where it changes anything (its traffic crosses nodes),
        recorded on the unit; else None."""
        c = for_unit(unit.strategy, self.compression)
        unit.compression = c if self.meshes.compresses(c) else None
        return unit.compression


class StrategyHandler(abc.ABC):
    """How one strategy applies itself, synchronises, exposes its state, costs and reports.

    Subclasses set ``kind`` (the strategy's name) and, for a family with a parameter
    (``split:k``), ``takes_k``; ``fsdp`` marks strategies applied with FSDP2's
    ``fully_shard`` (they share one FSDP2 root, :func:`~torch_rsdp.plan.apply`). ``apply``
    and ``cost`` are abstract: a handler without them cannot be made (``handler_for``
    raises ``TypeError``); every other method has the default a replicated strategy needs."""

    kind: ClassVar[str] = ""
    takes_k: ClassVar[bool] = False
    fsdp: ClassVar[bool] = False
    #: Whether ``<kind>+int8`` / ``+int4`` may compress the strategy's cross-node
    #: collectives (:mod:`.._plan_compression`); if not, ``exact_why`` says why.
    compressible: ClassVar[bool] = False
    exact_why: ClassVar[str] = "it sends nothing across nodes that a collective could compress"

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    # ------------------------------------------------------------------------------- apply
    def check(self, model: nn.Module, unit_name: str, modules: List[Tuple[str, nn.Module]]
              ) -> None:
        """Checks that need no communication; raises ``ValueError`` naming the unit.

        Args:
            model: the whole model.
            unit_name: the unit's module name (``""`` for the root).
            modules: ``(name, module)`` of every module the unit covers.
        """

    @abc.abstractmethod
    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        """Applies the strategy to ``unit`` in place (only to the parameters it owns) and
        refreshes ``unit.params`` (and ``unit.left_whole``). Returns the parameters it leaves
        replicated, whose gradients the plan's one gradient sync averages."""

    # --------------------------------------------------------------------- gradient sync
    def set_gradient_sync(self, unit: Unit, enabled: bool) -> None:
        """Turns the unit's own gradient synchronisation off (backward accumulates locally)
        or on (the next backward synchronises everything accumulated). Replicated
        parameters are the plan's gradient sync's, not the handler's."""

    # ------------------------------------------------------------------------- state dict
    def full_value(self, unit: Unit, key: str, value: torch.Tensor, rank0_only: bool,
                   scratch: Dict[str, object]) -> Optional[torch.Tensor]:
        """The unwrapped model's value for ``key`` (a state-dict key the unit owns) from
        ``value``, this rank's entry of ``model.state_dict()``. Collective over the plan's
        group: every rank calls it for the same keys in the same order. May return ``None``
        on ranks other than group rank 0 when ``rank0_only``. ``scratch``: the handler's own
        store for one state dict (e.g. gathered storages reused by a module's next key)."""
        return value.detach()

    def local_value(self, unit: Unit, key: str, full: torch.Tensor, current: torch.Tensor
                    ) -> torch.Tensor:
        """This rank's part of ``full`` (the unwrapped model's value for ``key``), in the
        form ``load_state_dict`` takes where the state dict holds ``current``. No
        communication."""
        return full

    def holds_shard(self, unit: Unit, key: str) -> bool:
        """Whether this rank's gradient of ``key`` (a plain tensor, not a DTensor: a shard in a
        layout DTensor cannot describe) is its own disjoint piece of the whole (True) or the
        whole gradient every rank holds alike (False), for
        :func:`~torch_rsdp.plan.clip_grad_norm_`."""
        return False

    def checkpoint_refusal(self, unit: Unit, key: str) -> Optional[str]:
        """Why ``key`` (a plain local tensor, not a DTensor) cannot go into a checkpoint as it
        is, or None (replicated): a shard whose layout a checkpoint cannot describe makes
        state dicts raise with this reason (:mod:`torch_rsdp._checkpoint_hooks`)."""
        return None

    # ---------------------------------------------------------------------------- planner
    def applicable(self, u: UnitProfile, links: Links) -> bool:
        """Whether the planner may choose this strategy for the profiled unit ``u``."""
        return u.param_bytes > 0

    @abc.abstractmethod
    def cost(self, u: UnitProfile, links: Links, f: float, bucket: int) -> Cost:
        """Memory and communication per rank of ``u`` under this strategy (``f``: optimizer
        state per parameter byte; ``bucket``: the gradient bucket of replicated
        parameters)."""

    def cross_node(self, u: UnitProfile, links: Links) -> List[Tuple[str, float, str]]:
        """What the strategy sends across nodes per step that compression could shrink:
        ``(collective kind, bytes as its rail's fit prices them, "weights" or "grads")``,
        for the planner's price of ``<kind>+int8`` (:func:`.._planner.cost.compression_gain`).
        """
        return []

    def feedback_bytes(self, u: UnitProfile, links: Links) -> float:
        """The error-feedback residuals one rank keeps for the unit under compression."""
        return 0.0

    def fallback(self, links: Links) -> str:
        """What :func:`~torch_rsdp.plan.apply` gives a unit this strategy cannot serve."""
        return "no_shard"

    # ----------------------------------------------------------------------------- report
    def report_row(self, unit: Unit) -> Dict[str, str]:
        """What the unit's strategy left whole (name -> why), for ``plan.report``."""
        return dict(unit.left_whole)


# ---------------------------------------------------------------------------------- helpers
def cast_unit(unit: Unit, params: List[nn.Parameter], mp: Optional[MixedPrecisionPolicy]
              ) -> None:
    """Makes the unit compute with ``param_dtype`` copies of ``params`` (replicated ones)."""
    if mp is None:
        return
    ids = {id(p) for p in params}
    names = {n: p for n, p in unit.module.named_parameters(remove_duplicate=False)
             if id(p) in ids}
    cast_replicated(unit.module, names, mp)


def fsdp_kwargs(mp: Optional[MixedPrecisionPolicy], offload: Optional[OffloadPolicy]) -> dict:
    """``fully_shard``'s policies from a plan's: only those given (FSDP2's defaults else)."""
    kwargs = {}
    if mp is not None:
        kwargs["mp_policy"] = mp
    if offload is not None:
        kwargs["offload_policy"] = offload
    return kwargs
