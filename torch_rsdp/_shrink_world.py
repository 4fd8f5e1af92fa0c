"""Keeps torch's rank bookkeeping right after ``dist.shrink_group`` of an rsdp group.

torch 2.13's ``shrink_group`` registers the new group's ranks wrongly in two cases, and the
backend cannot correct it (the registration happens after the backend returns):

* shrinking the **default group** renumbers the survivors (``get_rank()`` becomes the new
  group rank, "rank reassignment" in its docs) but registers the new world with the *old*
  global ranks, so ``get_process_group_ranks(WORLD)`` says ``[0, 2, 3]`` while the ranks are
  ``0, 1, 2``; ``DeviceMesh.from_group(WORLD)``, and FSDP2 on it, then find no coordinate
  for rank 1 and shard wrongly;
* shrinking **another group** removes the excluded *group* ranks from the list of *global*
  ranks: ``[1, 2, 3]`` without group rank 2 becomes ``[1, 3]`` instead of ``[1, 2]``, and the
  rank left out then silently skips every collective on the new group.

This wrapper registers what the group really is: the default group's own ranks, or the
global ranks of the members not excluded. ``torch.distributed.shrink_group`` is replaced when
torch_rsdp is imported; a reference taken before that (``from torch.distributed import
shrink_group``) misses the fix. Groups on other backends are left as torch made them.
"""
from __future__ import annotations

import functools

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ._registration import BACKEND_NAME


def _on_rsdp(pg) -> bool:
    entry = c10d._world.pg_map.get(pg)
    return entry is not None and entry[0] == BACKEND_NAME


def install() -> None:
    original = getattr(c10d, "shrink_group", None)
    if original is None or getattr(original, "_rsdp_wrapped", False):
        return  # an older torch without shrink_group, or installed already

    @functools.wraps(original)
    def shrink_group(ranks_to_exclude, group=None, *args, **kwargs):
        old = group if group is not None else c10d._get_default_group()
        was_default = old is c10d._get_default_group()
        members = dist.get_process_group_ranks(old) if _on_rsdp(old) else None
        pg = original(ranks_to_exclude, group, *args, **kwargs)
        if members is not None and _on_rsdp(pg):
            if was_default:
                kept = list(range(pg.size()))
            else:
                out = set(ranks_to_exclude)
                kept = [g for i, g in enumerate(members) if i not in out]
            c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(kept)}
        return pg

    shrink_group._rsdp_wrapped = True
    c10d.shrink_group = shrink_group
    dist.shrink_group = shrink_group
