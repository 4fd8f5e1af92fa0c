"""torch_rsdp: the "rsdp" torch.distributed backend.

    import torch_rsdp
    torch.distributed.init_process_group("rsdp")

Importing the package registers the backend (idempotently) for CPU tensors,
and for CUDA tensors in a build with CUDA (see :mod:`torch_rsdp.cuda`).

Layout, bottom to top (imports point downwards only; ``tests/project/test_import_rules.py`` checks it):

* the backend: the extension ``_C``, its registration, and the public modules over it
  (``ring``, ``topology``, ``compression``, ``comm_memory``, ``cuda``, ``health``);
* neutral ground that ``rsdp`` and ``plan`` share (``_utils``, ``_dtensor_params``,
  ``_grad_sync``, ``_checkpoint_hooks``): the backend's modules at most;
* :mod:`torch_rsdp.rsdp`: the backend and the neutral modules;
* :mod:`torch_rsdp.plan`: all of the above, ``rsdp`` through its public API only.

This package's ``__init__`` imports the backend only, so ``import torch_rsdp`` does not load
``rsdp`` or ``plan``; :mod:`torch_rsdp.torchft` (optional) builds on the backend too.
"""
from . import _shrink_world, integrations
from ._registration import BACKEND_NAME, register
from .comm_memory import comm_empty, comm_memory_in_use
from .compression import get_compression, set_compression
from .cuda import build_info, cuda_available, cuda_built, cuda_paths
from .health import group_error, monitored_barrier
from .ring import ring_neighbours, ring_shift, ring_shift_reduce
from .topology import comm_stats, reset_comm_stats, topology

__version__ = "0.1.0"

register()
_shrink_world.install()
integrations.install()  # the stock trainers over sharded models (torch_rsdp.integrations)

__all__ = [
    "BACKEND_NAME",
    "build_info",
    "comm_empty",
    "comm_memory_in_use",
    "cuda_available",
    "cuda_built",
    "cuda_paths",
    "comm_stats",
    "get_compression",
    "set_compression",
    "group_error",
    "monitored_barrier",
    "reset_comm_stats",
    "topology",
    "register",
    "ring_neighbours",
    "ring_shift",
    "ring_shift_reduce",
    "__version__",
]
