"""Device meshes for the FSDP2-backed strategies, built once per ``apply``.

``full_shard`` / ``shard_grad_op`` shard over the whole group: a 1-D mesh over it.
``hybrid_shard`` shards inside a node and replicates across nodes: a 2-D mesh
``(replicate, shard)`` whose rows are the nodes and whose columns are the rails, read from
:func:`torch_rsdp.topology` (so FSDP2's all-gathers and reduce-scatters run on the node's shared
memory and only the per-step all-reduce of the gradient shards crosses the network). On one node
the replicate dimension has size 1 and hybrid_shard is full_shard; it then uses the 1-D mesh.

The node and rail process groups are created with ``use_local_synchronization=True``: only
their own members take part, so ``apply`` on a sub-group never waits for ranks outside it.
"""
from __future__ import annotations

import os
from typing import List, Optional

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["Meshes", "node_ranks"]


def node_ranks(group: Optional[dist.ProcessGroup]) -> List[List[int]]:
    """The group ranks of every node (from the rsdp backend's topology; on another backend,
    from ``LOCAL_WORLD_SIZE``, as torchrun sets it)."""
    world = dist.get_world_size(group)
    try:
        from ..topology import topology
        return [list(n) for n in topology(group)["nodes"]]
    except TypeError:  # not an rsdp group
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
        if local <= 0 or world % local:
            local = world
        return [list(range(i, i + local)) for i in range(0, world, local)]


class Meshes:
    """Lazily built meshes of one ``group`` on ``device_type``."""

    def __init__(self, group: Optional[dist.ProcessGroup], device_type: str = "cpu"):
        self.group = group if group is not None else dist.group.WORLD
        self.device_type = device_type
        self._flat: Optional[DeviceMesh] = None
        self._hybrid: Optional[DeviceMesh] = None
        self._nodes: Optional[List[List[int]]] = None

    def nodes(self) -> List[List[int]]:
        """The group ranks of every node."""
        if self._nodes is None:
            self._nodes = node_ranks(self.group)
        return self._nodes

    def flat(self) -> DeviceMesh:
        if self._flat is None:
            self._flat = DeviceMesh.from_group(self.group, self.device_type)
        return self._flat

    def hybrid(self) -> DeviceMesh:
        if self._hybrid is not None:
            return self._hybrid
        nodes = self.nodes()
        if len(nodes) == 1:
            self._hybrid = self.flat()
            return self._hybrid
        sizes = {len(n) for n in nodes}
        if len(sizes) != 1:
            raise ValueError(
                f"torch_rsdp.plan: hybrid_shard needs nodes of equal size, this group has nodes "
                f"of {[len(n) for n in nodes]} ranks on rank {dist.get_rank(self.group)}")
        glob = [[dist.get_global_rank(self.group, r) for r in node] for node in nodes]
        me = dist.get_rank()
        mine = next(i for i, node in enumerate(glob) if me in node)
        col = glob[mine].index(me)
        # Every rank makes its node group, then its rail group: the members of each group
        # create it in the same order, which is all local synchronisation needs.
        shard_pg = dist.new_group(glob[mine], use_local_synchronization=True)
        rail_pg = dist.new_group([node[col] for node in glob], use_local_synchronization=True)
        self._hybrid = DeviceMesh.from_group([rail_pg, shard_pg], self.device_type, mesh=glob,
                                             mesh_dim_names=("replicate", "shard"))
        return self._hybrid
