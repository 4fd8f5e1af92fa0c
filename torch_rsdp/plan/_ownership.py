"""Ownership: the units (modules where a plan's key takes effect) and the parameters each owns.

A parameter belongs to the unit of the module that holds it. A parameter held by modules of
different units (tied weights) belongs to the unit of their closest common ancestor, so exactly
one strategy shards or synchronises it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch.nn as nn

from ._spec import Resolution, Strategy

__all__ = ["Unit", "build_units", "depth", "qualified_params", "units_by_key"]


@dataclass
class Unit:
    """One decision point of the plan: a module and the parameters its strategy owns."""

    name: str
    strategy: "Strategy"
    module: nn.Module
    params: Dict[str, nn.Parameter] = field(default_factory=dict)  # qualified name -> param
    left_whole: Dict[str, str] = field(default_factory=dict)       # name -> why (split/rotate)
    numel: int = 0                  # elements of the owned parameters in the unwrapped model
    #: What the unit's traffic across nodes is compressed to (:mod:`._plan_compression`), or None.
    compression: Optional[dict] = None
    #: The error feedback keeping the residual of the unit's compressed gradients, if any
    #: (a :class:`torch_rsdp._compression.FeedbackReduceScatter` for FSDP units).
    feedback: Optional[object] = None

    def relative(self, qualified: str) -> str:
        """``qualified`` (a name in the whole model) relative to the unit's module."""
        return qualified[len(self.name) + 1:] if self.name else qualified


def depth(name: str) -> int:
    """Nesting depth of a module name (the root is shallowest)."""
    return -1 if name == "" else name.count(".")


def build_units(model: nn.Module, res: "Resolution") -> Dict[str, Unit]:
    """Units with the parameters each owns (tied parameters go to their common ancestor)."""
    holders: Dict[int, list] = {}
    objs: Dict[int, nn.Parameter] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is None:
                continue
            holders.setdefault(id(p), []).append(f"{mname}.{pname}" if mname else pname)
            objs[id(p)] = p
    units = {n: Unit(n, s, model.get_submodule(n) if n else model)
             for n, s in res.units.items()}
    for pid, names in holders.items():
        mods = [n.rpartition(".")[0] for n in names]
        owners = {res.unit_of[m] for m in mods}
        owner = owners.pop() if len(owners) == 1 else res.unit_of[_common(mods)]
        units[owner].params[names[0]] = objs[pid]
        units[owner].numel += objs[pid].numel()
    return units


def qualified_params(unit: Unit) -> Dict[str, nn.Parameter]:
    """The unit module's parameters now, by their names in the whole model."""
    prefix = unit.name + "." if unit.name else ""
    return {prefix + n: p for n, p in unit.module.named_parameters()}


def units_by_key(model: nn.Module, units: Dict[str, Unit]) -> Dict[str, Unit]:
    """Parameter name (every name of a tied one) -> the unit owning that parameter."""
    owner = {id(p): u for u in units.values() for p in u.params.values()}
    return {n: owner[id(p)] for n, p in model.named_parameters(remove_duplicate=False)
            if id(p) in owner}


def _common(names: List[str]) -> str:
    parts = [n.split(".") if n else [] for n in names]
    out = []
    for seg in zip(*parts):
        if len(set(seg)) != 1:
            break
        out.append(seg[0])
    return ".".join(out)
