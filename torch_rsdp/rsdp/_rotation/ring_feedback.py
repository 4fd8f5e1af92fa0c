"""Error feedback of one RSDP layer's gradient hops between nodes.

When the group compresses ``ring_shift_reduce`` (:func:`torch_rsdp.set_compression`), the
gradient accumulators of :mod:`.rotation` leave a node block-quantised. Only the rank at a
node boundary quantises, and at hop ``h`` of a backward schedule it always sends the partial
sum of the same shard (the ring order is fixed), so one residual per hop is all it needs: what
quantising hop ``h`` lost is added to hop ``h``'s next send, and nothing is lost for good, only
delayed. The other ranks hold nothing.

Memory: on a boundary rank, as many shard-sized float32 rows as its schedule has hops (``W-1``
or ``W``): about one layer's float32 gradient, on one rank per node.
"""
from __future__ import annotations

from typing import Optional

import torch

from .ring_order import Ring

__all__ = ["RingFeedback"]


class RingFeedback:
    """``residual``: float32 ``(hops, shard numel)``, row ``h`` for hop ``h``; None until the
    first quantised send (and on ranks that never quantise). Checkpointed by
    :func:`torch_rsdp.plan.feedback_state_dict`."""

    __slots__ = ("residual",)

    def __init__(self) -> None:
        self.residual: Optional[torch.Tensor] = None

    def row(self, ring: Ring, direction: int, hop: int, hops: int,
            like: torch.Tensor) -> Optional[torch.Tensor]:
        """Hop ``hop``'s residual (of ``hops``), or None where this rank's sends stay exact."""
        if not ring.quantises_sums(direction):
            return None
        r = self.residual
        if r is None or tuple(r.shape) != (hops, like.numel()):
            r = self.residual = torch.zeros(hops, like.numel(), dtype=torch.float32)
        return r[hop]
