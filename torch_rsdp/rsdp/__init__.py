"""RSDP: Re-distributed Sharded Data Parallel (rotated tensor parallelism).

Weights stay sharded; each rank computes with the shard in hand while shards rotate around the
ring (:func:`torch_rsdp.ring_shift`), so no layer is ever materialised whole. In backward the
shards counter-rotate and each shard's gradient accumulates every rank's contribution on its
way home (:func:`torch_rsdp.ring_shift_reduce`).

    import torch_rsdp.rsdp as rsdp
    model = rsdp.shard(model)   # after init_process_group("rsdp"); or, to rotate each
                                # attention block / MLP as one buffer: shard(model, tp_plan="auto")
    print(rsdp.rsdp_state(model).report())   # what stayed whole, and why

The public API is ``__all__``: :func:`shard`, the state it attaches (:func:`rsdp_state`,
:class:`RSDPState`, :class:`LeftWhole`), :func:`can_rotate` and :func:`load_pretrained`.
Whole-tensor state dicts are :func:`torch_rsdp.plan.full_state_dict` /
``load_full_state_dict``, which take a model ``shard`` made as they take a planned one (a
``rotate`` unit over the whole model). Mixed precision is FSDP2's
``torch.distributed.fsdp.MixedPrecisionPolicy``. Everything else is private and may change;
it lives by role, bottom to top (``tests/project/test_import_rules.py`` checks the floors):

* ``_rotation/``: the ring order (``Ring``), the rotation schedules, error feedback of
  quantised hops, the flat shard layout and the buffers it travels in;
* ``_layers/``: the sharded modules (Linear, ``Conv1D``, Embedding, MultiheadAttention) and
  block gathers of small layers, on the ring core;
* ``_units/``: rotation units (``tp_plan``: an attention block or an MLP rotating as one
  buffer), on the layers;
* ``_shard`` (:func:`shard` in named phases), ``_state`` (:class:`RSDPState`),
  ``_coverage`` (what stays whole, and why), ``_tied`` (embeddings and their tied heads),
  ``_state_dict``.

May import: torch, the backend's modules (``torch_rsdp._ring``, ``_topology``,
``_compression``: the ring order is node-aware and quantised hops need error feedback),
``torch_rsdp._C`` (the layers' native ring schedules, csrc/rotation), and the neutral modules
``torch_rsdp._utils``, ``_dtensor_params``, ``_grad_sync``, ``_checkpoint_hooks``,
``_materialize``; never
``torch_rsdp.plan`` (which builds on this package, through ``__all__`` only).
"""
from ._coverage import LeftWhole, can_rotate
from ._shard import shard
from ._state import RSDPState, rsdp_state
from ._pretrained import load_pretrained

__all__ = [
    "shard",
    "rsdp_state",
    "RSDPState",
    "LeftWhole",
    "can_rotate",
    "load_pretrained",
]
