"""Ring shifts over a process group on any backend: torch's batched point-to-point ops.

A group on the rsdp backend shifts with the backend's fused ring step (``_C.BackendRSDP``). A
group on gloo, NCCL or MPI gets ``dist.batch_isend_irecv([isend(next), irecv(prev)])``, the
pattern torch's ring attention (context parallel) runs on NCCL, with the rsdp backend's
semantics, so RSDP computes the same bits on every backend:

* the ring is node-aware and the same as rsdp's (:mod:`._derived_topology`);
* ``out`` may be the tensor itself (the send side is staged in a copy first) and may have
  another shape or layout than the tensor: elements travel in row-major order;
* the reduce adds the neighbour's tensor and ``local`` (float16/bfloat16 in float32, rounded
  once, as the backend's kernels do) after the receive, when the op is waited on;
* ``async_op`` returns a ``torch.distributed.Work`` whose ``wait()`` finishes the op and whose
  ``get_future()`` yields ``[out]``.

A wait that fails (a peer died, the group's timeout passed) raises naming this rank, the op,
its peers, the shape and the dtype. Quantised hops need the rsdp backend; so does the residual
of error feedback, which this path leaves as it is (its sends are exact).

[Note: buffers held by a p2p ring op]
NCCL's send and receive run on its own stream; the op keeps its staged send, the receive
buffer and ``local`` referenced until ``wait()`` has made the caller's stream wait for them,
so the caching allocator cannot hand them out again while NCCL still reads or writes them.
"""
from __future__ import annotations

import threading
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._derived_topology import derived_topology, ring_order

__all__ = ["P2PRing", "RingShiftWork"]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa = a.untyped_storage().data_ptr()
    return sa == b.untyped_storage().data_ptr()


