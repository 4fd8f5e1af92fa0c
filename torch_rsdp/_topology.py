"""Where a process group's ranks live, and what its collectives sent.

A *node* is a set of ranks sharing memory (same host name and boot id, or the
same ``RSDP_NODE_ID``); the *local rank* is a rank's position on its node; a
*rail* is the set of ranks with one local rank across all nodes; a *leader*
is local rank 0. The rsdp backend keeps traffic inside a node where it can
and sends across nodes only on rails or between leaders.
"""
from typing import Optional

import torch.distributed as dist

from ._derived_topology import derived_topology
from ._ring import backend_of, rsdp_backend

__all__ = ["topology", "comm_stats", "reset_comm_stats"]


def topology(group: Optional[dist.ProcessGroup] = None) -> dict:
    """This rank's view of ``group``'s topology.

    Keys: ``rank``, ``size``, ``node`` (index, nodes numbered by their lowest
    rank), ``num_nodes``, ``local_rank``, ``local_size``, ``nodes`` (the group
    ranks of every node), ``rail`` (the ranks sharing this rank's local rank),
    ``leaders``, ``uniform`` (all nodes have as many ranks) and ``describe``.

    On rsdp, ``handoff``: how the shared memory of this node's group adapts to where its
    ranks run (``csrc/transport/shm/adaptation.h``): ``adapt`` (``RSDP_SHM_ADAPT``:
    ``"off"``, ``"once"`` or ``"continuous"``, group rank 0's), ``probes`` (how often the
    group has measured the hand-off between its ranks: when it was made, and once a second
    while collectives run when continuous), and the latest probe's findings: ``step_ns``
    (the fastest round trip of one shared-memory step), ``pull_gbps`` (copying a block the
    other rank just wrote; the block is one L2 cache's worth, 256 KiB to 2 MiB),
    ``cached_gbps`` and ``streamed_gbps`` (handing blocks over both ways with cached or
    streaming stores), ``mode`` (``"near"``: the ranks' CPUs share a cache; ``"far"``: they
    do not; ``"unmeasured"``: one rank, more ranks than CPUs, or adaptation off) and
    ``stores`` (``"streaming"`` or ``"cached"``: how copies into the staging memory store,
    streaming where the probe's hand-off was clearly faster with it). ``allreduce_oneshot_bytes``: the largest
    CPU all-reduce that runs one-shot (one exchange, every rank reduces every copy) rather
    than reduce-scatter + all-gather: 8 KiB (``kNodeAllreduceOneshotBytes``,
    ``csrc/algorithms/select.h``); across nodes, the leaders' path's (32 KiB).
    ``setup_store_requests``: the requests this rank made of the store to set the group up
    (a few, whatever the group's size: group rank 0 gathers the peer records and posts one
    table).

    Any backend: a group on another backend than rsdp gets the same answer derived from
    ``RSDP_NODE_ID``, torchrun's variables or the host names (:mod:`._derived_topology`; the
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
    (buffers in communication memory, see :mod:`torch_rsdp._comm_memory`);
    ``ucx_endpoints`` how many peers on other nodes this rank has an endpoint to (made when
    it first sends to or receives from one).
    """
    return rsdp_backend(group, feature="comm_stats (what the collectives sent)").comm_stats()


def reset_comm_stats(group: Optional[dist.ProcessGroup] = None) -> None:
    """Zeroes the counters of :func:`comm_stats` for ``group`` on this rank."""
    rsdp_backend(group, feature="reset_comm_stats").reset_comm_stats()
