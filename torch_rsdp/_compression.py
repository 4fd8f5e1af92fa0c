"""Compressed traffic between nodes: block-quantised values on the inter-node stage.

    torch_rsdp.set_compression(group, all_gather="int8", reduce_scatter="int8")

:func:`set_compression` makes a group's hierarchical all-gather, reduce-scatter and
all-reduce (and RSDP's ring hops) send what crosses nodes as int8 or int4 codes, one float32
scale per block; :func:`reduce_scatter_feedback`, :class:`FeedbackReduceScatter` (FSDP2) and
:class:`FeedbackAllReduce` carry what quantisation lost into the next step. What is
compressed, the format and its error bound, what stays exact, and what was measured:
docs/multinode.md, "Compressed traffic between nodes".
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from . import _C
from ._ring import backend_of, rsdp_backend

__all__ = ["set_compression", "get_compression", "quantize_roundtrip", "quantize_seconds",
           "LEVELS",
           "reduce_scatter_feedback", "residual_numel", "FeedbackReduceScatter",
           "FeedbackAllReduce"]

#: Largest code of each format (the scale is a block's largest finite magnitude over it).
LEVELS = {"int8": 126, "int4": 6}


def set_compression(group: Optional[dist.ProcessGroup] = None, *, all_gather: str = "none",
                    reduce_scatter: str = "none", all_reduce: str = "none",
                    ring_shift: str = "none", ring_shift_reduce: str = "none",
                    block: int = 512) -> None:
    """Sets what ``group``'s collectives send between nodes: ``"none"`` (exact, the
    default), ``"int8"``, or for the reductions also ``"int4"``; ``block`` elements share a
    scale (even, 32 to 1 048 576). ``ring_shift`` / ``ring_shift_reduce`` compress the
    hops of :func:`torch_rsdp.ring_shift` / :func:`torch_rsdp.ring_shift_reduce` whose two
    ranks are on different nodes (RSDP's weights and gradients); the other hops stay exact.
    Ops issued after the call use it. Every rank of the group must call it alike; a rank
    that does not makes the next compressed op raise a mismatch on every rank (never a
    wrong result). ``ValueError`` for an unknown format or block."""
    backend = rsdp_backend(group, feature="compression between nodes (set_compression)")
    backend.set_compression(all_gather, reduce_scatter, all_reduce, int(block), ring_shift,
                            ring_shift_reduce)


def get_compression(group: Optional[dist.ProcessGroup] = None) -> Dict[str, str]:
    """The setting last made on this rank: all_gather, reduce_scatter, all_reduce,
    ring_shift, ring_shift_reduce, block."""
    backend = backend_of(group)
    if backend is None:  # another backend compresses nothing: the true answer, not an error
        return {"all_gather": "none", "reduce_scatter": "none", "all_reduce": "none",
                "ring_shift": "none", "ring_shift_reduce": "none", "block": 512}
    return dict(backend.compression())


def quantize_roundtrip(x: torch.Tensor, bits: str = "int8", block: int = 512
                       ) -> Tuple[torch.Tensor, int]:
    """``dequantize(quantize(x))`` with the kernels the collectives use, and the bytes the
    quantised form takes (for tests and for choosing a block size)."""
    return _C._quantize_roundtrip(x.contiguous(), bits, int(block))


def quantize_seconds(numel: int, bits: str = "int8", block: int = 512) -> Tuple[float, float]:
    """Seconds this machine's kernels take to quantise and to dequantise ``numel`` float32
    elements (one core; what the planner prices compression with)."""
    q, d = _C._quant_speed(int(numel), bits, int(block))
    return q, d


def residual_numel(output_numel: int, group: Optional[dist.ProcessGroup] = None) -> int:
    """The size of :func:`reduce_scatter_feedback`'s residual for an output of
    ``output_numel`` elements: one region of the output's size per node of ``group``."""
    backend = rsdp_backend(group, feature="error feedback of compressed reduce-scatters")
    return int(output_numel) * int(backend.topology()["num_nodes"])


def reduce_scatter_feedback(output: torch.Tensor, input: torch.Tensor, residual: torch.Tensor,
                            group: Optional[dist.ProcessGroup] = None, op=dist.ReduceOp.SUM,
                            async_op: bool = False):
    """``reduce_scatter_tensor`` with **error feedback** on its compressed stage.

    ``residual`` is a float32 tensor of :func:`residual_numel` elements (nodes x the output's
    size) that the caller keeps from one step to the next (zeros at first; save it with the
    model to resume exactly). This rank quantises its node's partial sums of the regions of
    its rail (one rank per node): region ``m`` of the residual belongs to the one on node
    ``m``. Before quantising, what quantising lost last time is added; what is lost now is
    stored back, so the error is carried forward instead of dropped, and over steps the sum
    of what arrives follows the sum of the exact gradients. Without compression on the op's
    path it is a plain reduce-scatter and ``residual`` stays as it is. ``op``: SUM or AVG."""
    if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        raise ValueError(f"reduce_scatter_feedback: op must be SUM or AVG, got {op}")
    backend = rsdp_backend(group, feature="reduce_scatter_feedback (error feedback of "
                                          "compression between nodes)")
    work = backend.reduce_scatter_feedback(output, input, residual,
                                           average=op == dist.ReduceOp.AVG, async_op=async_op)
    if async_op:
        return work
    work.wait()
    return None


class FeedbackReduceScatter(ReduceScatter):
    """FSDP2's gradient reduce-scatter with error feedback, for one FSDP module::

        module.set_custom_reduce_scatter(FeedbackReduceScatter())

    Keeps the module's residual (float32, :func:`residual_numel` of the output) between
    steps. Under ``no_sync``-style accumulation FSDP2 reduce-scatters once per step, so the
    residual is applied once per step too. Ops other than SUM/AVG go through the plain
    reduce-scatter."""

    def __init__(self) -> None:
        self.residual: Optional[torch.Tensor] = None

    def allocate(self, size, *, dtype, device):
        # Ordinary memory: the groups whose traffic is compressed span nodes, and only
        # single-node groups have a communication memory pool.
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                              async_op=async_op)
        n = residual_numel(output_tensor.numel(), group)
        if self.residual is None or self.residual.numel() != n:
            self.residual = torch.zeros(n, dtype=torch.float32)
        return reduce_scatter_feedback(output_tensor, input_tensor, self.residual, group, op,
                                       async_op)


