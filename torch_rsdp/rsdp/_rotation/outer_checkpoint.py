"""Activation checkpointing around sharded modules without a second rotation.

[Note: checkpointing without a second rotation]
torch's non-reentrant ``checkpoint`` (which Hugging Face's ``gradient_checkpointing_enable()``
and ``checkpoint_wrapper`` use) keeps none of a region's activations and, when backward first
needs one, runs the region's forward again. Every sharded module in the region would rotate
all of its shards a second time just to produce the output the first forward had already
computed, where FSDP2 recomputes with the layer its backward gathers anyway. So a rotation
unit or a sharded Linear / Conv1D (the modules a transformer block's checkpoint holds; a
sharded embedding or ``nn.MultiheadAttention`` inside one still rotates again) computing
under a checkpoint keeps its *output* (one ``tokens x features`` tensor per
call: a rotation unit's is the size of the block's input) beside the checkpoint's kept inputs,
and when the same call runs again in the recompute it returns that output instead of
rotating; its own backward then rotates the shards once, as without checkpointing (a
recomputing unit recomputes each shard's part while it is in hand). The module's function
still saves exactly what it saves otherwise, in the same order: the checkpoint matches saved
tensors by their position.

Which kept output belongs to which recomputed call is decided by the inputs, not by order: a
kept output is taken only by a call whose every input has the same shape, dtype and the same
two float64 sums (plain and position-weighted) as the call that made it, and only if nothing
wrote into it since (its version counter); anything else rotates again, which is always
right. The recompute replays the same operations on the same values (the checkpoint restores
the random state), so the sums agree bit for bit; and inputs equal in every value give the
same output anyway. A kept output lives as long as the first forward's autograd node (it is
held there) and is dropped when that node's backward runs (a call with no node: see
:func:`keep_output`).

Only torch's ``checkpoint`` turns this on (its saved-tensor hooks are the innermost ones when
the module runs); other saved-tensor hooks (``save_on_cpu``) never recompute.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["under_checkpoint", "recomputing", "take_output", "keep_output", "drop_output"]

_CHECKPOINT_MODULE = "torch.utils.checkpoint"


def under_checkpoint() -> bool:
    """Whether the caller runs inside torch's ``checkpoint``: its first forward, or the
    recompute backward asks for."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return hooks is not None and getattr(hooks[0], "__module__", None) == _CHECKPOINT_MODULE


def recomputing() -> bool:
    """Whether the caller runs in a checkpoint's recompute (inside a backward)."""
    return under_checkpoint() and torch._C._current_graph_task_id() != -1


_WEIGHTS: Dict[Tuple[int, torch.device], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random weights in [1, 2) for ``n`` elements (one vector per size and
    device), so that the weighted sum tells permuted inputs apart."""
    w = _WEIGHTS.get((n, device))
    if w is None:
        g = torch.Generator().manual_seed(n)
        w = _WEIGHTS[(n, device)] = (1 + torch.rand(n, generator=g, dtype=torch.float64)).to(
            device)
    return w


def _fingerprint(tensors: Sequence[torch.Tensor]) -> tuple:
    out = []
    with torch.no_grad():
        for t in tensors:
            f = t.detach().reshape(-1).to(torch.float64)
            out.append((tuple(t.shape), t.dtype, f.sum().item(),
                        torch.dot(f, _weights(f.numel(), f.device)).item() if f.numel() else 0))
    return tuple(out)


class _Kept:
    def __init__(self, key: tuple, y: torch.Tensor, strong: bool):
        self.key, self.y, self.version, self.strong = key, y, y._version, strong

    def __call__(self):  # a strong reference reads like a weak one
        return self


def keep_output(ctx, owner, inputs: Sequence[torch.Tensor], y: torch.Tensor,
                has_node: bool) -> None:
    """In a checkpointed first forward: keeps ``y``, the output of ``owner`` (a sharded
    module) for ``inputs``, for the recompute to take. ``has_node``: some input needs a
    gradient, so autograd keeps ``ctx`` (the function's node) until backward, and the output
    lives there. A call without one (a frozen layer whose input carries no gradient, as the
    first block's projections under LoRA) has no node: its output is held by ``owner``
    itself, until the recompute takes it or the next such call replaces it."""
    if recomputing() or not under_checkpoint():
        return
    kept = _Kept(_fingerprint(inputs), y.detach(), strong=not has_node)
    refs: List = [r for r in owner.__dict__.get("_rsdp_kept", [])
                  if r() is not None and not (kept.strong and r().strong)]
    if has_node:
        ctx.rsdp_kept = kept
        refs.append(weakref.ref(kept))
    else:
        refs.append(kept)
    owner.__dict__["_rsdp_kept"] = refs


def take_output(owner, inputs: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """In a checkpoint's recompute: the output ``owner``'s first forward computed for these
    same inputs, or None (compute it)."""
    refs = owner.__dict__.get("_rsdp_kept")
    if not refs or not recomputing():
        return None
    key = _fingerprint(inputs)
    kept = next((k for k in (r() for r in refs)
                 if k is not None and k.y is not None and k.key == key), None)
    if kept is None:
        return None
    y, kept.y = kept.y, None
    owner.__dict__["_rsdp_kept"] = [r for r in refs if r() is not None and r() is not kept]
    return y if y._version == kept.version else None


def drop_output(ctx) -> None:
    """In the first forward's backward: its kept output is no longer needed."""
    kept = getattr(ctx, "rsdp_kept", None)
    if kept is not None:
        kept.y = None
        ctx.rsdp_kept = None
