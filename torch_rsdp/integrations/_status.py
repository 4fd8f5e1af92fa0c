"""``torch_rsdp.integrations._status()``: what ``import torch_rsdp`` changed outside itself.

``import torch_rsdp`` patches the stock trainers (:mod:`._patch_table`) and changes two things
of torch's for every program: a global optimizer step pre-hook (``torch_rsdp._checkpoint_hooks``:
it acts on optimizers over parameters torch_rsdp sharded and returns at once for the others) and
``torch.distributed.shrink_group`` (``torch_rsdp._shrink_world``: correct rank bookkeeping for
rsdp groups, others untouched). :func:`status` lists all of it::

    >>> print(torch_rsdp.integrations.status())
    transformers 5.24.0 (tested 4.57 to 5.24), imported
      patch  Trainer.save_model                      active
      ...
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Tuple

from ._patch_table import LIBRARIES, PATCHES
from ._patching import in_tested_range, library_version, state_of

__all__ = ["status", "Status", "LibraryStatus", "RowStatus"]


@dataclass(frozen=True)
class RowStatus:
    kind: str      # "patch", "guard", "override", or "torch" for torch's own functions
    target: str    # Class.method, or the torch function
    state: str     # active, pending, absent, missing, disabled, or off (torch hooks)
    why: str       # what it is for: what would go wrong without it


@dataclass(frozen=True)
class LibraryStatus:
    name: str
    version: Optional[str]          # None: not installed
    tested: Tuple[str, str]
    in_range: Optional[bool]        # None: not installed
    imported: bool
    rows: Tuple[RowStatus, ...]

    def __str__(self) -> str:
        if self.version is None:
            head = f"{self.name}: not installed (tested {self.tested[0]} to {self.tested[1]})"
        else:
            head = (f"{self.name} {self.version} (tested {self.tested[0]} to {self.tested[1]}"
                    f"{'' if self.in_range else ': OUTSIDE the tested range'}), "
                    f"{'imported' if self.imported else 'not imported yet (patched on import)'}")
        return "\n".join([head] + [_row(r) for r in self.rows])


def _row(r: RowStatus) -> str:
    note = {"missing": r.why, "absent": "(not in this version)"}.get(r.state, "")
    if r.kind == "torch":
        note = r.why
    return f"  {r.kind:8} {r.target:40} {r.state:8} {note}".rstrip()


@dataclass(frozen=True)
class Status:
    libraries: Tuple[LibraryStatus, ...]
    torch: Tuple[RowStatus, ...]

    @property
    def missing(self) -> Tuple[str, ...]:
        """``library: Class.method`` of every row a sharded model would be refused for."""
        return tuple(f"{lib.name}: {r.target}" for lib in self.libraries for r in lib.rows
                     if r.state == "missing")

    def __str__(self) -> str:
        return "\n".join([str(lib) for lib in self.libraries] +
                         ["torch (global, for every program that imports torch_rsdp)"] +
                         [_row(r) for r in self.torch])


def _torch_rows() -> Tuple[RowStatus, ...]:
    import torch.distributed as dist

    hook = "torch_rsdp._checkpoint_hooks" in sys.modules
    shrink = getattr(getattr(dist, "shrink_group", None), "_rsdp_wrapped", False)
    return (
        RowStatus("torch", "optim: global optimizer step pre-hook", "active" if hook else "off",
                  "moves the optimizer state of a sharded model's parameters into their "
                  "shards; returns at once for other optimizers"),
        RowStatus("torch", "distributed.shrink_group", "active" if shrink else "off",
                  "registers the ranks of a shrunk rsdp group correctly (torch's are wrong); "
                  "other backends untouched" if shrink else
                  "this torch has no shrink_group"),
    )


def status() -> Status:
    """Each library torch_rsdp patches (version, tested range, each row's state), and the
    changes to torch's own functions."""
    libraries = []
    for lib in LIBRARIES.values():
        version = library_version(lib.name)
        rows = tuple(RowStatus(r.kind, r.target, state_of(r), r.why)
                     for r in PATCHES if r.library == lib.name)
        libraries.append(LibraryStatus(
            lib.name, version, lib.tested,
            None if version is None else in_tested_range(lib.name, version),
            lib.name in sys.modules, rows))
    return Status(tuple(libraries), _torch_rows())
