"""A block pass's copies between the ring buffer and its members' whole tensors, two calls a
hop instead of four a member.

[Note: block copies in one call]
Each hop of a block gather ([Note: block gathers] in :mod:`.block_gather`) copies every
member's shard out of the ring buffer into the whole parameter it is a piece of, and each hop
of the block's gradient reduction copies every member's piece of its whole gradient in. Piece
by piece in Python that is a slice of the buffer, a view, a narrow of the whole tensor and a
copy per member and hop: for a decoder layer's seven layers about 90 us a hop against 40 us
for the copies alone (256-wide Llama at 4 ranks, one thread), several milliseconds a step when
ranks share cores.

Most pieces are one contiguous run of both tensors (a layer split by output features holds a
block of rows; a bias), so where the layout is known once per block the runs are found once:
a hop is then one ``split_with_sizes`` of the ring buffer and one ``torch._foreach_copy_``
between its pieces and the whole tensors' (split once per gather or per backward). A piece
that is not one run (a layer split by input features holds a block of columns; ``Conv1D``'s
transposed weight) keeps the piece-by-piece copy. Whether a piece is a run is read from the
module's own ``take`` applied to a meta tensor of the whole shape, so nothing here assumes how
a module splits.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

__all__ = ["BlockCopies", "whole_shape"]


def whole_shape(st, name: str) -> List[int]:
    """The whole shape of ``st``'s parameter ``name``: its shards joined along its dimension."""
    shapes, d = st.layout.shapes[name], st.dims[name]
    shape = list(shapes[0])
    shape[d] = sum(s[d] for s in shapes)
    return shape


def _runs(st, name: str, world: int):
    """Per rank ``j``, ``(offset, numel)`` of its shard inside the whole tensor flattened, when
    every shard is one contiguous run and together they tile it; else None."""
    probe = torch.empty(whole_shape(st, name), device="meta")
    runs = []
    for j in range(world):
        v = st.take(name, probe, j)
        if not v.is_contiguous() or tuple(v.shape) != st.layout.shapes[name][j]:
            return None
        runs.append((v.storage_offset(), v.numel()))
    pos = 0
    for off, n in sorted(runs):
        if off != pos:
            return None
        pos += n
    return runs if pos == probe.numel() else None


def _tiling(runs: List[Tuple[int, int]], total: int):
    """``split_with_sizes`` sizes covering ``[0, total)`` and, per run, its piece's index."""
    sizes, index, pos = [], {}, 0
    for k, (off, n) in sorted(enumerate(runs), key=lambda kv: kv[1][0]):
        if off > pos:
            sizes.append(off - pos)  # a gap: padding, or a piece copied one by one
        index[k] = len(sizes)
        sizes.append(n)
        pos = off + n
    if pos < total:
        sizes.append(total - pos)
    return sizes, [index[k] for k in range(len(runs))]


class BlockCopies:
    """The copies of one pass's members (``mods``, at ``offsets`` in the pass's flat buffer of
    ``numel`` elements): ``runs`` are ``(module, name)`` pieces copied in one call a hop,
    ``rest`` those copied one by one."""

    def __init__(self, mods: List[nn.Module], offsets: Dict[nn.Module, int], numel: int,
                 world: int):
        self.runs: List[Tuple[nn.Module, str]] = []
        self.rest: List[Tuple[nn.Module, str]] = []
        whole_runs = []
        for m in mods:
            st = m._rsdp
            for n in st.names:
                r = _runs(st, n, world)
                (self.runs if r is not None else self.rest).append((m, n))
                if r is not None:
                    whole_runs.append(r)
        # per entry: split sizes of its whole tensor, and per rank the piece holding its shard
        self.whole_sizes, self.whole_index = [], []
        for (m, n), r in zip(self.runs, whole_runs):
            sizes, idx = _tiling(r, math.prod(whole_shape(m._rsdp, n)))
            self.whole_sizes.append(sizes)
            self.whole_index.append(idx)
        # per rank: split sizes of the ring buffer, and per entry the piece holding its shard
        self.buf_sizes, self.buf_index = [], []
        for j in range(world):
            pieces = [(offsets[m] + m._rsdp.layout.offsets[n], int(math.prod(
                m._rsdp.layout.shapes[n][j]))) for m, n in self.runs]
            sizes, idx = _tiling(pieces, numel)
            self.buf_sizes.append(sizes)
            self.buf_index.append(idx)

    def pieces(self, tensors: List[torch.Tensor]) -> List[tuple]:
        """Each run entry's whole tensor (``tensors``, in ``runs`` order, contiguous) split into
        its ranks' pieces: once per gather or backward, not per hop."""
        return [t.view(-1).split_with_sizes(s) for t, s in zip(tensors, self.whole_sizes)]

    def to_whole(self, j: int, buf: torch.Tensor, pieces: List[tuple]) -> None:
        """Rank ``j``'s shards in ``buf`` into the whole tensors ``pieces`` came from."""
        if self.runs:
            src = buf.split_with_sizes(self.buf_sizes[j])
            bi, wi = self.buf_index[j], self.whole_index
            torch._foreach_copy_([p[wi[e][j]] for e, p in enumerate(pieces)],
                                 [src[bi[e]] for e in range(len(pieces))])

    def from_whole(self, j: int, buf: torch.Tensor, pieces: List[tuple]) -> None:
        """The whole tensors' (``pieces``) parts of rank ``j``'s shards into ``buf``."""
        if self.runs:
            dst = buf.split_with_sizes(self.buf_sizes[j])
            bi, wi = self.buf_index[j], self.whole_index
            torch._foreach_copy_([dst[bi[e]] for e in range(len(pieces))],
                                 [p[wi[e][j]] for e, p in enumerate(pieces)])
