"""Registers the rsdp backend with torch.distributed."""
from datetime import timedelta

import torch.distributed as dist

from . import _C

BACKEND_NAME = "rsdp"


def _create_backend(dist_opts, backend_opts=None):
    """Factory called by torch.distributed for every process group on rsdp."""
    size = dist_opts.group_size
    global_ranks = list(dist_opts.global_ranks_in_group or range(size))
    timeout = dist_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    return _C.create_backend(
        dist_opts.store,
        dist_opts.group_rank,
        size,
        timeout,
        global_ranks,
        str(dist_opts.group_id),
    )


def register() -> None:
    """Makes "rsdp" a torch.distributed backend, for CPU tensors and, in a
    build with CUDA, CUDA tensors. Safe to call more than once."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    # One backend object serves both devices (torch creates one when every
    # device maps to the same backend), dispatching on each op's tensors.
    devices = ["cpu", "cuda"] if _C.build_info()["cuda"] else ["cpu"]
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=devices
    )
