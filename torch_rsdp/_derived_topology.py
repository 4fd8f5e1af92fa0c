"""The topology derived for a group on any backend: where its ranks live, without the rsdp backend.

The rsdp backend learns its topology when a group starts (``csrc/core/topology.h``). A group
on gloo, NCCL or MPI has none, yet RSDP's ring and the hybrid strategies need it on every
backend: a ring that keeps the ranks of a node adjacent crosses each node boundary once per
hop, and ``hybrid_shard`` shards inside a node. This module derives the same answer, with the
same rules, so a group of the same ranks has the same ring on every backend (and RSDP's sums
are added in the same order, bit for bit):

* ``RSDP_NODE_ID`` set: it names the node, as for the rsdp backend (emulated nodes, or a
  launcher that knows better); every rank's is gathered once over the group.
* else torchrun's ``LOCAL_WORLD_SIZE`` / ``LOCAL_RANK`` / ``GROUP_RANK``: torchrun numbers
  the ranks of one node contiguously (``RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``),
  so global rank ``g`` lives on node ``g // LOCAL_WORLD_SIZE`` and nothing needs sending.
  Used only where this rank's variables fit that layout.
* else the host name and boot id (what the rsdp backend uses), gathered once over the group.

Nodes are numbered by their lowest group rank, a node's ranks ascend (``Topology::
from_node_ids``). The answer is cached per group: gathering is collective, so the first call
on a group must be made by all its ranks at the same point (every caller here is collective
anyway: building a ring, applying a plan).
"""
from __future__ import annotations

import os
import socket
import weakref
from typing import Dict, List, Optional, Sequence

import torch.distributed as dist

__all__ = ["derived_topology", "topology_from_node_ids", "ring_order"]

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def topology_from_node_ids(node_ids: Sequence[str], rank: int) -> dict:
    """The topology dict the rsdp backend's ``topology()`` returns, for these node ids (one
    per group rank) seen from group rank ``rank``."""
    index: Dict[str, int] = {}
    nodes: List[List[int]] = []
    for r, key in enumerate(node_ids):
        if key not in index:
            index[key] = len(nodes)
            nodes.append([])
        nodes[index[key]].append(r)
    node = index[node_ids[rank]]
    local_rank = nodes[node].index(rank)

    def rail(local: int) -> List[int]:
        return [n[local] for n in nodes if local < len(n)]

    uniform = all(len(n) == len(nodes[0]) for n in nodes)
    describe = f"{len(nodes)} node{'' if len(nodes) == 1 else 's'}"
    if uniform:
        describe += f" x {len(nodes[0])} rank{'' if len(nodes[0]) == 1 else 's'}"
    describe += ":" + ",".join(f" node {i} = {{{','.join(map(str, n))}}}"
                               for i, n in enumerate(nodes))
    return {"rank": rank, "size": len(node_ids), "node": node, "num_nodes": len(nodes),
            "local_rank": local_rank, "local_size": len(nodes[node]),
            "nodes": nodes, "rail": rail(local_rank), "leaders": rail(0),
            "uniform": uniform, "describe": describe}


def ring_order(topo: dict) -> List[int]:
    """Group ranks in ring order: ranks of a node adjacent, nodes in order
    (``Topology::node_major_order``)."""
    return [r for n in topo["nodes"] for r in n]


def _torchrun_node(global_rank: int) -> Optional[int]:
    """This rank's node index from torchrun's variables, or None where they are absent or do
    not fit torchrun's contiguous numbering (then the ranks say where they are)."""
    env = os.environ
    try:
        lws, lr = int(env["LOCAL_WORLD_SIZE"]), int(env["LOCAL_RANK"])
        rank, grp = int(env["RANK"]), int(env["GROUP_RANK"])
    except (KeyError, ValueError):
        return None
    if lws <= 0 or rank != global_rank or rank != grp * lws + lr:
        return None
    return grp


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _node_ids(group: dist.ProcessGroup) -> List[str]:
    size = dist.get_world_size(group)
    globals_ = [dist.get_global_rank(group, r) for r in range(size)]
    me = globals_[dist.get_rank(group)]
    explicit = os.environ.get("RSDP_NODE_ID")
    if not explicit and _torchrun_node(me) is not None:
        # torchrun sets these four variables on every rank alike (GROUP_RANK included, which
        # other launchers that set LOCAL_RANK do not), so every rank takes this branch.
        lws = int(os.environ["LOCAL_WORLD_SIZE"])
        return [f"torchrun-node-{g // lws}" for g in globals_]
    mine = explicit or _host_id()
    ids: List[Optional[str]] = [None] * size
    dist.all_gather_object(ids, mine, group=group)
    return [str(i) for i in ids]


def derived_topology(group: Optional[dist.ProcessGroup] = None) -> dict:
    """``group``'s topology (default: the world), derived as the module docstring says;
    collective on the first call for a group."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    topo = _CACHE.get(pg)
    if topo is None:
        topo = _CACHE[pg] = topology_from_node_ids(_node_ids(pg), dist.get_rank(pg))
    return topo
