"""``plan.apply(model, plan, compression=...)``: what a planned model sends between nodes.

Weights travel as int8 on the all-gathers (each rank's own shard stays full precision);
gradients as int8 or int4 on the reduce-scatters and all-reduces, with error feedback on the
FSDP units' reduce-scatters (:class:`torch_rsdp.compression.FeedbackReduceScatter`). It is the
backend's compression (:func:`torch_rsdp.set_compression`) set on the plan's groups: the flat
group of the plan, and for ``hybrid_shard`` the rail groups that all-reduce across nodes.
Inside a node everything stays exact, and so does ``rotate``'s ring (point-to-point).
"""
from __future__ import annotations

from typing import Optional, Union

import torch.distributed as dist

__all__ = ["parse", "install"]

GRADS = ("int8", "int4")


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


def install(c: dict, group: Optional[dist.ProcessGroup], meshes) -> None:
    """Sets the backend's compression on the groups whose traffic crosses nodes."""
    from ..compression import set_compression
    from ..ring import rsdp_backend
    try:
        rsdp_backend(group)
    except TypeError as e:
        raise ValueError(f"torch_rsdp.plan: compression needs a group on the rsdp backend "
                         f"({e})") from None
    set_compression(group, all_gather=c["weights"], reduce_scatter=c["grads"],
                    all_reduce=c["grads"], block=c["block"])
    hybrid = getattr(meshes, "_hybrid", None)
    if hybrid is not None and hybrid is not getattr(meshes, "_flat", None):
        # HSDP all-reduces each shard's gradients across nodes on its rail group
        set_compression(hybrid.get_group("replicate"), reduce_scatter=c["grads"],
                        all_reduce=c["grads"], block=c["block"])
