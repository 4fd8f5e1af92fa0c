"""What a planned model sends between nodes quantised: per unit, or for the whole model.

Per unit, in the plan: ``"full_shard+int8"`` (weights int8 on the all-gathers, gradients
int8 on the reduce-scatters), ``"full_shard+int4"`` (gradients int4), likewise for
``shard_grad_op``, ``hybrid_shard``, ``no_shard``, ``shard_optim`` and ``rotate`` (its ring
hops between nodes). For the whole model: ``plan.apply(model, plan, compression="int8" |
"int4" | {...})`` gives every unit of those strategies without a suffix of its own that
setting.

Each distinct setting gets its own process group over the plan's ranks
(:meth:`._mesh.Meshes.group_for`) with the backend's compression set on it
(:func:`torch_rsdp.set_compression`), so a unit's collectives are compressed and no other
unit's, nor anything else the user sends on the plan's group, are. Inside a node everything
stays exact. Gradients keep **error feedback** (what quantising lost is added to the next
step's): FSDP units through :class:`torch_rsdp._compression.FeedbackReduceScatter`, the
replicated units' buckets through :class:`torch_rsdp._compression.FeedbackAllReduce`,
``rotate`` units' ring hops through ``RingFeedback`` (:mod:`torch_rsdp.rsdp._rotation.ring_feedback`). Not
compressed: ``split:k`` (the slices' own collectives); ``hybrid_shard``'s cross-node
all-reduce keeps no feedback (FSDP2 issues it itself, with no way to add a residual before
it).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

from ._spec import Strategy

__all__ = ["parse", "for_unit", "key", "WIRE_RATIO"]

GRADS = ("int8", "int4")

#: Bytes on the wire per float32 byte, with one float32 scale per 512 elements.
WIRE_RATIO = {"int8": (512 + 4) / 2048, "int4": (256 + 4) / 2048, "none": 1.0}


def parse(spec: Union[None, str, dict]) -> Optional[dict]:
    """``None``; ``"int8"`` / ``"int4"`` (the gradients' format; weights int8, error feedback
    on); or a dict with ``weights`` ("int8" or "none"), ``grads`` ("int8", "int4" or
    "none"), ``error_feedback`` (bool) and ``block``."""
    if spec is None:
        return None
    if isinstance(spec, str):
        spec = {"grads": spec}
    if not isinstance(spec, dict):
        raise TypeError(f"torch_rsdp.plan: compression must be None, 'int8', 'int4' or a "
                        f"dict, got {type(spec).__name__}")
    unknown = set(spec) - {"weights", "grads", "error_feedback", "block"}
    if unknown:
        raise ValueError(f"torch_rsdp.plan: compression has unknown keys {sorted(unknown)} "
                         f"(weights, grads, error_feedback, block)")
    out = {"weights": spec.get("weights", "int8"), "grads": spec.get("grads", "int8"),
           "error_feedback": bool(spec.get("error_feedback", True)),
           "block": int(spec.get("block", 512))}
    if out["weights"] not in ("int8", "none"):
        raise ValueError(f"torch_rsdp.plan: compression weights={out['weights']!r}: 'int8' or "
                         f"'none'")
    if out["grads"] not in GRADS + ("none",):
        raise ValueError(f"torch_rsdp.plan: compression grads={out['grads']!r}: 'int8', "
                         f"'int4' or 'none'")
    if out["grads"] == "none":
        out["error_feedback"] = False
    return out


def for_unit(strategy: "Strategy", default: Optional[dict]) -> Optional[dict]:
    """A unit's setting: its strategy's ``+`` suffix (with the whole model's block and
    feedback choice, if one was given), else the whole model's ``default`` where the
    strategy can compress, else None."""
    if strategy.compress:
        c = parse(strategy.compress)
        if default is not None:
            c.update(block=default["block"], error_feedback=default["error_feedback"])
        return c
    return default if strategy.handler.compressible else None


def key(c: dict) -> Tuple:
    """What tells two settings apart (one process group per distinct key)."""
    return (c["weights"], c["grads"], c["block"])
