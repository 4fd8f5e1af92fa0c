"""``dcp.async_save`` without a second copy of a planned model's state.

``async_save`` blocks training while its stager copies the state dict, so that training may
change the model while the copy is written. A planned model's and its optimizer's state dicts
already hold copies that training never writes to (:mod:`torch_rsdp._checkpoint_hooks`,
[Note: copies]); :class:`CopyOnceStager` takes those as they are and copies only the rest (a
0-dim optimizer ``step``, anything else the caller added)::

    ckpt_group = dist.new_group()  # once: DCP's background thread plans over collectives
    future = dcp.async_save(state, checkpoint_id=path, async_stager=plan.CopyOnceStager(),
                            process_group=ckpt_group)
    ...  # training goes on
    future.result()
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.utils._pytree import tree_map_only

from .._checkpoint_hooks import is_private_copy

__all__ = ["CopyOnceStager"]


class CopyOnceStager(AsyncStager):
    """An ``AsyncStager`` that copies what is not already a private copy; synchronous (the
    state dict it returns is safe from training once ``async_save`` returns)."""

    _synchronize_after_execute = False  # nothing runs after stage() returns

    def stage(self, state_dict):
        return tree_map_only(torch.Tensor,
                             lambda t: t if is_private_copy(t) else t.detach().clone(),
                             state_dict)

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass
