"""Collectives on tensors of a device the process group has no backend for, through host
memory.

A model whose shards are offloaded ([Note: shards offloaded to host memory] in
:mod:`torch_rsdp.rsdp._rotation.device_copies`) needs no device backend for its ring: every
hop moves host buffers. The only device tensors left to any collective are the parameters a
rank holds whole (norms, biases, adapters) and their gradients: small, and averaged once per
backward. So a group initialised for the host alone (``init_process_group("rsdp")`` on a
machine whose model computes on a GPU) still trains it: those collectives copy to the host,
run there and copy back. A group with a backend for the device runs them in place.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

__all__ = ["has_backend", "collective_device", "broadcast_coalesced"]

_HOST = torch.device("cpu")


def has_backend(group: Optional[dist.ProcessGroup], device: torch.device) -> bool:
    """Whether ``group`` (default: world) has a backend for tensors of ``device``'s type."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        pg._get_backend(torch.device(device))
    except RuntimeError:
        return False
    return True


def collective_device(group: Optional[dist.ProcessGroup], device: torch.device) -> torch.device:
    """``device`` if ``group`` has a backend for its type, else the host."""
    if device.type in ("cpu", "meta") or has_backend(group, device):
        return device
    return _HOST


def broadcast_coalesced(group: Optional[dist.ProcessGroup], tensors: List[torch.Tensor],
                        buffer_size: int, src: int) -> None:
    """``dist._broadcast_coalesced`` of ``tensors``, one call per device in the order met,
    staged through host copies for a device the group has no backend for."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    by_device: dict = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, ts in by_device.items():
        if collective_device(pg, device) == device:
            dist._broadcast_coalesced(pg, ts, buffer_size, src)
            continue
        host = [t.to(_HOST) for t in ts]
        dist._broadcast_coalesced(pg, host, buffer_size, src)
        for t, h in zip(ts, host):
            t.copy_(h)
