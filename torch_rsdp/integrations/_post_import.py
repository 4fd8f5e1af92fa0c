"""Run a function on a module right after it is first imported (or at once, if it is).

The trainer integrations patch classes of libraries the user may import before or after
``import torch_rsdp``, or never. Importing those libraries ourselves would cost seconds (and
``transformers.trainer`` pulls in half of the ecosystem), so :func:`when_imported` waits: a
finder at the front of ``sys.meta_path`` lets the usual finders locate the module, then wraps
its loader so that the callbacks run once the module has executed.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Callable, Dict, List

__all__ = ["when_imported"]

_LOCK = threading.RLock()
_PENDING: Dict[str, List[Callable]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, name: str, inner):
        self.name, self.inner = name, inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        with _LOCK:
            callbacks = _PENDING.pop(self.name, [])
        for fn in callbacks:
            fn(module)

    def __getattr__(self, attr):  # get_source, is_package, ... of the real loader
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(name, spec.loader)
                return spec
        return None


_FINDER = _Finder()


def when_imported(name: str, fn: Callable) -> None:
    """Calls ``fn(module)`` once module ``name`` has been imported: now, if it has."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            _PENDING.setdefault(name, []).append(fn)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    fn(module)
