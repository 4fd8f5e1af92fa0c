"""The whole units of one block gathered together: one rotation for a decoder layer.

[Note: unit blocks]
A unit computed whole ([Note: small units computed whole] in :mod:`.unit_whole`) gathers on
its own: a decoder layer's attention and MLP cost two rotations forward and four backward,
``6 (W - 1)`` hops, twice a block of small layers ([Note: block gathers] in
:mod:`.._layers.block_gather`). So from 3 ranks on, on one node, the units of one block (an element of
an ``nn.ModuleList`` / ``nn.Sequential``, grouped as block gathers group layers) that compute
whole take part in one pass of :mod:`.._layers.block_gather`: the first of them to run rotates all
their shards once (:func:`.._layers.block_gather.open_pass`), each computes with its whole parameters
from the pass (:class:`_BlockUnitFn`), the first backward gathers once more for all of them,
and the gradients of the whole parameters ride home summed in the pass's one counter-rotation.
``3 (W - 1)`` hops a block, as for small layers, and the last gather of a forward stays for
its backward ([Note: the last gather stays for backward]).

Which units take part is decided from the token count agreed over the group, so every rank
makes the same passes; a block with fewer than two such units leaves them to gather alone.

[Note: units in their block's pass]
A unit in a pass holds every head's weights at once, so it needs none of the machinery that
runs a unit shard by shard: with ``unit_recompute=False`` (the default) its module's own
forward runs once, in the caller's graph, on its real inputs and KV cache, and each of its
layers computes as a small layer of a block does (:class:`UnitMemberLinear`, the function of
[Note: block gathers]: it saves only its input, and backward takes the weights from the pass's
second gather and hands their gradients to the pass's counter-rotation). No recorded graph,
nested ``autograd.grad``, saved-tensor hooks or pytree per call: at 4 ranks units went from
0.94x to 0.96-0.98x FSDP2 where activations dominate (``benchmarks/bench_rsdp_fsdp2.py``,
docs/benchmarks.md). Dropout draws once, autograd replays nothing, a second backward
(``retain_graph=True``) gathers again like a block's, and the unit's other outputs (attention
weights) come back whole. With ``unit_recompute=True`` a unit keeps only its inputs and
recomputes in backward (:class:`_BlockUnitFn`).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn as nn

from .._layers.block_gather import SmallLayers, _WholeLinear, group_by_block, open_pass
from .._rotation.ring_order import Ring
from .unit_call import Call, replica_grads, replica_returns
from .unit_whole import call_whole, grads_whole, small_at

__all__ = ["UnitBlock", "make_unit_blocks", "member_forward"]


class _BlockUnitFn(torch.autograd.Function):
    """A unit's output (row-split bias excluded) from its whole parameters, which come in as
    inputs (outputs of the pass's gather): their gradients go back to the gather, which sums
    them over the group for every unit of the pass at once. For ``unit_recompute=True``:
    backward recomputes the forward on the pass's second gather."""

    @staticmethod
    def forward(ctx, unit, call: Call, p, *tensors):
        n_in = len(call.grad_idx)
        whole = dict(zip(unit._rsdp.names, tensors[n_in:]))
        ctx.p = p
        # units that keep their activations run in the pass directly (forward_direct)
        return call_whole(ctx, unit, call, tensors[:n_in], whole, whole, keep=False)

    @staticmethod
    def backward(ctx, dy):
        unit = ctx.unit
        n_in, n_w = len(ctx.in_meta), len(unit._rsdp.names)
        need_in = ctx.needs_input_grad[3:3 + n_in]
        need_w = any(ctx.needs_input_grad[3 + n_in:3 + n_in + n_w])
        extras = replica_grads(ctx, 3 + n_in + n_w)  # [Note: a unit's own replicas]
        whole = ctx.p.whole_for_backward(unit)
        gins, gws, gxs = grads_whole(ctx, dy, whole, whole, need_in, need_w, extras)
        del whole
        ctx.p.backward_done()
        return (None, None, None, *gins, *(gws or [None] * n_w),
                *replica_returns(ctx, 3 + n_in + n_w, gxs))


class UnitBlock:
    """The rotation units of one block, and the pass they are in."""

    def __init__(self, ring: Ring, units: List[nn.Module], small: SmallLayers):
        self.ring, self.units, self.small = ring, units, small
        self.current = None

    def _pass_for(self, unit):
        """The block's pass ``unit`` computes in (a new one when ``unit`` ran in the current
        one already, or a new forward began) and ``unit``'s whole parameters from it (None
        when the pass left it out: it gathers on its own). Only for a unit that computes
        whole (the group's tokens are agreed by then)."""
        p = self.current
        if p is None or unit in p.used or p.epoch != self.small.epoch:
            T = self.small.tokens or 0
            p = self.current = open_pass(
                self, [m for m in self.units if small_at(m._rsdp_unit, T)])
        p.used.add(unit)
        if unit not in p.whole:
            return p, None
        return p, p.whole.pop(unit)

    def forward(self, unit, call: Call, ins) -> Optional[torch.Tensor]:
        """``unit``'s output (row-split bias excluded) through the block's pass by its
        recorded call (``unit_recompute=True``), or None: it gathers on its own."""
        p, whole = self._pass_for(unit)
        if whole is None:
            return None
        y = _BlockUnitFn.apply(unit, call, p, *ins, *[whole[n] for n in unit._rsdp.names],
                               *call.extras)
        if y.requires_grad:  # its backward will ask for the weights again
            p.registered += 1
            p.waiting += 1
        return y

    def forward_direct(self, unit, args, kwargs):
        """[Note: units in their block's pass]
        ``unit``'s own forward output on ``args`` / ``kwargs`` (its real caches among them),
        its layers computing as small layers of the pass, or None: it gathers on its own."""
        p, whole = self._pass_for(unit)
        if whole is None:
            return None
        members = unit._rsdp_unit.members
        for _, m, _ in members:
            m._rsdp_pass = (p, unit, whole)
        try:
            return unit._rsdp_unit.base_forward(unit, *args, **kwargs)
        finally:
            for _, m, _ in members:
                m._rsdp_pass = None


class UnitMemberLinear(_WholeLinear):
    """A rotation unit's layer computing with its whole weight from the block's pass (the
    function of a small layer: it keeps only its input, backward gathers the weights again);
    its own name, so that a graph tells units from layers."""


def member_forward(mod, x: torch.Tensor) -> torch.Tensor:
    """Forward of ``mod``, a layer of a unit computing in its block's pass."""
    p, unit, whole = mod._rsdp_pass
    key = mod._rsdp_key
    w = whole[key + ".weight"]
    b = whole.get(key + ".bias")  # a column-split layer's (the row-split one's is whole)
    tr = mod._rsdp_transposed
    fin, fout = (w.shape[0], w.shape[1]) if tr else (w.shape[1], w.shape[0])
    y = UnitMemberLinear.apply(x.reshape(-1, fin).to(w.dtype), w, b, p, mod, unit,
                               key + ".weight")
    if y.requires_grad:  # its backward will ask for the weight (see Block.forward)
        p.registered += 1
        p.waiting += 1
    return y.view(*x.shape[:-1], fout)


def make_unit_blocks(model: nn.Module, sharded: Dict[str, nn.Module], ring: Ring,
                     small: SmallLayers) -> int:
    """Groups the rotation units of ``sharded`` by the container element holding them, gives
    each group of two or more a :class:`UnitBlock`; returns how many."""
    if ring.world < 3 or not ring.one_node:
        return 0  # two ranks: one hop a rotation, as for block gathers
    blocks = [UnitBlock(ring, units, small) for units in group_by_block(
        model, sharded, lambda m: getattr(m, "_rsdp_unit", None) is not None)]
    for block in blocks:
        for unit in block.units:
            unit._rsdp_unit.block = block
    return len(blocks)
