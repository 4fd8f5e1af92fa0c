"""The refusal of a sharded model where a patch is missing.

:mod:`._patching` records here each row of the patch table whose method a library lacks; the
guards (``Trainer.__init__``, ``Accelerator.prepare``, Lightning's ``Strategy.connect``) and
``RSDPStrategy`` call :func:`refuse_if_missing` when a model torch_rsdp sharded comes in, and
:mod:`._first_step` at its first training step where no guard stood, so that it is refused
before the library's unsharded code can save rank 0's shards as the model.
It sits below the table and the wrappers, which is why it holds its own record.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, List, Tuple

__all__ = ["IntegrationError", "Missing", "record_missing", "missing", "refuse_if_missing"]


class IntegrationError(RuntimeError):
    """A model sharded by torch_rsdp reached a library whose patch for it is missing."""


@dataclass(frozen=True)
class Missing:
    library: str
    version: str
    tested: Tuple[str, str]
    kind: str      # the row's kind: patch, guard or override
    target: str    # Class.method
    why: str


_LOCK = threading.Lock()
_MISSING: List[Missing] = []


def record_missing(entry: Missing) -> None:
    with _LOCK:
        if entry not in _MISSING:
            _MISSING.append(entry)


def missing(libraries: Iterable[str], kinds: Iterable[str]) -> List[Missing]:
    libraries, kinds = set(libraries), set(kinds)
    with _LOCK:
        return [m for m in _MISSING if m.library in libraries and m.kind in kinds]


def refuse_if_missing(where: str, libraries: Iterable[str],
                      kinds: Iterable[str] = ("patch", "guard")) -> None:
    """Raises :class:`IntegrationError` naming the rank, ``where`` and every missing row of
    ``libraries`` of ``kinds``; returns if there is none."""
    rows = missing(libraries, kinds)
    if not rows:
        return
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    lines = [f"  {m.library} {m.version}: {m.target} is missing (tested with {m.tested[0]} to "
             f"{m.tested[1]}); without it {m.why}" for m in rows]
    raise IntegrationError(
        f"rank {rank}: {where} got a model sharded by torch_rsdp, but torch_rsdp's integration "
        f"cannot serve this version:\n" + "\n".join(lines) +
        "\nInstall a tested version (scripts/setup.sh pins them), or save with "
        "torch_rsdp.integrations.full_model_state_dict yourself; "
        "torch_rsdp.integrations.status() shows every patch")
