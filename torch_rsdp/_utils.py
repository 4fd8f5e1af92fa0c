"""Small helpers that ``torch_rsdp.rsdp`` and ``torch_rsdp.plan`` both need.

Neutral ground: this module imports torch (and ``_host_staging``, which imports torch only), so
either package may use it without depending on the other.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch.distributed as dist
import torch.nn as nn

from ._host_staging import broadcast_coalesced

__all__ = ["chunk_sizes", "chunk_starts", "group_rank0", "is_conv1d", "swap_class", "broadcast_module_states",
           "all_gather_tensor", "reduce_scatter_tensor"]

# torch 2.13 renamed the tensor forms of all-gather / reduce-scatter; older torch has only
# these names.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


def chunk_sizes(n: int, world: int) -> List[int]:
    """Sizes of the ``world`` chunks of ``n`` items (``ceil(n / world)`` each, last ones short)."""
    m = -(-n // world) if n else 0
    return [max(0, min(m, n - j * m)) for j in range(world)]


def chunk_starts(n: int, world: int) -> List[int]:
    """Offset of each chunk (``chunk_sizes`` prefix sums)."""
    starts, s = [], 0
    for c in chunk_sizes(n, world):
        starts.append(s)
        s += c
    return starts


def group_rank0(group: Optional[dist.ProcessGroup]) -> int:
    """The global rank of ``group``'s rank 0 (``src`` / ``dst`` of torch's collectives take
    global ranks)."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def is_conv1d(module: nn.Module) -> bool:
    """True for a (non-subclassed) ``transformers`` ``Conv1D`` (GPT-2's Linear stored
    transposed: ``weight`` is ``[nx, nf]``, in x out) with its usual attributes.

    transformers is not a dependency: the class is recognised by its name and module."""
    cls = type(module)
    if cls.__name__ != "Conv1D" or not cls.__module__.startswith("transformers"):
        return False
    w = getattr(module, "weight", None)
    return (isinstance(w, nn.Parameter) and w.dim() == 2
            and tuple(w.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


_SUBCLASSES: Dict[Tuple[type, type, str], type] = {}


def swap_class(module: nn.Module, mixin: type, name: str) -> nn.Module:
    """Makes ``module`` an instance of ``class name(mixin, type(module))`` (made once per
    (mixin, class)), so the mixin's ``forward`` runs while ``isinstance`` checks against the
    module's own class keep holding (transformers' initialisers and pruning helpers use them).
    """
    base = type(module)
    key = (mixin, base, name)
    cls = _SUBCLASSES.get(key)
    if cls is None:
        cls = type(name, (mixin, base), {"__module__": mixin.__module__})
        _SUBCLASSES[key] = cls
    module.__class__ = cls
    return module


def broadcast_module_states(model: nn.Module, group: Optional[dist.ProcessGroup]) -> None:
    """Every parameter and buffer of ``model`` from ``group``'s rank 0 (as DDP does at
    construction), in coalesced broadcasts of up to 250 MiB. Collective."""
    if dist.get_world_size(group) == 1:
        return
    tensors = [t.detach() for t in list(model.parameters()) + list(model.buffers())]
    broadcast_coalesced(group, tensors, 250 << 20, group_rank0(group))
