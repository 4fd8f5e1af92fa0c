"""Ring geometry of one process group, and the labelled shift helpers RSDP uses.

A rotation moves every rank's tensor one hop along the ring per step. To know *which* shard is
in hand after ``h`` hops we need the ring order, which the backend chooses (node-aware, so it
need not be rank order). :class:`Ring` learns it once, collectively, by rotating each
rank's own id around the ring with the same primitive the layers use, in both directions.

Contract: ``Ring(group)`` is collective (all ranks of ``group`` call it at the same point).
``ring.origin(direction, h)`` is the group rank whose tensor this rank holds after ``h`` hops
of ``ring_shift(direction=direction)``; ``origin(d, 0) == rank`` and ``origin(d, world) ==
rank``.

[Note: ring steps under torch.compile]
A sharded layer's forward (``sharded_linear_forward``, the embedding's, the attention's, a
rotation unit's) runs its ring schedule in Python around ``ring_shift`` works, which
TorchDynamo cannot trace (the process group is an opaque object to it). Those entry points are
``torch.compiler.disable``: the compiled model breaks its graph at each sharded layer and
compiles everything between them (norms, activations, attention arithmetic of the replicated
parts), as it does around any untraceable call.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..._compression import get_compression
from ..._ring import P2PRing, backend_of, ring_neighbours, ring_shift, ring_transport
from ..._topology import topology

__all__ = ["Ring", "Pending"]


class Pending:
    """An issued ring op; ``wait()`` blocks (inside a ``RSDP::...::wait`` profiler range while
    a profiler records)."""

    __slots__ = ("_work", "_label")

    def __init__(self, work, label: str):
        self._work = work
        self._label = label

    def wait(self) -> None:
        work = self._work
        if work is not None:
            self._work = None
            if _profiling():
                with record_function(self._label + "::wait"):
                    work.wait()
            else:
                work.wait()


#: Hops run as ring steps on the calling thread where the backend can (``BackendRSDP.ring_step``:
#: one node, CPU tensors; see [Note: ring steps on the caller's thread] in
#: csrc/backend/backend_ring.cpp); ``False`` sends every hop through the backend's worker queue
#: (``BackendRSDP.ring_shift``), for comparison.
RING_STEPS = True


def _profiling() -> bool:
    """Whether a profiler records now (then every ring op gets its labelled range; without one
    the range would cost more than issuing a small op)."""
    return torch._C._autograd._profiler_enabled()


def _id_device(group) -> torch.device:
    """Where the ring's rank ids travel: CPU where the group serves CPU tensors, else the
    current CUDA device (a group on NCCL alone)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        pg._get_backend(torch.device("cpu"))
        return torch.device("cpu")
    except RuntimeError:
        return torch.device("cuda", torch.cuda.current_device())


class Ring:
    """Ring order of ``group`` plus async, profiler-labelled shift / shift-reduce.

    Any backend (docs/architecture.md, Ring order): hops run as the rsdp backend's fused ring
    steps where the group serves the tensor's device with rsdp, as torch's batched
    point-to-point ops (:class:`torch_rsdp._ring.P2PRing`) elsewhere; the order, the schedules
    and the bits are the same."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._origins = {}
        self._backends = {}
        with record_function("RSDP::ring_order"):
            for d in (1, -1):
                seq = [self.rank]
                if self.world > 1:
                    t = torch.tensor([self.rank], dtype=torch.int64, device=_id_device(group))
                    for _ in range(self.world - 1):
                        ring_shift(t, out=t, group=group, direction=d)
                        seq.append(int(t.item()))
                if sorted(seq) != list(range(self.world)):
                    raise RuntimeError(f"torch_rsdp.rsdp: ring direction {d} does not visit every "
                                       f"rank once (origins {seq} on rank {self.rank})")
                self._origins[d] = seq
        #: ring ops issued through this ring so far (shifts and shift-reduces, the layers'
        #: native schedules included)
        self.hops = 0
        self._remote = {d: False for d in (1, -1)}
        #: every rank on one node: the layers' native schedules (csrc/rotation) can run
        self.one_node = True
        if self.world > 1:
            nodes = topology(group)["nodes"]
            node = {r: i for i, ranks in enumerate(nodes) for r in ranks}
            for d in (1, -1):
                self._remote[d] = node[ring_neighbours(group, d)[0]] != node[self.rank]
            self.one_node = len(nodes) == 1
        # origin(d, t) for t = 0 .. world, as lists (the native schedules take them)
        self.origin_lists = {d: [self.origin(d, t) for t in range(self.world + 1)]
                             for d in (1, -1)}

    def compresses_sums(self) -> bool:
        """Whether the group compresses ``ring_shift_reduce`` between nodes (the same on
        every rank)."""
        if self.world == 1 or backend_of(self.group) is None:
            return False  # only rsdp compresses (and refuses to be asked to elsewhere)
        return get_compression(self.group).get("ring_shift_reduce", "none") != "none"

    def quantises_sums(self, direction: int) -> bool:
        """Whether this rank's shift-reduce sends in ``direction`` leave its node quantised:
        then they need error feedback."""
        return self._remote[direction] and self.compresses_sums()

    def origin(self, direction: int, hops: int) -> int:
        """Group rank whose tensor this rank holds after ``hops`` hops in ``direction``."""
        return self._origins[direction][hops % self.world]

    def backend(self, t: torch.Tensor):
        """The BackendRSDP serving ``t``'s device (the native schedules' handle; only where
        :meth:`fused` says so)."""
        return self._backend(t)

    def fused(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s hops run as the rsdp backend's fused ring steps (then the layers'
        native schedules can run too); False on any other backend."""
        return not isinstance(self._backend(t), P2PRing)

    def _backend(self, t: torch.Tensor):
        """What shifts ``t``'s device: a BackendRSDP or a P2PRing (looked up once per device
        type)."""
        dev = t.device.type
        b = self._backends.get(dev)
        if b is None:
            b = self._backends[dev] = ring_transport(self.group, t.device)
        return b

    def shift(self, src: torch.Tensor, out: torch.Tensor, direction: int, label: str) -> Pending:
        """Async ``ring_shift(src) -> out`` (``out`` may be ``src``)."""
        if _profiling():
            with record_function(label):
                return Pending(self._issue(src, out, direction, None, None), label)
        return Pending(self._issue(src, out, direction, None, None), label)

    def shift_reduce(self, src: torch.Tensor, local: torch.Tensor, out: torch.Tensor,
                     direction: int, label: str,
                     residual: Optional[torch.Tensor] = None) -> Pending:
        """Async ``out = neighbour's src + local`` (``out`` may be ``src``; ``local`` must stay
        untouched until the op is waited on); ``residual``: error feedback of a quantised
        send (:func:`torch_rsdp.ring_shift_reduce`)."""
        if _profiling():
            with record_function(label):
                return Pending(self._issue(src, out, direction, local, residual), label)
        return Pending(self._issue(src, out, direction, local, residual), label)

    def _issue(self, src, out, direction, local, residual):
        self.hops += 1
        b = self._backend(src)
        if isinstance(b, P2PRing):
            return b.shift(src, out, direction, local)  # residual: its sends are exact
        if RING_STEPS and residual is None:
            return b.ring_step(src, out, direction, local)  # or the queued op's Work
        return b.ring_shift(src, out, direction, local, True, residual)
