"""``plan.report(model, optimizer)``: what each unit's strategy costs on this rank.

Per unit: its strategy, how many parameters it holds in the unwrapped model, and the bytes of
parameters, gradients and optimizer state resident on this rank (DTensors count their local
shard; a tensor shared by several parameters counts once). Parameters a sharding strategy had
to leave whole are listed with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ._apply import plan_state

__all__ = ["report", "PlanReport", "UnitCost"]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors, seen: set) -> int:
    n = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel()) if t.numel() else None
        if key is not None and key in seen:
            continue
        seen.add(key)
        n += t.numel() * t.element_size()
    return n


@dataclass
class UnitCost:
    name: str
    strategy: str
    numel: int            # parameters of the unwrapped model owned by the unit
    param_bytes: int      # resident on this rank
    grad_bytes: int
    optim_bytes: int
    left_whole: Dict[str, str] = field(default_factory=dict)


@dataclass
class PlanReport:
    rank: int
    units: List[UnitCost]

    @property
    def total(self) -> Dict[str, int]:
        return {k: sum(getattr(u, k) for u in self.units)
                for k in ("numel", "param_bytes", "grad_bytes", "optim_bytes")}

    def __str__(self) -> str:
        mb = lambda b: f"{b / 2**20:9.2f}"  # noqa: E731
        lines = [f"plan report, rank {self.rank} (MiB resident on this rank)",
                 f"{'unit':<32} {'strategy':<14} {'params':>11} {'param':>9} {'grad':>9} "
                 f"{'optim':>9}"]
        for u in self.units:
            lines.append(f"{(u.name or '<root>')[:32]:<32} {u.strategy:<14} {u.numel:>11,} "
                         f"{mb(u.param_bytes)} {mb(u.grad_bytes)} {mb(u.optim_bytes)}")
        t = self.total
        lines.append(f"{'total':<32} {'':<14} {t['numel']:>11,} {mb(t['param_bytes'])} "
                     f"{mb(t['grad_bytes'])} {mb(t['optim_bytes'])}")
        whole = [(u.name, n, why) for u in self.units for n, why in u.left_whole.items()]
        if whole:
            lines.append("left whole by their unit's strategy:")
            lines += [f"  {n} ({u or '<root>'}): {why}" for u, n, why in whole]
        return "\n".join(lines)


def report(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> PlanReport:
    """Per-unit strategy and resident bytes on this rank (not collective).

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply`.
        optimizer: its optimizer, whose state is counted per unit (optional).
    """
    st = plan_state(model)
    state = optimizer.state if optimizer is not None else {}
    units = []
    seen_p, seen_g, seen_o = set(), set(), set()
    for unit in sorted(st.units.values(), key=lambda u: u.name):
        if not unit.params:
            continue
        ps = list(unit.params.values())
        opt = [t for p in ps for t in (state.get(p, {}) or {}).values()]
        units.append(UnitCost(unit.name, str(unit.strategy), unit.numel, _bytes(ps, seen_p),
                              _bytes([p.grad for p in ps if p.grad is not None], seen_g),
                              _bytes(opt, seen_o), unit.strategy.handler.report_row(unit)))
    return PlanReport(dist.get_rank(st.group), units)

