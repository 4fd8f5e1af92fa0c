"""RSDP: Re-distributed Sharded Data Parallel (rotated tensor parallelism).

Weights stay sharded; each rank computes with the shard in hand while shards rotate around the
ring (:func:`torch_rsdp.ring_shift`), so no layer is ever materialised whole. In backward the
shards counter-rotate and each shard's gradient accumulates every rank's contribution on its
way home (:func:`torch_rsdp.ring_shift_reduce`).

    import torch_rsdp.rsdp as rsdp
    model = rsdp.shard(model)   # after init_process_group("rsdp"); or, to rotate each
                                # attention block / MLP as one buffer: shard(model, tp_plan="auto")
    print(rsdp.rsdp_state(model).report())   # what stayed whole, and why
"""
from .api import RSDPState, rsdp_state, shard
from .coverage import LeftWhole
from .memory import MemoryTracker
from .state_dict import full_state_dict, load_full_state_dict, local_shard_of
from .ring_plan import RingPlan
from .shard_state import MixedPrecision
from .rotation_unit import shard_unit
from .sharded_conv1d import shard_conv1d
from .tp_plan import resolve_plan
from .sharded_attention import RSDPMultiheadAttention, shard_attention
from .sharded_embedding import RSDPEmbedding, shard_embedding
from .sharded_linear import RSDPLinear, shard_linear

__all__ = [
    "shard",
    "rsdp_state",
    "RSDPState",
    "LeftWhole",
    "MixedPrecision",
    "MemoryTracker",
    "RingPlan",
    "RSDPLinear",
    "RSDPEmbedding",
    "RSDPMultiheadAttention",
    "shard_attention",
    "shard_linear",
    "shard_conv1d",
    "shard_unit",
    "resolve_plan",
    "shard_embedding",
    "full_state_dict",
    "load_full_state_dict",
    "local_shard_of",
]
