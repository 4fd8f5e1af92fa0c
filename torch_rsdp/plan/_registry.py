"""The registry of strategy handlers: which strategy names exist, and the handler of each.

A handler class (:class:`~torch_rsdp.plan._strategies.StrategyHandler`) registers itself under
its strategy's name (:func:`register`, a class decorator; :mod:`.strategies` registers every
handler it owns). Plans are data (:mod:`._spec`) and name their strategies by string; this
registry is what checks those names (:func:`check_name`, :func:`check_compressible`) and finds the handler of a strategy
(:func:`handler_for`). It knows handlers only as registered classes, so it sits below both
``spec`` and the handlers, and imports nothing of torch_rsdp.
"""
from __future__ import annotations

from typing import Dict, List, Optional

__all__ = ["register", "unregister", "kinds", "families", "takes_k", "handler_for",
           "check_name", "check_compressible"]

_HANDLERS: Dict[str, type] = {}
_INSTANCES: Dict[object, object] = {}


def register(cls: type) -> type:
    """Class decorator: makes ``cls`` the handler of strategy ``cls.kind``."""
    if cls.kind in _HANDLERS:
        raise ValueError(f"torch_rsdp.plan: strategy {cls.kind!r} is registered twice")
    _HANDLERS[cls.kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Forgets the handler of strategy ``kind`` (and its instances), if there is one."""
    _HANDLERS.pop(kind, None)
    for s in [s for s in _INSTANCES if getattr(s, "kind", None) == kind]:
        del _INSTANCES[s]


def kinds() -> List[str]:
    """Every registered strategy name (``split`` once, for the whole family)."""
    return list(_HANDLERS)


def families() -> Dict[str, bool]:
    """Strategy name -> whether it takes ``:k``."""
    return {k: c.takes_k for k, c in _HANDLERS.items()}


def handler_for(strategy):
    """The handler of ``strategy`` (a :class:`~torch_rsdp.plan._spec.Strategy`; one instance
    per strategy)."""
    h = _INSTANCES.get(strategy)
    if h is None:
        h = _INSTANCES[strategy] = _HANDLERS[strategy.kind](strategy)
    return h


def takes_k(kind: str) -> bool:
    """Whether strategy ``kind`` (registered) takes ``:k``."""
    return _HANDLERS[kind].takes_k


def check_name(kind: str, k: Optional[int], name: str, at: str = "") -> None:
    """Raises ``ValueError`` unless ``kind`` (with ``:k`` when ``k`` is not None) names a
    registered strategy. ``name``: the strategy as written; ``at``: where it was written."""
    family = families()
    if kind not in family or family[kind] != (k is not None):
        listed = ", ".join(f"{n}:k" if t else n for n, t in family.items())
        raise ValueError(f"torch_rsdp.plan: unknown strategy {name!r}{at}; expected one of "
                         f"{listed} (k a positive integer), optionally with "
                         f"'+int8' or '+int4'")
    if k is not None and k < 1:
        raise ValueError(f"torch_rsdp.plan: {name!r}{at}: {kind}:k needs k >= 1 slices")


def check_compressible(kind: str, name: str, at: str = "") -> None:
    """Raises ``ValueError`` unless strategy ``kind`` may compress its cross-node traffic."""
    cls = _HANDLERS[kind]
    if not cls.compressible:
        able = [n for n, c in _HANDLERS.items() if c.compressible]
        raise ValueError(f"torch_rsdp.plan: {name!r}{at}: {kind} cannot compress "
                         f"its traffic ({cls.exact_why}); compression applies "
                         f"to {', '.join(able)}")
