"""Small layers of one block gathered together: one rotation for a block instead of one a layer.

[Note: block gathers]
A layer no larger than its activations is computed whole anyway ([Note: whole small layers] in
:mod:`.sharded_linear`), yet shard by shard it still costs ``W - 1`` ring hops in forward and
twice that in backward, each a point where the rank waits for its neighbour's turn on a core.
In a transformer block made of such layers (q, k, v, o, gate, up, down of a small model with a
long batch) those waits, not the arithmetic, set the step time when ranks share cores (63 hops
a block at 4 ranks against FSDP2's 3 collectives).

So the sharded Linears (and ``Conv1D``) of one *block* (an element of an ``nn.ModuleList`` or
``nn.Sequential``: the decoder layers of every transformers model) that are small take part in
one *pass*:

* forward: the first of them to run rotates the concatenation of all their shards once
  (``W - 1`` hops) and assembles each layer's whole weight (:class:`_Gather`); each layer then
  computes with its whole weight and drops it (:class:`_WholeLinear` keeps only its input);
* backward: the first of them to need its weight again rotates the block's shards once more,
  and the layers drop them when the last is done; the weight gradients autograd hands to
  :class:`_Gather` ride home in one counter-rotation (``W - 1`` hops), already summed, and
  autograd accumulates each rank's piece into its shard as it would any gradient (hooks,
  clipping, accumulation and the trainers see nothing new).

That is ``3 (W - 1)`` hops a block. Whole weights live only while their block computes (at
most the block's small layers at once, as FSDP2 gathers a block); a layer larger than its
activations never takes part, so the large layers RSDP exists for are never whole.

From 3 ranks on only, where it pays: there a block's ``3 (W - 1)`` hops replace many more
hops of its small layers one by one, which cost most where ranks share cores and activations
dominate; at 2 ranks, where each rank has a core and a hop is cheap, shard by shard (1 hop a
layer forward, 2 backward) stays ahead. The RSDP-against-FSDP2 benchmark's ``rsdp`` and
``rsdp-perlayer`` variants compare the two in the same runs. Not done, because neither paid:
the next block's gather riding along the current block's layers (a hop posted before each
layer computes, waited after), which was slower than gathering each block when it comes; the
gathers and reductions as one all-gather and one reduce-scatter of the group, no faster than
the ring.

Whether a layer is small depends on the tokens it sees, which may differ between ranks, while
which layers take part decides how much the ring carries and must be the same everywhere. So
the first pass after each forward of the sharded root agrees on the smallest token count over
the group (one all-reduce a step, :class:`SmallLayers`); every rank then decides from that
number and the layers' shapes alone.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .block_copies import copies_of, whole_shape
from .._rotation.memory import alloc_buffer, release_buffers
from .._rotation.rotation import counter_rotate, rotate
from .._rotation.ring_order import Ring

__all__ = ["SmallLayers", "Block", "make_blocks"]

#: ``False`` turns block gathers off (every layer rotates on its own), for comparison.
ENABLED = True


def is_small(fin: int, fout: int, tokens: int) -> bool:
    """A layer no larger than its input and output activations."""
    return fin * fout <= tokens * (fin + fout)


class SmallLayers:
    """The group's agreement, once per forward of the sharded root, on the fewest tokens any
    rank feeds its layers (which layers are small is decided from it); and the last whole
    gather, kept for its backward.

    [Note: the last gather stays for backward]
    Backward starts with the block forward ended with, so gathering that block again right
    away is wasted hops. Every gather (a block's pass, a unit computed whole) is kept until
    the next gather starts (which drops it first: still one block whole at a time) or the
    root's next forward; a backward that finds its forward's gather still kept uses it. That
    is the last block of a forward (and, under activation checkpointing, every recomputed
    one). Every rank makes the same gathers in the same order, so every rank gathers again
    or not alike. Only a gather whose outputs require grad is kept (a backward will come)."""

    def __init__(self, ring: Ring):
        self.ring = ring
        self.tokens: Optional[int] = None
        self.epoch = 0  # forwards of the root so far: a new one starts new passes
        self.kept = None  # what holds the last gather: has ``drop_kept()``

    def new_forward(self, module, args) -> None:  # a forward pre-hook of the root
        self.tokens = None
        self.epoch += 1
        self.drop()

    def keep(self, holder) -> None:
        self.drop()
        self.kept = holder

    def drop(self) -> None:
        """Before a gather: the kept one goes (if its backward has not taken it)."""
        if self.kept is not None:
            self.kept.drop_kept()
            self.kept = None

    def agreed(self, tokens: int) -> int:
        if self.tokens is None:  # the first pass of this forward: the same call on every rank
            t = torch.tensor([tokens], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.ring.group)
            self.tokens = int(t.item())
        return self.tokens


class _Pass:
    """One forward of a block's small layers (and its backward): who takes part, their whole
    weights while the block computes, and the block's concatenated shard layout."""

    def __init__(self, block: "Block", mods: List[nn.Module], epoch: int):
        self.block, self.mods, self.epoch = block, mods, epoch
        self.used: set = set()  # members whose forward has run in this pass
        self.whole: Dict[nn.Module, dict] = {}  # forward: member -> {name: whole parameter}
        self.offsets, off = {}, 0
        for m in mods:
            self.offsets[m] = off
            off += m._rsdp.layout.numel
        self.numel = off
        # [Note: block copies in one call]; a pass of nobody never gathers
        self.copies = copies_of(block, mods, self.offsets, off, block.ring.world) if mods else None
        self.backward_whole: Optional[Dict[nn.Module, dict]] = None
        self.kept: Optional[Dict[nn.Module, dict]] = None  # the forward's gather, detached
        self.waiting = 0  # members whose backward has not run yet
        self.registered = 0  # members whose backward will run

    def gather(self) -> Dict[nn.Module, dict]:
        """Every member's whole parameters, by one rotation of the block's shards."""
        ring = self.block.ring
        flats = [m._rsdp.compute_flat() for m in self.mods]
        src = alloc_buffer(self.numel, flats[0].dtype, flats[0].device)
        # the members' regions tile the pass's buffer, in member order
        torch._foreach_copy_(list(src.split_with_sizes([f.numel() for f in flats])), flats)
        for m, f in zip(self.mods, flats):
            m._rsdp.release(f)
        whole = {m: {n: _empty(m, n, src) for n in m._rsdp.names} for m in self.mods}
        copies = self.copies  # [Note: block copies in one call]
        targets = copies.targets([whole[m][n] for m, n in copies.entries])

        def visit(j, buf):
            copies.to_whole(j, buf, targets)

        rotate(ring, src, visit, direction=1, label="RSDP::block_gather")
        release_buffers(src)
        return whole

    def drop_kept(self) -> None:
        self.kept = None

    def whole_for_backward(self, mod) -> Dict[str, torch.Tensor]:
        """``mod``'s whole parameters again, from the pass's second gather."""
        if self.backward_whole is None:
            # [Note: the last gather stays for backward]
            self.backward_whole = self.kept if self.kept is not None else self.gather()
            self.kept = None
        return self.backward_whole[mod]

    def backward_done(self) -> None:
        self.waiting -= 1
        if self.waiting <= 0:  # the block's last layer: its whole weights go
            self.backward_whole = None
            self.waiting = self.registered  # a second backward (retain_graph) gathers again


def _empty(mod, name, like):
    """A whole parameter ``name`` of ``mod`` to assemble, tracked like every RSDP buffer."""
    shape = whole_shape(mod._rsdp, name)
    return alloc_buffer(math.prod(shape), like.dtype, like.device).view(shape)


class _Gather(torch.autograd.Function):
    """Forward: the members' whole parameters (flattened, in member then name order) from
    their shards. Backward: the whole parameters' gradients, summed over the group in one
    counter-rotation, as each rank's shard gradients (averaged, like every RSDP gradient)."""

    @staticmethod
    def forward(ctx, p: _Pass, *params):
        ctx.p = p
        whole = p.gather()
        return tuple(t for m in p.mods for t in whole[m].values())

    @staticmethod
    def backward(ctx, *grads):
        p: _Pass = ctx.p
        ring = p.block.ring
        per: Dict[nn.Module, dict] = {}
        k = 0
        for m in p.mods:
            per[m] = {}
            for n in m._rsdp.names:
                per[m][n] = grads[k]
                k += 1
        st0 = p.mods[0]._rsdp
        gdt = st0.grad_dtype

        copies = p.copies  # [Note: block copies in one call]
        # a run is a piece of the flattened gradient: a gradient laid out otherwise is copied
        targets = copies.targets([per[m][n].contiguous() if w is not None else per[m][n]
                                  for (m, n), w in zip(copies.entries, copies.whole_split)])

        def contribute(j, buf):
            copies.from_whole(j, buf, targets)

        # counter_rotate reads only the size, dtype and device of ``src`` when it only sums
        shape_of = torch.empty(1, dtype=gdt, device=grads[0].device).expand(p.numel)
        acc = counter_rotate(ring, shape_of, contribute=contribute, grad_dtype=gdt,
                             label="RSDP::block_reduce")
        out = []
        for m in p.mods:
            st = m._rsdp
            gs = st.grads_from(acc[p.offsets[m]:p.offsets[m] + st.layout.numel])
            out.extend(gs[n] for n in st.names)
        out = [g if need else None for g, need in zip(out, ctx.needs_input_grad[1:])]
        return (None, *out)


class _WholeLinear(torch.autograd.Function):
    """``y = x W^T + b`` (``x W + b`` for ``Conv1D``) with a member's whole weight from its
    pass, keeping only ``x``: backward gets the weight from the pass's second gather (the
    pass member ``owner``'s parameter ``wkey``: ``mod``'s ``weight`` unless ``mod`` is a
    layer of a rotation unit, [Note: units in their block's pass] in :mod:`.._units.unit_block`)."""

    @staticmethod
    def forward(ctx, x2, w, b, p: _Pass, mod, owner=None, wkey="weight"):
        tr = mod._rsdp_transposed
        w_io = w if tr else w.t()
        y = torch.addmm(b, x2, w_io) if b is not None else torch.mm(x2, w_io)
        ctx.p, ctx.mod, ctx.owner, ctx.wkey = p, mod, owner or mod, wkey
        ctx.save_for_backward(x2)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        p: _Pass = ctx.p
        mod = ctx.mod
        tr = mod._rsdp_transposed
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            w = p.whole_for_backward(ctx.owner)[ctx.wkey]
            gx = dy.mm(w.t() if tr else w)
        if ctx.needs_input_grad[1]:
            gw = x2.t().mm(dy) if tr else dy.t().mm(x2)
        if ctx.needs_input_grad[2]:
            gb = dy.sum(0)
        p.backward_done()
        return gx, gw, gb, None, None, None, None


class Block:
    """The sharded linear layers of one block, and the pass they are in."""

    def __init__(self, ring: Ring, members: List[nn.Module], small: SmallLayers):
        self.ring, self.members, self.small = ring, members, small
        self.current: Optional[_Pass] = None

    def forward(self, mod, x: torch.Tensor) -> Optional[torch.Tensor]:
        """``mod``'s output through the block's pass, or None: ``mod`` rotates on its own."""
        fin, fout = mod._rsdp_in, mod._rsdp_out
        if not ENABLED or x.shape[-1] != fin or x.device.type != "cpu":
            return None
        p = self.current
        if p is None or mod in p.used or p.epoch != self.small.epoch:
            p = self.current = self._new_pass(x.numel() // fin)
        p.used.add(mod)
        if mod not in p.whole:
            return None
        whole = p.whole.pop(mod)
        w, b = whole["weight"], whole.get("bias")
        st = mod._rsdp
        x2 = x.reshape(-1, fin).to(w.dtype)
        y = _WholeLinear.apply(x2, w, b, p, mod)
        if y.requires_grad:  # its backward will ask for the weight (Function.forward runs
            p.registered += 1  # without grad mode, so it cannot tell)
            p.waiting += 1
        y = y.view(*x.shape[:-1], fout).to(st.mp.output_dtype or y.dtype)
        if mod._rsdp_split == "in" and mod.bias is not None:
            y = y + mod.bias.to(y.dtype)
        return y

    def _new_pass(self, tokens: int) -> _Pass:
        """A pass of the members small at the group's token count (the same on every rank)."""
        T = self.small.agreed(tokens)
        return open_pass(self, [m for m in self.members if is_small(m._rsdp_in, m._rsdp_out, T)])


def open_pass(owner, mods: List[nn.Module]) -> _Pass:
    """A new pass of ``owner`` (a :class:`Block` or a block of units: ``ring``, ``small``) over
    ``mods``, their whole parameters gathered into ``whole``; a pass of nobody when fewer than
    two or of mixed dtypes (one member gains nothing; mixed dtypes need the per-layer
    schedules)."""
    dtypes = {d for m in mods
              for d in (m._rsdp.mp.param_dtype or m._rsdp.flat.dtype, m._rsdp.grad_dtype)}
    if len(mods) < 2 or len(dtypes) != 1:
        mods = []
    p = _Pass(owner, mods, owner.small.epoch)
    if mods:
        params = [m._rsdp.param(n) for m in mods for n in m._rsdp.names]
        owner.small.drop()
        whole = _Gather.apply(p, *params)
        k = 0
        kept = {}
        for m in mods:
            names = m._rsdp.names
            p.whole[m] = dict(zip(names, whole[k:k + len(names)]))
            k += len(names)
            # detached: the pass must not hold its own autograd node's outputs (a cycle
            # through C++ nodes that Python's collector cannot break)
            kept[m] = {n: t.detach() for n, t in p.whole[m].items()}
        if whole[0].requires_grad:  # [Note: the last gather stays for backward]
            p.kept = kept
            owner.small.keep(p)
    return p


def group_by_block(model: nn.Module, sharded: Dict[str, nn.Module], take) -> List[list]:
    """The modules of ``sharded`` (qualified name -> module) for which ``take(module)``, grouped
    by the ``nn.ModuleList`` / ``nn.Sequential`` element holding them; groups of two or more."""
    lists = containers(model)
    groups: Dict[str, list] = {}
    for name, mod in sharded.items():
        key = block_key(name, lists) if take(mod) else None
        if key is not None:
            groups.setdefault(key, []).append(mod)
    return [mods for mods in groups.values() if len(mods) >= 2]


def block_key(name: str, lists: set) -> Optional[str]:
    """The nearest element of a container (a name in ``lists``) holding module ``name``."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i - 1]) in lists:
            return ".".join(parts[:i])
    return None


def containers(model: nn.Module) -> set:
    """The names of ``model``'s ``nn.ModuleList`` and ``nn.Sequential`` modules."""
    return {n for n, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential))}


def make_blocks(model: nn.Module, sharded: Dict[str, nn.Module], ring: Ring,
                small: SmallLayers) -> int:
    """Groups the sharded linear layers of ``sharded`` (qualified name -> module) by the
    ``nn.ModuleList`` / ``nn.Sequential`` element holding them and gives each group of two or
    more a :class:`Block` deciding from ``small`` (whose ``new_forward`` the caller hooks to
    ``model``'s forward); returns how many blocks."""
    if ring.world < 3 or not ring.one_node:
        return 0  # two ranks: see [Note: block gathers]
    # linear layers only, and not a head on its embedding's shard
    groups = group_by_block(model, sharded, lambda m: getattr(m, "_rsdp_transposed", None)
                            is not None and m._rsdp.module_ref is m)
    blocks = [Block(ring, mods, small) for mods in groups]
    for block in blocks:
        for m in block.members:
            m._rsdp_block = block
    return len(blocks)
