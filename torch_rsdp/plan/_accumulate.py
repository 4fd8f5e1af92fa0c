"""Gradient accumulation across every strategy: ``with plan.no_sync(model): ...``.

Inside the context, backward passes accumulate gradients locally and no strategy synchronises
them: the replicated parameters' all-reduce is skipped, FSDP2 units keep unsharded gradients
(``set_requires_gradient_sync(False)``), ``split:k`` layers keep unsharded slice gradients,
and the parameters RSDP units leave whole skip the replicated parameters' all-reduce with
them. Each strategy's handler does its part
(:meth:`~._strategies.StrategyHandler.set_gradient_sync`). The first backward outside the
context synchronises everything accumulated, so ``k`` micro-batches under ``no_sync`` followed
by one outside equal one step on the concatenated batch.

RSDP's own sharded gradients are the exception: they travel around the ring with the weights
that the backward must rotate anyway, into their owner's shard, so accumulating them costs no
extra communication and no unsharded gradient buffer.
"""
from __future__ import annotations

import contextlib

import torch.nn as nn

from ._apply import plan_state

__all__ = ["no_sync", "set_gradient_sync"]


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Turns gradient synchronisation of every strategy in ``model`` on or off.

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply`.
        enabled: False: backward passes accumulate gradients locally; True: the next
            backward synchronises everything accumulated.
    """
    st = plan_state(model)
    if st.grad_sync is not None:  # every replicated parameter, whatever its unit
        st.grad_sync.enabled = enabled
    if st.fsdp_root is not None:
        st.fsdp_root.set_requires_gradient_sync(enabled, recurse=False)
    for unit in st.units.values():
        if unit.params:
            unit.strategy.handler.set_gradient_sync(unit, enabled)


@contextlib.contextmanager
def no_sync(model: nn.Module):
    """Backward passes inside accumulate gradients without communicating them.

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply`.
    """
    set_gradient_sync(model, False)
    try:
        yield
    finally:
        set_gradient_sync(model, True)
