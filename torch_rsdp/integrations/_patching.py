"""Applies the rows of :mod:`._patch_table` as their libraries are imported, and remembers how
each went: the state :func:`torch_rsdp.integrations.status` reports and the guards consult.

A row's state is one of

* ``"pending"``: its module has not been imported (it is patched when it is);
* ``"active"``: patched (``patch``, ``guard``), or present to be overridden (``override``);
* ``"absent"``: an optional row whose class or method this version lacks, and with it the
  path the row serves;
* ``"missing"``: the method is not there. Reported once as a warning when the module is
  imported; a sharded model that then comes in by a guard is refused (:mod:`._refusal`)
  instead of running the library's unsharded code, which would save rank 0's shards as if they
  were the model;
* ``"disabled"``: ``TORCH_RSDP_INTEGRATIONS=0``.

A library version outside the row's tested range is reported once too, and patched all the
same: the rows that are there still hold, and the missing ones refuse.
"""
from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
import threading
import warnings
from typing import Callable, Dict, Iterable, Optional, Tuple

from ._patch_table import LIBRARIES, PATCHES, Patch
from ._refusal import Missing, record_missing

__all__ = ["IntegrationWarning", "wrap_method", "apply_rows", "state_of", "library_version",
           "in_tested_range"]


class IntegrationWarning(UserWarning):
    """A library torch_rsdp patches is outside its tested versions, or lacks a method."""


_LOCK = threading.RLock()
_STATE: Dict[Tuple[str, str, str, str], str] = {}   # (library, module, owner, method) -> state
_WARNED: set = set()


def _key(row: Patch) -> Tuple[str, str, str, str]:
    return (row.library, row.module, row.owner, row.method)


def state_of(row: Patch) -> str:
    with _LOCK:
        return _STATE.get(_key(row), "pending")


def set_disabled() -> None:
    with _LOCK:
        for row in PATCHES:
            _STATE[_key(row)] = "disabled"


def library_version(name: str) -> Optional[str]:
    """The version of library ``name``: its module's ``__version__`` once imported (what runs),
    else the installed distribution's; None if it is not installed."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(LIBRARIES[name].dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> Tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def in_tested_range(name: str, version: str) -> bool:
    lo, hi = LIBRARIES[name].tested
    return _minor(lo) <= _minor(version) <= _minor(hi)


def _warn_once(key, message: str) -> None:
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, IntegrationWarning, stacklevel=3)


def _check_version(name: str) -> None:
    version = library_version(name)
    if version is not None and not in_tested_range(name, version):
        lo, hi = LIBRARIES[name].tested
        _warn_once(("version", name),
                   f"torch_rsdp: {name} {version} is outside the versions its integration was "
                   f"tested with ({name} {lo} to {hi}); the patches that still find their "
                   f"methods are applied, and a model sharded by torch_rsdp is refused where "
                   f"one is missing (torch_rsdp.integrations.status() lists them)")


def wrap_method(cls, name: str, make: Callable[[Callable], Callable]) -> None:
    """``cls.name = make(original)``, once (a second call finds the wrapper and keeps it)."""
    original = cls.__dict__[name]
    if getattr(original, "_torch_rsdp_wrapped", False):
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper._torch_rsdp_wrapped = True
    setattr(cls, name, wrapper)


def _apply_row(row: Patch, module) -> str:
    cls = getattr(module, row.owner, None)
    if cls is None:
        return "absent" if row.optional else "missing"
    if row.kind == "override":
        return "active" if callable(getattr(cls, row.method, None)) else "missing"
    if row.method not in cls.__dict__:
        return "absent" if row.optional else "missing"
    wrap_method(cls, row.method, row.make)
    return "active"


def apply_rows(rows: Iterable[Patch], module) -> None:
    """Applies ``rows`` (all of one module) to the imported ``module``; called by the import
    hook of ``torch_rsdp.integrations._install``."""
    rows = list(rows)
    for name in {r.library for r in rows}:
        _check_version(name)
    for row in rows:
        with _LOCK:
            if _STATE.get(_key(row)) == "disabled":
                continue
        state = _apply_row(row, module)
        with _LOCK:
            _STATE[_key(row)] = state
        if state == "missing":
            version = library_version(row.library)
            lo, hi = LIBRARIES[row.library].tested
            record_missing(Missing(row.library, str(version), (lo, hi), row.kind, row.target,
                                   row.why))
            _warn_once(("missing", _key(row)),
                       f"torch_rsdp: {row.library} {version} has no {row.target} (tested with "
                       f"{row.library} {lo} to {hi}); a model sharded by torch_rsdp will be "
                       f"refused there, since without it {row.why}")
