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

from typing import Dict, List, Optional

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .._compression import set_compression
from .._topology import topology
from ._plan_compression import key

__all__ = ["Meshes", "node_ranks", "device_type_of"]


def device_type_of(model) -> str:
    """The device type ``model`` computes on, for its meshes: a DTensor moves its local tensor
    to its mesh's device type, and FSDP2 the module to its mesh's device."""
    for p in model.parameters():
        return (p._local_tensor if isinstance(p, DTensor) else p).device.type
    return "cpu"


def node_ranks(group: Optional[dist.ProcessGroup]) -> List[List[int]]:
    """The group ranks of every node, on any backend (:func:`torch_rsdp.topology`: the rsdp
    backend's, or derived from ``RSDP_NODE_ID``, torchrun's variables or the host names)."""
    return [list(n) for n in topology(group)["nodes"]]


class Meshes:
    """Lazily built meshes of one ``group`` on ``device_type``, exact or, for a compression
    setting (:mod:`._plan_compression`), over groups of the same ranks that compress."""

    def __init__(self, group: Optional[dist.ProcessGroup], device_type: str = "cpu"):
        self.group = group if group is not None else dist.group.WORLD
        self.device_type = device_type
        self._flat: Optional[DeviceMesh] = None
        self._hybrid: Optional[DeviceMesh] = None
        self._nodes: Optional[List[List[int]]] = None
        self._compressed: Dict[tuple, dict] = {}  # setting -> {"group", "flat", "hybrid"}

    def groups(self) -> List[dist.ProcessGroup]:
        """Every process group built so far (the plan's own first): for
        ``torch_rsdp.comm_stats`` over all the traffic a plan sends."""
        out = [self.group]
        meshes = [self._hybrid] + [slot.get(k) for slot in self._compressed.values()
                                   for k in ("flat", "hybrid")]
        for slot in self._compressed.values():
            out.append(slot.get("group"))
        for m in meshes:
            if m is not None and m.ndim == 2:
                out += [m.get_group("shard"), m.get_group("replicate")]
        seen, uniq = set(), []
        for g in out:
            if g is not None and id(g) not in seen:
                seen.add(id(g))
                uniq.append(g)
        return uniq

    def compresses(self, c: Optional[dict]) -> bool:
        """Whether setting ``c`` changes anything here (only traffic across nodes is
        compressed: on one node every group is exact)."""
        return c is not None and len(self.nodes()) > 1

    def _slot(self, c: dict) -> dict:
        return self._compressed.setdefault(key(c), {})

    def group_for(self, c: Optional[dict] = None) -> dist.ProcessGroup:
        """The group of the plan's ranks whose collectives send setting ``c`` across nodes
        (one per distinct setting; the plan's own group when ``c`` changes nothing)."""
        if not self.compresses(c):
            return self.group
        slot = self._slot(c)
        if "group" not in slot:
            ranks = [dist.get_global_rank(self.group, r)
                     for r in range(dist.get_world_size(self.group))]
            g = dist.new_group(ranks, use_local_synchronization=True)
            try:
                set_compression(g, all_gather=c["weights"], reduce_scatter=c["grads"],
                                all_reduce=c["grads"], ring_shift=c["weights"],
                                ring_shift_reduce=c["grads"], block=c["block"])
            except TypeError as e:
                raise ValueError(f"torch_rsdp.plan: compression needs a group on the rsdp "
                                 f"backend ({e})") from None
            slot["group"] = g
        return slot["group"]

    def nodes(self) -> List[List[int]]:
        """The group ranks of every node."""
        if self._nodes is None:
            self._nodes = node_ranks(self.group)
        return self._nodes

    def flat(self, c: Optional[dict] = None) -> DeviceMesh:
        if self.compresses(c):
            slot = self._slot(c)
            if "flat" not in slot:
                slot["flat"] = DeviceMesh.from_group(self.group_for(c), self.device_type)
            return slot["flat"]
        if self._flat is None:
            self._flat = DeviceMesh.from_group(self.group, self.device_type)
        return self._flat

    def hybrid(self, c: Optional[dict] = None) -> DeviceMesh:
        if self.compresses(c):
            slot = self._slot(c)
            if "hybrid" not in slot:
                slot["hybrid"] = self._hybrid_mesh(c)
            return slot["hybrid"]
        if self._hybrid is None:
            self._hybrid = self._hybrid_mesh(None)
        return self._hybrid

    def _hybrid_mesh(self, c: Optional[dict]) -> DeviceMesh:
        """(replicate = nodes, shard = a node's ranks); with ``c`` the rails (which carry
        all of HSDP's cross-node traffic, an all-reduce) compress the gradients."""
        nodes = self.nodes()
        if len(nodes) == 1:
            return self.flat()
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
        if c is not None:  # the node groups are exact: share the exact mesh's
            exact = self.hybrid()
            shard_pg = exact.get_group("shard")
        else:
            shard_pg = dist.new_group(glob[mine], use_local_synchronization=True)
        rail_pg = dist.new_group([node[col] for node in glob], use_local_synchronization=True)
        if c is not None:
            set_compression(rail_pg, reduce_scatter=c["grads"], all_reduce=c["grads"],
                            block=c["block"])
        return DeviceMesh.from_group([rail_pg, shard_pg], self.device_type, mesh=glob,
                                     mesh_dim_names=("replicate", "shard"))
