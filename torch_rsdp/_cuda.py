"""What CUDA support this build of torch_rsdp has, and what serves a group's CUDA ops.

A build made where torch has CUDA and nvcc is installed serves CUDA tensors:
inside a node over NCCL (each rank on its own GPU) or CUDA IPC (ranks sharing
GPUs), across nodes over NCCL rails. A CPU-only build serves CPU tensors and
rejects CUDA tensors with an error that says so.
"""
from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from ._ring import rsdp_backend

__all__ = ["build_info", "cuda_built", "cuda_available", "cuda_paths"]


def build_info() -> dict:
    """``{"cuda": bool, "cuda_version": str | None, "nccl_version": str | None, "torch": str}``."""
    info = dict(_C.build_info())
    info["torch"] = torch.__version__
    return info


def cuda_built() -> bool:
    """True when the extension was compiled with its CUDA parts."""
    return bool(_C.build_info()["cuda"])


def cuda_available() -> bool:
    """True when CUDA tensors can be used: a CUDA build and a visible GPU."""
    return cuda_built() and torch.cuda.is_available()


def cuda_paths(group: Optional[dist.ProcessGroup] = None) -> str:
    """Which transports serve ``group``'s CUDA ops on this rank, e.g.
    ``"intra-node: cuda-ipc (3 ranks on 1 GPU)"``; empty before its first CUDA op. (Under
    the test fixture ``RSDP_TEST_EMULATE_DEVICE`` it names the emulated device, which serves the
    group's CPU tensors.)"""
    return rsdp_backend(group, feature="cuda_paths").cuda_paths()
