"""Gradient accumulation across every strategy: ``with plan.no_sync(model): ...``.

Inside the context, backward passes accumulate gradients locally and no strategy synchronises
them: the replicated parameters' all-reduce is skipped, FSDP2 units keep unsharded gradients
(``set_requires_gradient_sync(False)``), ``split:k`` layers keep unsharded slice gradients,
and RSDP units skip the all-reduce of the parameters they leave replicated. The first backward
outside the context synchronises everything accumulated, so ``k`` micro-batches under
``no_sync`` followed by one outside equal one step on the concatenated batch.

RSDP's own sharded gradients are the exception: they travel around the ring with the weights
that the backward must rotate anyway, into their owner's shard, so accumulating them costs no
extra communication and no unsharded gradient buffer.
"""
from __future__ import annotations

import contextlib

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from .apply import plan_state

__all__ = ["no_sync", "set_gradient_sync"]


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Turns gradient synchronisation of every strategy in ``model`` on or off."""
    st = plan_state(model)
    if st.grad_sync is not None:
        st.grad_sync.enabled = enabled
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_requires_gradient_sync(enabled, recurse=False)
        split = getattr(mod, "_split", None)
        if split is not None:
            split.sync_grads = enabled
        root = getattr(mod, "_rsdp_root", None)
        if root is not None:
            root.replicated.enabled = enabled


@contextlib.contextmanager
def no_sync(model: nn.Module):
    """Backward passes inside accumulate gradients without communicating them."""
    set_gradient_sync(model, False)
    try:
        yield
    finally:
        set_gradient_sync(model, True)