def add_exact(recv: torch.Tensor, local: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``recv + local`` as the rsdp backend's reduce kernels compute it: half types in float32
    and rounded once, everything else in its own type."""
    if dtype in (torch.float16, torch.bfloat16):
        return (recv.float() + local.float()).to(dtype)
    return recv + local


class RingShiftWork(dist.Work):
    """One ring shift in flight on a non-rsdp group (torch's ``Work`` interface)."""

    def __init__(self, works: List[dist.Work], finish: Optional[Callable[[], None]],
                 out: torch.Tensor, what: Callable[[], str]):
        super().__init__()
        self._works = works
        self._finish = finish
        self._out = out
        self._what = what
        self._lock = threading.Lock()
        self._done = False
        self._error: Optional[BaseException] = None
        self._keep: tuple = ()
        self._waiter: Optional[threading.Thread] = None
        self._then: list = []  # callbacks of the helper thread: (error or None) -> None
        self._settled = False  # the helper thread has taken its callbacks
        # the helper's bookkeeping has a lock of its own: ``_lock`` is held through a wait
        self._bg_lock = threading.Lock()

    def wait(self, timeout=None) -> bool:
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._done:
                return True
            try:
                for w in self._works:
                    if not timeout:  # None or torch's timedelta(0): the group's own deadline
                        w.wait()
                    else:
                        w.wait(timeout)
                if self._finish is not None:
                    self._finish()
            except Exception as e:  # a dead peer, a timeout: say which op and where
                self._error = RuntimeError(f"{self._what()}: {e}")
                self._works, self._finish, self._keep = [], None, ()
                raise self._error from e
            self._works, self._finish, self._keep, self._done = [], None, (), True
            return True

    def is_completed(self) -> bool:
        """Non-blocking: once the sends and receives are done, finishes the op (the copy or
        the add into ``out``) so a caller that polls and never waits still gets ``out``."""
        if self._done or self._error is not None:
            return True
        if self._out.device.type == "cpu":
            # gloo's point-to-point Works only complete inside wait(): a helper thread waits
            self._in_background()
            return self._done or self._error is not None
        if all(w.is_completed() for w in self._works):
            try:
                self.wait()
            except RuntimeError:  # kept: the next wait() raises it, as torch's Work does
                pass
            return True
        return False

    def _in_background(self, then=None) -> None:
        """Waits on a helper thread (started once), then calls ``then(error or None)``."""
        with self._bg_lock:
            started = self._waiter is not None
            if not started:
                self._waiter = threading.Thread(target=self._wait_quietly,
                                                name="rsdp-ring-wait", daemon=True)
            late = then is not None and self._settled  # the thread has run its callbacks
            if then is not None and not late:
                self._then.append(then)
        if late:
            then(self._error)
        if not started:
            self._waiter.start()

    def _wait_quietly(self) -> None:
        try:
            self.wait()
        except RuntimeError:
            pass
        with self._bg_lock:
            thens, self._then, self._settled = self._then, [], True
        for then in thens:
            then(self._error)

    def is_success(self) -> bool:
        return self._done and self._error is None

    def result(self) -> List[torch.Tensor]:
        return [self._out]

    def get_future(self) -> torch.futures.Future:
        """A future of ``[out]``. On CUDA the op is finished on the caller's stream at once
        (waiting there costs the host nothing) and the future carries that stream's event;
        on CPU a helper thread waits, so the caller's thread is free until it asks."""
        if self._out.device.type != "cpu":
            fut = torch.futures.Future(devices=[self._out.device])
            self.wait()
            fut.set_result([self._out])
            return fut
        fut = torch.futures.Future()

        def settle(error):
            if error is None:
                fut.set_result([self._out])
            else:  # the future carries it to whoever waits
                fut.set_exception(error)

        if self._done or self._error is not None:
            settle(self._error)
        else:
            self._in_background(settle)
        return fut


class P2PRing:
    """The ring of one group on a backend without a fused ring step."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None,
                 order: Optional[List[int]] = None):
        self.group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.order = order if order is not None else ring_order(derived_topology(self.group))
        self._globals = [dist.get_global_rank(self.group, r) for r in range(self.world)]
        self.backend_name = dist.get_backend(self.group)

    def ring_neighbours(self, direction: int = 1) -> Tuple[int, int]:
        """(group rank this rank sends to, group rank it receives from)."""
        n = len(self.order)
        pos = self.order.index(self.rank)
        step = 1 if direction >= 0 else n - 1
        return self.order[(pos + step) % n], self.order[(pos + n - step) % n]

    def shift(self, tensor: torch.Tensor, out: torch.Tensor, direction: int,
              local: Optional[torch.Tensor] = None) -> RingShiftWork:
        """Issues ``out = neighbour's tensor (+ local)``; returns its Work. Arguments are
        checked by the caller (:func:`torch_rsdp._ring.check_shift`)."""
        to, frm = self.ring_neighbours(direction)
        dtype = tensor.dtype
        op = "ring_shift_reduce" if local is not None else "ring_shift"

        def what() -> str:
            return (f"rank {dist.get_rank()}: {op} (direction {direction:+d}, "
                    f"{tuple(tensor.shape)} {dtype}) over {self.backend_name}, sending to group "
                    f"rank {to} and receiving from group rank {frm}")

        if self.world == 1 or tensor.numel() == 0:
            src = tensor.reshape(-1)
            return self._finished(out, src if local is None else
                                  add_exact(src, local.reshape(-1), dtype), what)
        send = tensor.contiguous()
        # Received straight into ``out`` where nothing is added and the layout allows; else
        # into a buffer that ``finish`` copies (or adds) into ``out`` once the send is done.
        direct = local is None and out.is_contiguous()
        if direct and send.data_ptr() == tensor.data_ptr() and _overlaps(send, out):
            send = send.clone()  # in place: the receive must not overwrite what is sent
        recv = out if direct else torch.empty(tensor.numel(), dtype=dtype, device=tensor.device)
        ops = [dist.P2POp(dist.isend, send, self._globals[to], self.group),
               dist.P2POp(dist.irecv, recv, self._globals[frm], self.group)]
        works = dist.batch_isend_irecv(ops)

        def finish() -> None:
            if direct:
                return
            got = recv if local is None else add_exact(recv, local.reshape(-1), dtype)
            out.copy_(got.view(out.shape) if out.is_contiguous() else got.reshape(out.shape))

        work = RingShiftWork(works, finish, out, what)
        work._keep = (send, recv, local)  # [Note: buffers held by a p2p ring op]
        return work

    @staticmethod
    def _finished(out: torch.Tensor, value: torch.Tensor, what) -> RingShiftWork:
        out.copy_(value.reshape(out.shape))
        work = RingShiftWork([], None, out, what)
        work.wait()
        return work
