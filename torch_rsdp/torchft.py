"""torchft's reconfigurable process group over the rsdp backend.

torchft (https://github.com/pytorch/torchft) trains through failures: replica groups agree on a
quorum through a lighthouse and their cross-replica process group is rebuilt for every quorum
(``configure`` with a fresh store prefix, rank and world size), aborted when an op fails, and
rebuilt without the lost replica. On CPU torchft ships ``ProcessGroupGloo`` for that role, and
gloo refuses reduce-scatter. ``ProcessGroupRSDP`` is the same wrapper built on a fresh rsdp
backend per configuration, so every collective torchft issues works, reduce-scatter included:

    from torch_rsdp.torchft import ProcessGroupRSDP
    manager = torchft.Manager(pg=ProcessGroupRSDP(timeout=timedelta(seconds=10)), ...)

``DistributedDataParallel`` is torchft's DDP wrapper with a comm hook that survives a failed
all-reduce: torchft 0.2.0's hook asserts when a peer dies during the all-reduce (with its gloo
group too), which crashes every surviving replica instead of skipping the step.

torchft is optional: ``import torch_rsdp`` never needs it; importing this module without it
raises ImportError saying how to install it.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch

try:
    from torchft.ddp import DistributedDataParallel as _FTDistributedDataParallel
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # tests/integrations/test_torchft.py::test_torchft_is_optional
    raise ImportError(
        "torch_rsdp.torchft needs torchft: pip install torchft (torchft==0.2.0 is tested)"
    ) from e

from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store

from . import _C

__all__ = ["ProcessGroupRSDP", "DistributedDataParallel"]

_BACKEND_TYPE = BaseProcessGroup.BackendType.CUSTOM


class ProcessGroupRSDP(ProcessGroupWrapper):
    """A reconfigurable process group on the rsdp backend, for torchft's ``Manager`` (or any
    user of torchft's ``ProcessGroup`` API: ``configure``, ``abort``, ``errored``,
    ``shutdown``).

    Every ``configure(store_addr, replica_id, rank, world_size, ...)`` aborts the previous
    backend (its pending ops fail at once) and builds a new one on the store at
    ``store_addr``, which must carry a prefix not used before (torchft's quorum does that).
    ``timeout`` bounds the set-up and every op of the group (``set_timeout`` changes it for the
    live group too). ``errored()`` returns the failure that broke the group, or ``None``.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout)
        self._errored: Optional[Exception] = None
        self._backend = None

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        self._errored = None
        ranks = list(self._global_ranks or range(world_size))
        if len(ranks) != world_size:
            raise ValueError(
                f"ProcessGroupRSDP.configure: rank {rank}: {len(ranks)} global_ranks "
                f"for world_size {world_size}"
            )
        name = f"torchft_quorum_{self._quorum_id}_replica_{self._replica_id}"
        backend = _C.create_backend(store, rank, world_size, self._timeout, ranks, name)
        backend._set_sequence_number_for_group()
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(_BACKEND_TYPE)
        devices = ["cpu", "cuda"] if _C.build_info()["cuda"] else ["cpu"]
        for dev in devices:
            pg._register_backend(torch.device(dev), _BACKEND_TYPE, backend)
        self._backend = backend
        return pg

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  *args, **kwargs) -> None:
        # torchft's configure aborts the old group (ProcessGroup.abort reaches its backend);
        # that is a reconfiguration, not an error, so errored() is not set for it.
        self._backend = None
        super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)

    def abort(self, errored: bool = True) -> None:
        """Fails the group's pending and later ops at once; ``configure`` builds a new one."""
        if self._backend is not None:
            self._errored = RuntimeError(
                f"ProcessGroupRSDP rank {self._rank}: the process group was aborted"
            )
            self._backend.abort()
            self._backend = None
        super().abort(errored=errored)

    def shutdown(self) -> None:
        """Lets queued ops finish, then releases the group (torchft's ``shutdown``)."""
        if self._backend is not None:
            self._backend.shutdown()
            self._backend = None
        super().shutdown()

    def errored(self) -> Optional[Exception]:
        """The failure that needs a reconfiguration: an abort, a peer lost or an op past its
        deadline (the backend's ``get_error``); ``None`` while the group is healthy."""
        if self._errored is None and self._backend is not None:
            err = self._backend.get_error()
            if err != type(err).SUCCESS:
                self._errored = RuntimeError(
                    f"ProcessGroupRSDP rank {self._rank}: the group is broken ({err.name}); "
                    f"its pending and later ops are aborted until configure()"
                )
        return self._errored

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        if self._backend is not None:
            self._backend.set_timeout(timeout)

    def getBackendName(self) -> str:
        return "torchft-rsdp"



class DistributedDataParallel(_FTDistributedDataParallel):
    """``torchft.DistributedDataParallel`` whose comm hook tolerates a failed all-reduce.

    torchft 0.2.0's hook waits for the Manager's all-reduce and returns its inner future; when
    the all-reduce fails (a replica died during it), the Manager records the error and the
    wait returns ``False``, but the inner future was never made and the hook's ``assert``
    raises out of ``backward()`` in every surviving replica (with ProcessGroupGloo as with
    ours). Here the bucket is handed back as it is instead: the Manager already knows, so
    ``should_commit()`` returns ``False``, the optimizer does not step and the gradients are
    zeroed with the next ``zero_grad()``. Buckets after the failure get the Manager's
    completed no-op work, which this hook accepts too.
    """

    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = work.get_future()
        inner = getattr(fut, "_fut", None)
        if inner is not None:
            return inner
        if not hasattr(fut, "_fut") and fut.done():  # the Manager's no-op work after an error
            return fut
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done
