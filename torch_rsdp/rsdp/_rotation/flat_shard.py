"""Uneven chunking and the padded flat layout that lets a whole shard travel as one tensor.

A sharded module keeps this rank's shards of all its sharded parameters in one flat 1-D
storage. Each parameter owns a fixed *region* of that storage, as large as the largest rank's
shard of it; rank ``j``'s shard of the parameter occupies the start of the region (contiguous,
its own shape) and the rest is zero padding. Every rank's flat storage therefore has the same
length, so one ``ring_shift`` moves all of a module's shards, and whichever rank's shard is in
hand, :meth:`FlatLayout.view` finds its pieces.

Chunking (:func:`torch_rsdp._utils.chunk_sizes`, shared with ``plan``'s ``split:k``) follows
``torch.chunk``: ``m = ceil(n / world)`` rows per rank, the last ranks get
fewer (possibly zero).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from ..._utils import chunk_sizes, chunk_starts

__all__ = ["chunk_sizes", "chunk_starts", "FlatLayout"]


class FlatLayout:
    """Where each rank's shard of each parameter lives inside a flat buffer.

    ``shapes[name][j]`` is rank ``j``'s shard shape of parameter ``name``.
    """

    def __init__(self, shapes: Dict[str, Sequence[Tuple[int, ...]]]):
        self.shapes = {k: [tuple(s) for s in v] for k, v in shapes.items()}
        self.offsets: Dict[str, int] = {}
        off = 0
        for name, per_rank in self.shapes.items():
            self.offsets[name] = off
            off += max(_numel(s) for s in per_rank)
        self.numel = off  # length of every rank's flat buffer

    def view(self, flat: torch.Tensor, name: str, rank: int) -> torch.Tensor:
        """Rank ``rank``'s shard of ``name`` inside ``flat`` (a contiguous view)."""
        shape = self.shapes[name][rank]
        off = self.offsets[name]
        return flat[off:off + _numel(shape)].view(shape)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
