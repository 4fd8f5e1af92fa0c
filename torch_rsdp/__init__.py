"""torch_rsdp: the "rsdp" torch.distributed backend.

    import torch_rsdp
    torch.distributed.init_process_group("rsdp")

Importing the package registers the backend (idempotently) for CPU tensors,
and for CUDA tensors in a build with CUDA (see :mod:`torch_rsdp._cuda`).

The public API is ``__all__`` (``docs/api.md`` lists it with the packages above it:
:mod:`torch_rsdp.rsdp`, :mod:`torch_rsdp.plan`, :mod:`torch_rsdp.integrations`,
:mod:`torch_rsdp.torchft`); every ``_``-prefixed module is private and may change.

Layout, bottom to top (imports point downwards only; ``tests/project/test_import_rules.py`` checks it):

* the backend: the extension ``_C`` (``_extension`` loads it), its registration, and the
  modules over it (``_ring``, ``_topology``, ``_compression``, ``_comm_memory``, ``_cuda``,
  ``_health``), whose public functions this package exports; the ring and the topology on
  groups of other backends (``_p2p_ring``, ``_derived_topology``) beside them;
* neutral ground that ``rsdp`` and ``plan`` share (``_utils``, ``_dtensor_params``,
  ``_grad_sync``, ``_checkpoint_hooks``, ``_apply_guard``, ``_materialize``): the backend's
  modules at most;
* :mod:`torch_rsdp.rsdp`: the backend and the neutral modules;
* :mod:`torch_rsdp.plan`: all of the above, ``rsdp`` through its public API only;
* :mod:`torch_rsdp.integrations`: the stock trainers over what ``rsdp`` and ``plan`` shard;
* ``python -m torch_rsdp`` (``__main__``): the report to paste into a bug (``_env_report``: the
  package's public names) and ``--check N`` (``_selfcheck``: the backend's modules); nothing
  imports these three but ``__main__``.

This package's ``__init__`` imports the backend and the integrations only, so
``import torch_rsdp`` does not load ``rsdp`` or ``plan``; :mod:`torch_rsdp.torchft`
(optional) builds on the backend too.
"""
from . import _extension  # noqa: F401,I001  (first: RSDP_EXTENSION may name another _C)
from . import _registration, _shrink_world
from ._comm_memory import comm_empty
from ._compression import get_compression, set_compression
from ._cuda import build_info, cuda_available, cuda_paths
from ._health import group_error, monitored_barrier
from ._ring import ring_neighbours, ring_shift, ring_shift_reduce
from ._topology import comm_stats, reset_comm_stats, topology

__version__ = "0.1.0"

_registration.register()
_shrink_world.install()
# the stock trainers over sharded models: importing the package installs its patches
from . import integrations  # noqa: E402,F401,I001

__all__ = [
    "ring_shift",
    "ring_shift_reduce",
    "ring_neighbours",
    "topology",
    "comm_stats",
    "reset_comm_stats",
    "set_compression",
    "get_compression",
    "comm_empty",
    "monitored_barrier",
    "group_error",
    "build_info",
    "cuda_available",
    "cuda_paths",
    "__version__",
]
