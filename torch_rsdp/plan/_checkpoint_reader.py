"""A ``torch.distributed.checkpoint`` reader that checks a checkpoint before reading it.

    dcp.load(state_dict, storage_reader=plan.CheckpointReader(path))

DCP's ``FileSystemReader`` finds a missing or truncated shard file only while it reads, after
other tensors were read (a truncated one raises a bare ``EOFError``), and a directory without
``.metadata`` fails with a generic error. :class:`CheckpointReader` checks, on every rank,
before the load plan is made: that ``.metadata`` exists, and that every file the metadata
names exists and is long enough for every item stored in it; and (``strict``) that the
checkpoint holds nothing under the state dict's top-level keys that the state dict does not
ask for (a checkpoint of a larger model would otherwise load silently: DCP reads what the state
dict asks for and ignores the rest; a missing key or a wrong shape DCP reports itself). The
error names the file or the keys, and every rank raises it (DCP gathers the ranks' errors),
before anything is read. (With the plan's hooks nothing a failed load read reaches the model or the optimizer
anyway: :mod:`torch_rsdp._checkpoint_hooks`, [Note: copies].)
"""
from __future__ import annotations

import os
from typing import Any, Dict

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["CheckpointReader", "check_checkpoint_files"]


def check_checkpoint_files(path: str, metadata: Metadata) -> None:
    """Raises ``FileNotFoundError`` / ``ValueError`` naming the first file of the checkpoint
    at ``path`` that is missing or shorter than what ``metadata`` stores in it."""
    need: Dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    for rel, end in sorted(need.items()):
        f = os.path.join(path, rel)
        if not os.path.exists(f):
            raise FileNotFoundError(f"torch_rsdp.plan: checkpoint {path!r} lacks the file "
                                    f"{rel!r}, which its metadata names")
        size = os.path.getsize(f)
        if size < end:
            raise ValueError(f"torch_rsdp.plan: checkpoint file {f!r} is truncated: "
                             f"{size} bytes, its metadata stores data up to byte {end}")


class CheckpointReader(FileSystemReader):
    """``FileSystemReader`` that checks the checkpoint's files before the load is planned.

    Args:
        path: the checkpoint directory (``checkpoint_id`` of ``dcp.save``).
        strict: raise if the checkpoint holds keys the state dict does not ask for (under its
            top-level keys: ``model.*`` when it has ``"model"``).
        **kwargs: ``FileSystemReader``'s other arguments.
    """

    def __init__(self, path, strict: bool = True, **kwargs):
        super().__init__(path, **kwargs)
        self._dir = os.fspath(path)
        self._strict = strict
        self._metadata: Metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        meta = os.path.join(self._dir, ".metadata")
        if kwargs.get("rank") is None and not os.path.exists(meta):
            what = ("does not exist" if not os.path.isdir(self._dir) else
                    "has no .metadata: not a checkpoint, or one whose save did not finish")
            raise FileNotFoundError(f"torch_rsdp.plan: checkpoint directory {self._dir!r} "
                                    f"{what}")
        return super().read_metadata(*args, **kwargs)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata
        check_checkpoint_files(self._dir, metadata)

    def prepare_global_plan(self, plans):
        """On the coordinator, with every rank's plan: the keys nobody asks for."""
        if self._strict and self._metadata is not None:
            asked = {item.dest_index.fqn for plan in plans for item in plan.items}
            tops = {fqn.split(".", 1)[0] for fqn in asked}
            extra = sorted(k for k in self._metadata.state_dict_metadata
                           if k.split(".", 1)[0] in tops and k not in asked)
            if extra:
                more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
                raise ValueError(f"torch_rsdp.plan: checkpoint {self._dir!r} holds keys this "
                                 f"model does not have: {extra[:5]}{more} (a checkpoint of "
                                 f"another model? CheckpointReader(strict=False) ignores them)")
        return super().prepare_global_plan(plans)
