"""The compute device's copies of the shards a ring schedule passes around host memory.

[Note: shards offloaded to host memory]
With FSDP2's ``CPUOffloadPolicy`` (``rsdp.shard(..., offload_policy=...)``) a sharded
module's flat storage, its gradient and so its optimizer state live in host memory, while
the module computes on a device (the device of its input). The ring itself runs on the host:
every hop moves host buffers, over shared memory inside a node and UCX between nodes, as it
would without a device. What crosses to the device is only the shard in hand: before each
visit the schedule copies it into one device buffer, reused from hop to hop, so the device
holds one shard of a layer at a time, never its own share of the model. In backward each
hop's gradient contribution is computed into one device buffer and copied back into the
host buffer the ring sends on, so the gradient sums arrive in host memory, beside the
parameters the optimizer steps there.

The copies are blocking: a hop's transfer (issued before the visit) still overlaps the
device's copy and compute of the shard in hand, but the next shard's copy is not issued on a
stream of its own. Where the ring carries the layer's own storage (hop 0) the copy reads it
directly; nothing on the host is copied twice.

A schedule whose device is the shards' own (or None) passes its buffers through untouched.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .memory import alloc_buffer, release_buffers

__all__ = ["DeviceCopies"]


class DeviceCopies:
    """For one schedule over host shards like ``src``: device copies of the shard in hand
    (:meth:`visit`) and device buffers for the contributions (:meth:`fill`, :meth:`step`)."""

    def __init__(self, src: torch.Tensor, device: Optional[torch.device]):
        self.device = None if device is None or torch.device(device) == src.device else device
        self._weights: Optional[torch.Tensor] = None
        self._out: Optional[torch.Tensor] = None

    def close(self) -> None:
        """Done: the device buffers are the tracker's no more (:func:`.memory.release_buffers`)."""
        release_buffers(self._weights, self._out)
        self._weights = self._out = None

    def _on_device(self, host: torch.Tensor) -> torch.Tensor:
        if self._weights is None:
            self._weights = alloc_buffer(host.numel(), host.dtype, self.device)
        self._weights.copy_(host)
        return self._weights

    def _out_buffer(self, host: torch.Tensor) -> torch.Tensor:
        # zeroed once: a contribution overwrites its shard's region, padding stays zero
        if self._out is None or self._out.dtype != host.dtype:
            self._out = alloc_buffer(host.numel(), host.dtype, self.device, zero=True)
        return self._out

    def visit(self, visit: Callable, j: int, host: torch.Tensor) -> None:
        """``visit(j, shard)`` with the shard on the compute device."""
        visit(j, host if self.device is None else self._on_device(host))

    def fill(self, contribute: Callable, j: int, host: torch.Tensor) -> None:
        """``contribute(j, buf)`` computed on the device and left in the host ``host``."""
        if self.device is None:
            contribute(j, host)
            return
        out = self._out_buffer(host)
        contribute(j, out)
        host.copy_(out)

    def step(self, step: Callable, j: int, weights: torch.Tensor, host_out: torch.Tensor) -> None:
        """``step(j, shard, out)`` with the shard and ``out`` on the device, ``out`` then
        copied into the host ``host_out``."""
        if self.device is None:
            step(j, weights, host_out)
            return
        w = self._on_device(weights)
        out = self._out_buffer(host_out)
        step(j, w, out)
        host_out.copy_(out)