class FeedbackAllReduce:
    """A SUM all-reduce of one flat float tensor with error feedback at both of its
    compressed stages, for gradients that every rank keeps whole (``no_shard`` and
    ``shard_optim`` units):

    1. :func:`reduce_scatter_feedback`: the node partial sums cross nodes quantised, each
       rank keeping what its quantising lost (``residual``);
    2. an all-gather of the reduced shards, int8 across nodes; before it, each rank adds to
       its shard what the last all-gather lost of it (``owner_residual``: the rank itself
       receives ``dequantize(quantize(shard))`` like every other, so it knows the loss).

    The group must compress both stages (``set_compression(group, all_gather=...,
    reduce_scatter=...)``). The tensor is padded to a multiple of the group size; the
    residuals (float32, kept between steps, part of the training state) follow its size."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.residual: Optional[torch.Tensor] = None
        self.owner_residual: Optional[torch.Tensor] = None
        self._pending = None

    def __call__(self, flat: torch.Tensor) -> None:
        self.start(flat).wait()

    def start(self, flat: torch.Tensor) -> "FeedbackAllReduce":
        """Issues the reduce-scatter; :meth:`wait` finishes the all-reduce into ``flat``."""
        n = flat.numel()
        shard = -(-n // self.world)
        if (self.residual is None or self.owner_residual is None
                or self.owner_residual.numel() != shard):
            self.residual = torch.zeros(residual_numel(shard, self.group))
            self.owner_residual = torch.zeros(shard)
        padded = flat if n == shard * self.world else torch.cat(
            [flat, flat.new_zeros(shard * self.world - n)])
        mine = torch.empty(shard, dtype=flat.dtype, device=flat.device)
        work = reduce_scatter_feedback(mine, padded, self.residual, self.group, async_op=True)
        self._pending = (flat, padded, mine, work)
        return self

    def wait(self) -> None:
        flat, padded, mine, work = self._pending
        self._pending = None
        work.wait()
        shard = mine.numel()
        x = mine.float() + self.owner_residual
        mine.copy_(x)
        dist.all_gather_into_tensor(padded, mine, group=self.group)  # input consumed
        own = padded[self.rank * shard:(self.rank + 1) * shard]
        torch.sub(x, own.float(), out=self.owner_residual)
        if padded is not flat:
            flat.copy_(padded[:flat.numel()])
