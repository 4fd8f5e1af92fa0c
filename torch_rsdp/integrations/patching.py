"""Replace a method of a third-party class by a wrapper, once, keeping the original."""
from __future__ import annotations

import functools
from typing import Callable

__all__ = ["wrap_method"]


def wrap_method(cls, name: str, make: Callable[[Callable], Callable]) -> bool:
    """``cls.name = make(original)`` unless done already (or ``cls`` has no ``name``: a
    version of the library without it); returns whether it patched."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, "_torch_rsdp_wrapped", False):
        return False
    wrapper = functools.wraps(original)(make(original))
    wrapper._torch_rsdp_wrapped = True
    setattr(cls, name, wrapper)
    return True
