"""RSDP: Re-distributed Sharded Data Parallel (rotated tensor parallelism).

Weights stay sharded; each rank computes with the shard in hand while shards rotate around the
ring (:func:`torch_rsdp.ring_shift`), so no layer is ever materialised whole. In backward the
shards counter-rotate and each shard's gradient accumulates every rank's contribution on its
way home (:func:`torch_rsdp.ring_shift_reduce`).

    import torch_rsdp.rsdp as rsdp
    model = rsdp.shard(model)   # after init_process_group("rsdp"); or, to rotate each
                                # attention block / MLP as one buffer: shard(model, tp_plan="auto")
    print(rsdp.rsdp_state(model).report())   # what stayed whole, and why

Owns: the sharded modules (Linear, ``Conv1D``, Embedding, MultiheadAttention, rotation units),
the rotation schedules and the ring order (:class:`Ring`), and the public state API other
packages use (:class:`RSDPState`: sharded and replicated parameters, gradient sync on/off;
:class:`FullTensors` and :func:`local_shard_of` for state dicts; :func:`can_rotate`).
Mixed precision is FSDP2's ``torch.distributed.fsdp.MixedPrecisionPolicy``.

May import: torch, ``torch_rsdp.ring`` (the ring primitive), ``torch_rsdp.topology`` (the ring
order is node-aware) and ``torch_rsdp.compression`` (whether ring hops between nodes are
quantised, so gradients need error feedback), ``torch_rsdp._C`` (the backend and the layers'
native ring schedules, csrc/rsdp), and the neutral modules ``torch_rsdp._utils``,
``_dtensor_params``, ``_grad_sync`` and ``_checkpoint_hooks``; never ``torch_rsdp.plan``
(which builds on this package, through the names in ``__all__`` only).
"""
from .api import RSDPState, rsdp_state, shard
from .coverage import LeftWhole, can_rotate
from .flat_shard import chunk_sizes, chunk_starts
from .memory import MemoryTracker
from .state_dict import (FullTensors, full_state_dict, load_full_state_dict, local_shard_of,
                         shard_dim, sharded_owner)
from .ring_feedback import RingFeedback
from .ring_order import Ring
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
    "can_rotate",
    "FullTensors",
    "MemoryTracker",
    "Ring",
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
    "shard_dim",
    "sharded_owner",
    "RingFeedback",
    "chunk_sizes",
    "chunk_starts",
]
