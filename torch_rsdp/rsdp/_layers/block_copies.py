"""A block pass's copies between the ring buffer and its members' whole tensors, two calls a
hop instead of four a member.

[Note: block copies in one call]
Each hop of a block gather ([Note: block gathers] in :mod:`.block_gather`) copies every
member's shard out of the ring buffer into the whole parameter it is a piece of, and each hop
of the block's gradient reduction copies every member's piece of its whole gradient in. Piece
by piece in Python that is a slice of the buffer, a view, a narrow of the whole tensor and a
copy per member and hop: for a decoder layer's seven layers the bookkeeping costs more than
the copies themselves, and it adds up over a step when ranks share cores.

Most pieces are one contiguous run of both tensors (a layer split by output features holds a
block of rows; a bias), so the layout is worked out once per block and set of members: a
hop is then one ``split_with_sizes`` of the ring buffer and one ``torch._foreach_copy_``
between its pieces and the whole tensors' parts, found once per gather or backward: the
pieces of one ``split_with_sizes`` of a whole tensor for a run, the module's own ``take`` of
it otherwise (a layer split by input features holds a block of columns; ``Conv1D``'s weight
is transposed), with the buffer's piece viewed in the shard's shape. Whether a piece is a run
is read from ``take`` applied to a meta tensor of the whole shape, so nothing here assumes
how a module splits.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

__all__ = ["BlockCopies", "copies_of", "whole_shape"]


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
        assert off >= pos, f"overlapping pieces at {off} ({pos} taken)"
        if off > pos:
            sizes.append(off - pos)  # a gap: a region's padding past a shorter shard
        index[k] = len(sizes)
        sizes.append(n)
        pos = off + n
    if pos < total:
        sizes.append(total - pos)
    return sizes, [index[k] for k in range(len(runs))]


class BlockCopies:
    """The copies of one pass's members (``mods``, at ``offsets`` in the pass's flat buffer of
    ``numel`` elements), every ``(module, name)`` in ``entries``."""

    def __init__(self, mods: List[nn.Module], offsets: Dict[nn.Module, int], numel: int,
                 world: int):
        self.world = world
        self.entries = [(m, n) for m in mods for n in m._rsdp.names]
        # per entry: None, or split sizes of its whole tensor and per rank the piece that is
        # its shard (a run)
        self.whole_split = []
        for m, n in self.entries:
            r = _runs(m._rsdp, n, world)
            self.whole_split.append(None if r is None else
                                    _tiling(r, math.prod(whole_shape(m._rsdp, n))))
        # per rank: split sizes of the ring buffer, per entry the piece holding its shard, and
        # the shape it is seen with (None: a run, copied flat)
        self.buf_sizes, self.buf_index, self.shapes = [], [], []
        for j in range(world):
            shapes = [m._rsdp.layout.shapes[n][j] for m, n in self.entries]
            pieces = [(offsets[m] + m._rsdp.layout.offsets[n], math.prod(sh))
                      for (m, n), sh in zip(self.entries, shapes)]
            sizes, idx = _tiling(pieces, numel)
            self.buf_sizes.append(sizes)
            self.buf_index.append(idx)
            self.shapes.append([None if w is not None else sh
                                for w, sh in zip(self.whole_split, shapes)])

    def targets(self, tensors: List[torch.Tensor]) -> List[list]:
        """Per entry (``tensors``: each entry's whole tensor, in ``entries`` order), per rank,
        the part of it that is that rank's shard: once per gather or backward, not per hop."""
        out = []
        for (m, n), t, split in zip(self.entries, tensors, self.whole_split):
            if split is None:
                out.append([m._rsdp.take(n, t, j) for j in range(self.world)])
            else:
                pieces = t.view(-1).split_with_sizes(split[0])  # contiguous: a view
                out.append([pieces[k] for k in split[1]])
        return out

    def _buf(self, j: int, buf: torch.Tensor) -> list:
        """Rank ``j``'s shard of each entry inside ``buf``, as ``targets`` sees it."""
        src = buf.split_with_sizes(self.buf_sizes[j])
        return [src[k] if sh is None else src[k].view(sh)
                for k, sh in zip(self.buf_index[j], self.shapes[j])]

    def to_whole(self, j: int, buf: torch.Tensor, targets: List[list]) -> None:
        """Rank ``j``'s shards in ``buf`` into the whole tensors ``targets`` came from."""
        torch._foreach_copy_([t[j] for t in targets], self._buf(j, buf))

    def from_whole(self, j: int, buf: torch.Tensor, targets: List[list]) -> None:
        """The whole tensors' (``targets``) parts that are rank ``j``'s shards into ``buf``."""
        torch._foreach_copy_(self._buf(j, buf), [t[j] for t in targets])


def copies_of(owner, mods: List[nn.Module], offsets: Dict[nn.Module, int], numel: int,
              world: int) -> BlockCopies:
    """The plan of ``mods`` (see :class:`BlockCopies`), made once and kept on ``owner`` (a
    block, or a unit's sharding state) for that set of members."""
    plans = owner.__dict__.setdefault("_rsdp_copies", {})
    key = tuple(mods)
    if key not in plans:
        plans[key] = BlockCopies(mods, offsets, numel, world)
    return plans[key]
