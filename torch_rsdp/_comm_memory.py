"""Communication memory: CPU tensors that collectives read in one copy.

Each rank of a single-node rsdp group owns a region of the group's shared
memory (``RSDP_POOL_BYTES`` per rank, virtual until used). A collective whose
buffers lie there reads its peers' data where it lies: one copy instead of
two through the staging buffers (the ``rsdp:pool`` columns of
``benchmarks/results/results.md`` against ``rsdp``; the gain is largest while
the data fits in cache, and beyond it both approach the memory bandwidth's
limit).

torch reaches it through ``Backend.allocate_tensor``, which FSDP2 uses for its
all-gather and reduce-scatter buffers after
``module.set_allocate_memory_from_process_group_for_comm(True)``
(``torch_rsdp.plan.apply`` turns that on). :func:`comm_empty` gives the same
memory to any other code. Where there is no pool (a group of one rank, a group
spanning nodes, a full pool, a CUDA tensor) ordinary memory is returned, and
every collective accepts it.
"""
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from ._ring import rsdp_backend

__all__ = ["comm_empty", "comm_memory_in_use"]

_CPU = torch.device("cpu")


def comm_empty(size: Union[int, Sequence[int]], *, dtype: torch.dtype = torch.float32,
               group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """An uninitialised CPU tensor of ``size`` in ``group``'s communication memory.

    Not collective: each rank allocates its own. The tensor stays valid after
    the group is destroyed.
    """
    shape = (size,) if isinstance(size, int) else tuple(size)
    numel = 1
    for s in shape:
        numel *= int(s)
    backend = rsdp_backend(group, feature="communication memory (comm_empty)")
    flat = backend.allocate_tensor(numel, dtype=dtype, device=_CPU)
    return flat.view(shape)


def comm_memory_in_use(group: Optional[dist.ProcessGroup] = None) -> int:
    """Bytes of ``group``'s communication memory this rank has handed out and not freed."""
    return rsdp_backend(group, feature="communication memory").pool_bytes_in_use
