"""A process group's health: which ranks are missing, and what broke it.

``torch.distributed.monitored_barrier`` refuses every backend not named "gloo", so the rsdp
backend offers it here with torch's documented semantics; ``group_error`` is the
``get_error`` torch binds for NCCL only. Shrinking a group after a failure needs nothing
from this package: ``torch.distributed.shrink_group`` works on rsdp groups as documented.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional, Union

import torch
import torch.distributed as dist

from ._ring import backend_of, rsdp_backend

__all__ = ["monitored_barrier", "group_error"]


def monitored_barrier(group: Optional[dist.ProcessGroup] = None,
                      timeout: Optional[Union[timedelta, float]] = None,
                      wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for a group on the rsdp backend (or whose CPU
    tensors gloo serves, under any group name: then gloo's own).

    Non-zero ranks report to rank 0 and wait for its answer; rank 0 waits up to ``timeout``
    for each and raises ``RuntimeError`` naming the first rank that did not arrive ("Rank 2
    failed to pass monitoredBarrier in 1000 ms") or, with ``wait_all_ranks=True``, all of
    them ("Ranks 1, 2 failed ..."). The other ranks then raise with rank 0's verdict at once;
    if rank 0 itself does not answer within twice the timeout, they raise naming it.
    ``timeout`` defaults to the group's timeout (a float is seconds). Ranks outside
    ``group`` return at once, as torch's collectives do.
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if dist.distributed_c10d._rank_not_in_group(pg):
        return
    if isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    if timeout is not None and timeout.total_seconds() <= 0:
        raise ValueError(f"monitored_barrier: timeout must be positive, got {timeout}")
    if backend_of(pg) is None and not _gloo_for_cpu(pg):
        rsdp_backend(pg, feature="monitored_barrier (rsdp's, or gloo's for CPU tensors)")
    if backend_of(pg) is None and timeout is None:  # torch's default for gloo's
        timeout = dist.distributed_c10d._get_default_timeout(dist.Backend.GLOO)
    # the group's CPU backend answers: rsdp's, or gloo's (torch's own monitored_barrier asks
    # for a group named "gloo", so "cpu:gloo,cuda:nccl" and an unnamed default are refused
    # there although gloo serves their CPU tensors)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _gloo_for_cpu(pg) -> bool:
    try:
        return pg._get_backend(torch.device("cpu")).name() == "gloo"
    except RuntimeError:
        return False


def group_error(group: Optional[dist.ProcessGroup] = None):
    """The first failure that broke ``group``, as torch's ``ErrorType``: ``SUCCESS``,
    ``TIMEOUT`` (a collective passed its deadline), ``REMOTE_ERROR`` (a peer died) or
    ``COMM_ERROR``. Bad arguments and mismatched calls leave a group usable and are not
    counted."""
    return rsdp_backend(group, feature="the failure notice (group_error)").get_error()
