"""What a plan says: a strategy per module, as data.

A :class:`Plan` maps module names or ``fnmatch`` patterns to strategy names, plus a default for
the modules no key covers. It is plain data: it round-trips through JSON and has a digest that
:func:`torch_rsdp.plan.apply` compares across ranks before it changes anything, so ranks that
were handed different plans raise instead of hanging in mismatched collectives.

Resolution (:func:`resolve`): a key *covers* the module it names and, through it, the whole
subtree below, except where a deeper key takes over. Patterns match dotted names segment by
segment (``"model.layers.*"`` matches ``model.layers.3`` but not ``model.layers.3.mlp``). When several keys match one module name,
the most specific wins: an exact name beats any pattern; among patterns, the one with more
literal characters (``"model.layers.1*"`` beats ``"model.layers.*"``). Two patterns equally
specific that name different strategies are an error, not a coin toss.

Which strategy names exist is not this module's knowledge: :func:`parse_strategy` reads the
syntax (``name``, ``name:k``, ``+int8``) and the registry of handlers (:mod:`._registry`, filled
by :mod:`.strategies`) checks the name; ``Strategy.handler`` asks it for the handler.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional, Union

import torch.nn as nn

from . import _registry as registry

__all__ = ["Strategy", "Plan", "COMPRESSIONS", "parse_strategy", "resolve", "Resolution",
           "block_patterns"]

_WITH_K = re.compile(r"^(\w+):(-?\d+)$")


#: What a strategy's ``+`` suffix may ask to send across nodes quantised (the gradients'
#: format; weights travel int8): :mod:`._plan_compression`.
COMPRESSIONS = ("int8", "int4")


@dataclass(frozen=True)
class Strategy:
    """One strategy: a name, for ``split`` the number of slices ``k``, and optionally what
    its cross-node traffic is compressed to (``"full_shard+int8"``: int8 weights and
    gradients; ``+int4``: int4 gradients)."""

    kind: str
    k: int = 0
    compress: str = ""

    def __str__(self) -> str:
        base = f"{self.kind}:{self.k}" if registry.takes_k(self.kind) else self.kind
        return f"{base}+{self.compress}" if self.compress else base

    @property
    def exact(self) -> "Strategy":
        """The same strategy without compression."""
        return Strategy(self.kind, self.k) if self.compress else self

    @property
    def handler(self):
        """The :class:`~torch_rsdp.plan._strategies.StrategyHandler` that implements it."""
        return registry.handler_for(self)


def parse_strategy(name: Union[str, Strategy], where: str = "") -> Strategy:
    """``"full_shard"`` -> Strategy("full_shard"); ``"split:4"`` -> Strategy("split", 4).

    Args:
        name: a strategy name (or a :class:`Strategy`, returned as it is).
        where: the plan key it was given for, named in errors.
    """
    if isinstance(name, Strategy):
        return name
    at = f" (for {where!r})" if where else ""
    if not isinstance(name, str):
        raise TypeError(f"torch_rsdp.plan: a strategy is a string, got {type(name).__name__}{at}")
    s, _, compress = name.strip().partition("+")
    s, compress = s.strip(), compress.strip()
    if compress or name.strip().endswith("+"):
        base = parse_strategy(s, where)
        if compress not in COMPRESSIONS:
            raise ValueError(f"torch_rsdp.plan: {name!r}{at}: unknown compression "
                             f"{compress!r}; '+int8' (weights and gradients int8 across "
                             f"nodes) or '+int4' (gradients int4)")
        registry.check_compressible(base.kind, name, at)
        return Strategy(base.kind, base.k, compress)
    m = _WITH_K.match(s)
    kind, k = (m.group(1), int(m.group(2))) if m else (s, None)
    registry.check_name(kind, k, name, at)  # the registry knows which names exist
    return Strategy(kind, k or 0)


class Plan:
    """A mapping ``module name or fnmatch pattern -> strategy`` and a ``default``.

    ``Plan({"model.layers.*": "full_shard", "lm_head": "rotate"}, default="no_shard")``
    """

    def __init__(self, mapping: Optional[Mapping[str, str]] = None, default: str = "no_shard"):
        mapping = dict(mapping or {})
        self.mapping: Dict[str, Strategy] = {}
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise TypeError(f"torch_rsdp.plan: plan keys are module names or patterns, "
                                f"got {key!r}")
            self.mapping[key] = parse_strategy(value, key)
        self.default = parse_strategy(default, "default")

    @classmethod
    def uniform(cls, model: nn.Module, strategy: str) -> "Plan":
        """``strategy`` for every repeated block of ``model`` (each its own unit, as FSDP2 is
        applied layer by layer) and for the rest of the model."""
        return cls({pattern: strategy for pattern in block_patterns(model)}, strategy)

    @classmethod
    def of(cls, plan: Union["Plan", Mapping[str, str], str], default: Optional[str] = None,
           model: Optional[nn.Module] = None) -> "Plan":
        """A Plan from a Plan, a mapping, or one strategy name (:meth:`uniform` over
        ``model``'s blocks)."""
        if isinstance(plan, Plan):
            if default is not None and parse_strategy(default) != plan.default:
                return Plan(plan.to_dict()["mapping"], default)
            return plan
        if isinstance(plan, str):
            return cls.uniform(model, plan) if model is not None else cls({}, plan)
        return cls(plan, default or "no_shard")

    def to_dict(self) -> dict:
        return {"mapping": {k: str(v) for k, v in self.mapping.items()},
                "default": str(self.default)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        if "mapping" not in d:  # a bare {"pattern": "strategy"} file is accepted too
            return cls(d)
        return cls(d["mapping"], d.get("default", "no_shard"))

    def digest(self) -> str:
        """A hash of the plan's content (key order does not matter)."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def __eq__(self, other) -> bool:
        return isinstance(other, Plan) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        items = ", ".join(f"{k!r}: '{v}'" for k, v in self.mapping.items())
        return f"Plan({{{items}}}, default='{self.default}')"


def _pattern_match(name: str, key: str) -> bool:
    """``fnmatch`` segment by segment: a wildcard stays within one dotted name segment, so
    ``"model.layers.*"`` names the layers themselves, not every module inside them."""
    a, b = name.split("."), key.split(".")
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b))


def _specificity(key: str, name: str):
    """Sort key of a matching ``key`` for module ``name``: higher is more specific."""
    if key == name:
        return (1, len(key))
    literal = len(key) - sum(key.count(c) for c in "*?[]")
    return (0, literal)


@dataclass
class Resolution:
    """The plan resolved against one model.

    ``units``: the modules where a key takes effect (decision points), name -> Strategy, the
    root ``""`` always among them (with the default unless a key names it);
    ``unit_of``: every module name -> the name of the unit it belongs to (itself or its
    nearest ancestor that is a unit);
    ``matched``: plan key -> the module names it matched.
    """

    units: Dict[str, Strategy]
    unit_of: Dict[str, str]
    matched: Dict[str, list]

    def strategy_of_module(self, name: str) -> Strategy:
        return self.units[self.unit_of[name]]


def resolve(model: nn.Module, plan: Plan, *, strict: bool = True) -> Resolution:
    """Which unit (and so which strategy) every module of ``model`` belongs to.

    strict: a key that matches no module raises (a typo would otherwise silently leave a module
    on the default)."""
    names = [n for n, _ in model.named_modules(remove_duplicate=False)]
    matched: Dict[str, list] = {k: [] for k in plan.mapping}
    units: Dict[str, Strategy] = {"": plan.default}
    for name in names:
        best, best_key = None, None
        for key in plan.mapping:
            if key == name or (name and _pattern_match(name, key)):
                spec = _specificity(key, name)
                if best is None or spec > best:
                    best, best_key = spec, key
                elif spec == best and plan.mapping[key] != plan.mapping[best_key]:
                    raise ValueError(
                        f"torch_rsdp.plan: module {name!r} is matched equally by {best_key!r} "
                        f"({plan.mapping[best_key]}) and {key!r} ({plan.mapping[key]}); "
                        f"name it exactly to choose")
        if best_key is not None:
            matched[best_key].append(name)
            units[name] = plan.mapping[best_key]
    if strict:
        unused = [k for k, v in matched.items() if not v]
        if unused:
            raise ValueError(f"torch_rsdp.plan: plan key(s) {unused} match no module of "
                             f"{type(model).__name__} (module names look like "
                             f"{_examples(names)})")
    unit_of: Dict[str, str] = {}
    for name in names:
        probe = name
        while probe not in units:
            probe = probe.rpartition(".")[0]
        unit_of[name] = probe
    return Resolution(units, unit_of, matched)


def block_patterns(model: nn.Module) -> list:
    """Patterns naming the repeated blocks of ``model``: the entries of every ``ModuleList`` /
    ``Sequential`` holding two or more modules of one class (a transformer's layers), e.g.
    ``["model.layers.*"]``; outermost lists only."""
    out = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 2:
            continue
        if any(name.startswith(p[:-1]) for p in out):
            continue
        kinds = [type(m) for m in mod]
        if max(kinds.count(k) for k in kinds) >= 2 and all(len(list(m.parameters())) for m in mod):
            out.append(f"{name}.*" if name else "*")
    return out


def _examples(names: Iterable[str], n: int = 4) -> str:
    shown = [repr(x) for x in names if x][:n]
    return ", ".join(shown) + (", ..." if shown else "")
