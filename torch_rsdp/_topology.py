"""Where a process group's ranks live, and what its collectives sent.

A *node* is a set of ranks sharing memory (same host name and boot id, or the
same ``RSDP_NODE_ID``); the *local rank* is a rank's position on its node; a
*rail* is the set of ranks with one local rank across all nodes; a *leader*
is local rank 0. The rsdp backend keeps traffic inside a node where it can
and sends across nodes only on rails or between leaders.
"""
from typing import Optional

import torch.distributed as dist

from ._node_topology import derived_topology
from ._ring import backend_of, rsdp_backend

__all__ = ["topology", "comm_stats", "reset_comm_stats"]


def topology(group: Optional[dist.ProcessGroup] = None) -> dict:
    """This rank's view of ``group``'s topology.

    Keys: ``rank``, ``size``, ``node`` (index, nodes numbered by their lowest
    rank), ``num_nodes``, ``local_rank``, ``local_size``, ``nodes`` (the group
    ranks of every node), ``rail`` (the ranks sharing this rank's local rank),
    ``leaders``, ``uniform`` (all nodes have as many ranks) and ``describe``.

    On rsdp, ``handoff``: what handing data between the ranks of this node cost at the
    group's latest probe, when it was made and again while collectives run (once a second,
    ``RSDP_REPROBE_MS``, and sooner when group rank 0's collectives of 256 KiB and more
    slow down: ``csrc/transport/shm/slow_watch.cpp``)
    (``csrc/transport/shm/handoff_probe.h``; ``probes`` counts them, ``early_probes`` on group
    rank 0 those that came early because of a slowdown): ``step_ns`` (the
    fastest round trip of one shared-memory step), ``pull_gbps`` (copying a block the
    other rank just wrote; the block is one L2 cache's worth, 256 KiB to 2 MiB),
    ``cached_gbps`` and ``streamed_gbps`` (handing blocks over both ways: two ranks write one
    each into their staging memory with cached or streaming stores, then each copies the
    other's out), ``mode`` (``"near"``: the ranks' CPUs share a cache; ``"far"``: they do not,
    as when a virtual machine's CPUs sit on different chiplets of the host;
    ``"unmeasured"``: one rank, or more ranks than CPUs) and ``stores`` (``"streaming"`` or
    ``"cached"``, how copies into the staging memory store: ``RSDP_SHM_STORES``, else
    streaming where the probe's hand-off was clearly faster with it). ``allreduce_oneshot_bytes``: the largest
    CPU all-reduce that runs one-shot (one exchange, every rank reduces every copy) rather
    than reduce-scatter + all-gather: ``RSDP_ONESHOT_BYTES`` where set, else 8 KiB
    (``csrc/algorithms/select.cpp``); across nodes, the leaders' path's. ``spread_moves``:
    how often this rank moved itself off a CPU the kernel had stacked more of the node's
    ranks on than an even share, with more ranks than CPUs (``RSDP_SPREAD_MS``,
    ``csrc/transport/shm/rank_spread.cpp``).

    Any backend: a group on another backend than rsdp gets the same answer derived from
    ``RSDP_NODE_ID``, torchrun's variables or the host names (:mod:`._node_topology`; the
    first call on such a group is collective).
    """
    backend = backend_of(group)
    if backend is not None:
        return backend.topology()
    return derived_topology(group)


def comm_stats(group: Optional[dist.ProcessGroup] = None) -> dict:
    """Cumulative payload this rank sent for ``group``'s collectives and send/recv.

    ``intra_node_bytes``/``intra_node_messages`` count what went to ranks on
    this node (for shared memory: bytes this rank wrote for its peers);
    ``inter_node_bytes``/``inter_node_messages`` what crossed to other nodes;
    ``one_copy_ops`` how many collectives read their peers' buffers in place
    (buffers in communication memory, see :mod:`torch_rsdp._comm_memory`).
    """
    return rsdp_backend(group, feature="comm_stats (what the collectives sent)").comm_stats()


def reset_comm_stats(group: Optional[dist.ProcessGroup] = None) -> None:
    """Zeroes the counters of :func:`comm_stats` for ``group`` on this rank."""
    rsdp_backend(group, feature="reset_comm_stats").reset_comm_stats()
