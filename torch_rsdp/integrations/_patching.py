"""Applies the rows of :mod:`._patch_table` as their libraries are imported, and remembers how
each went: the state :func:`torch_rsdp.integrations.status` reports and the guards consult.

A row's state is one of

* ``"pending"``: its module has not been imported (it is patched when it is);
* ``"active"``: patched (``patch``, ``guard``), or present to be overridden (``override``);
* ``"absent"``: an optional row whose class or method this version lacks, and with it the
  path the row serves;
* ``"missing"``: the method is not there, in the class or any base class of it (a method a
  release moved into a base class is found there, and the wrapper goes on the named class:
  :func:`wrap_method`). Reported once as a warning when the module is imported; a sharded
  model that then comes in by a guard is refused (:mod:`._refusal`) instead of running the
  library's unsharded code, which would save rank 0's shards as if they were the model, and
  where no guard stands (the guard's own method is missing, or the model came in another way)
  the model's first training step inside the library refuses it (:mod:`._first_step`);
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

from . import _first_step
from ._patch_table import LIBRARIES, PATCHES, Patch
from ._refusal import Missing, record_missing

__all__ = ["IntegrationWarning", "find_method", "wrap_method", "apply_rows", "state_of",
           "library_version", "in_tested_range"]


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


def find_method(cls, name: str):
    """``(defining class, raw attribute)`` of method ``name`` of ``cls``, looked up through
    ``cls.__mro__`` as attribute access finds it (``inspect.getattr_static``: no descriptor is
    run), or ``(None, None)``. A method a release moved into a base class is the same method,
    so it is found there; ``object``'s slots (``object.__init__``, ...) are not a library's
    method, and a class that only inherits them lacks the method."""
    for klass in cls.__mro__:
        if klass is object:
            break
        if name in klass.__dict__:
            return klass, klass.__dict__[name]
    return None, None


def wrap_method(cls, name: str, make: Callable[[Callable], Callable]) -> bool:
    """``cls.name = make(original)``, once (a second call finds the wrapper and keeps it);
    ``original`` is the method ``cls`` has, wherever in its MRO it is defined. Returns False
    (nothing done) if ``cls`` has no such method.

    [Note: the wrapper goes on ``cls``, the class the table names, never on the base class a
    release moved the method to. Patching the base would reach every other subclass of it too
    (a sibling trainer, a mixin's other users), with wrappers written against the named class's
    attributes (``self.model``, ``self.args``, ...), which those need not have; installed on
    ``cls`` (an attribute of its own that shadows the base's), it reaches exactly what it
    reached before the move: ``cls`` and its subclasses, ``super()`` calls inside the base's
    code keep working (the wrapper calls the base's function with the same ``self``), and the
    base stays the library's own. The idempotence check looks at ``cls.__dict__`` only: a
    wrapper found further up the MRO was installed for another row (a row on the base class
    itself) and is wrapped again here, as the method it now is.]"""
    owner, original = find_method(cls, name)
    if owner is None:
        return False
    if owner is cls and getattr(original, "_torch_rsdp_wrapped", False):
        return True
    wrapper = functools.wraps(original)(make(original))
    wrapper._torch_rsdp_wrapped = True
    setattr(cls, name, wrapper)
    return True


def _apply_row(row: Patch, module) -> str:
    cls = getattr(module, row.owner, None)
    if cls is None:
        return "absent" if row.optional else "missing"
    if row.kind == "override":
        return "active" if callable(find_method(cls, row.method)[1]) else "missing"
    if not wrap_method(cls, row.method, row.make):
        return "absent" if row.optional else "missing"
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
            _first_step.arm()  # where no guard stands, the model's first step refuses
            _warn_once(("missing", _key(row)),
                       f"torch_rsdp: {row.library} {version} has no {row.target} (tested with "
                       f"{row.library} {lo} to {hi}); a model sharded by torch_rsdp will be "
                       f"refused there (where it comes in, or at its first training step), "
                       f"since without it {row.why}")
