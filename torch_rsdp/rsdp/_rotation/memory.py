"""Allocation of RSDP's temporary shard buffers, with an optional tracker for tests.

Every rotation / gradient buffer the wrappers create goes through :func:`alloc_buffer`. While a
:class:`MemoryTracker` is active, each allocation samples the bytes alive on this rank:
the storages of the model's parameters and gradients plus every tracked buffer still alive,
each storage counted once (gradients of sharded layers are views into a buffer that was
tracked while it accumulated, so it is not counted twice). Memory only grows at allocations,
so sampling there sees the peak.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from ..._dtensor_params import local

__all__ = ["alloc_buffer", "release_buffers", "MemoryTracker"]

_ACTIVE: Optional["MemoryTracker"] = None


def alloc_buffer(numel: int, dtype: torch.dtype, device, zero: bool = False) -> torch.Tensor:
    """A flat 1-D buffer of ``numel`` elements (zeroed if ``zero``), reported to the tracker."""
    t = (torch.zeros if zero else torch.empty)(numel, dtype=dtype, device=device)
    if _ACTIVE is not None:
        _ACTIVE._on_alloc(t)
    return t


def release_buffers(*bufs) -> None:
    """Tells the tracker the wrapper no longer references ``bufs`` (``None`` entries skipped).

    The memory may stay allocated a little longer: the backend's worker thread drops its own
    references to a ring op's tensors only after the op's Work has completed.
    """
    if _ACTIVE is not None:
        _ACTIVE._on_release([b for b in bufs if b is not None])


class MemoryTracker:
    """Context manager recording the peak of (parameters + gradients + RSDP buffers) bytes.

    ``peak`` is the largest sample counting the buffers the wrapper still references (not yet
    passed to :func:`release_buffers`); ``peak_alive`` counts every tracked buffer whose memory
    is still allocated (the backend may hold a finished op's tensors a moment longer);
    ``peak_buffers`` the buffer bytes (storages that are neither a parameter's nor a
    gradient's) in the ``peak`` sample; ``max_buffer`` the largest single buffer.
    """

    def __init__(self, module: torch.nn.Module):
        self.params = list(module.parameters())
        self._buffers: list = []
        self.peak = 0
        self.peak_alive = 0
        self.peak_buffers = 0
        self.max_buffer = 0
        self.n_allocs = 0

    def __enter__(self):
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a MemoryTracker is already active")
        _ACTIVE = self
        self.sample()
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = None
        self._buffers = []
        return False

    def _on_alloc(self, t: torch.Tensor) -> None:
        self.n_allocs += 1
        self.max_buffer = max(self.max_buffer, t.untyped_storage().nbytes())
        self._buffers.append([weakref.ref(t), False])
        self.sample()

    def _on_release(self, bufs) -> None:
        for entry in self._buffers:
            t = entry[0]()
            if t is not None and any(t is b for b in bufs):
                entry[1] = True

    def live_buffers(self, held_only: bool = False) -> list:
        """Tracked buffers still allocated (``held_only``: and not released by the wrapper)."""
        alive = [(w(), released) for w, released in self._buffers]
        self._buffers = [e for e, (t, _) in zip(self._buffers, alive) if t is not None]
        return [t for t, released in alive if t is not None and not (held_only and released)]

    def sample(self) -> int:
        """Bytes held now; updates ``peak`` and ``peak_alive``."""
        held = self._total(self.live_buffers(held_only=True))
        if held[0] > self.peak:
            self.peak, self.peak_buffers = held
        self.peak_alive = max(self.peak_alive, self._total(self.live_buffers())[0])
        return held[0]

    def _total(self, buffers):
        owned = {}
        for p in self.params:
            for t in (local(p), local(p.grad)):
                if t is not None:
                    s = t.untyped_storage()
                    owned[s.data_ptr()] = s.nbytes()
        extra = {}
        for t in buffers:
            s = t.untyped_storage()
            if s.data_ptr() not in owned:
                extra[s.data_ptr()] = s.nbytes()
        return sum(owned.values()) + sum(extra.values()), sum(extra.values())
