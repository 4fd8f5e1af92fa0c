"""The last door: a sharded model's first training step inside a library that lacks a patch.

The guards of :mod:`._patch_table` (``Trainer.__init__``, ``Accelerator.prepare``, Lightning's
``Strategy.connect``) refuse a model torch_rsdp sharded where it comes into a library whose
patches are missing. A guard is a patched method itself, though: a release that removed or
renamed it leaves no door, and a model can come in past one (``Trainer(model_init=...)``
re-builds the model inside ``train()``; ``trainer.model = ...``). Without a door, the library's
unsharded code would train the model and then save rank 0's shards as if they were the model,
or hang in a gather (``save_model``: "rank 1 exited during gather", naming no method).

So, once any row of the table is missing (:func:`arm`, called by :mod:`._patching`; never
otherwise, so a complete integration costs nothing here), torch_rsdp keeps a door of its own:
a global forward pre-hook that, when a sharded root (a module ``plan.apply`` or ``rsdp.shard``
returned) runs a training forward (``module.training`` and grad enabled) called by the
library's driver object (the class a guard row names: the HF ``Trainer``, a Lightning
``Strategy``, an ``Accelerator``), raises :class:`~._refusal.IntegrationError` on every rank,
naming the library, its version, each missing method and the rank, before that forward runs:
before any backward, any optimizer step, any save. The model used anywhere else (the user's
own loop, evaluation under ``no_grad``, a library whose rows are all there) is untouched.
"""
from __future__ import annotations

import sys
import threading
from typing import List, Tuple

import torch

from ._patch_table import LIBRARIES, PATCHES, Patch
from ._refusal import missing, refuse_if_missing

__all__ = ["arm", "armed"]

_LOCK = threading.Lock()
_HANDLE: list = []   # the global hook's handle, once armed


def arm() -> None:
    """Installs the first-step door (idempotent). Called when a row of the table is missing."""
    with _LOCK:
        if not _HANDLE:
            _HANDLE.append(torch.nn.modules.module.register_module_forward_pre_hook(
                _before_forward))


def armed() -> bool:
    with _LOCK:
        return bool(_HANDLE)


def _is_sharded_root(module) -> bool:
    # the marks plan.apply and rsdp.shard leave on the module they return (_sharded's
    # sharded_roots reads the same); plain instance attributes, read without nn.Module's
    # __getattr__ so that every other module's forward pays two dict look-ups
    d = module.__dict__
    return d.get("_rsdp_plan") is not None or d.get("_rsdp_root") is not None


def _before_forward(module, args):
    if _is_sharded_root(module) and module.training and torch.is_grad_enabled():
        _refuse_inside_a_library()
    return None


def _drivers() -> List[Tuple[Patch, type]]:
    """``(guard row, its class)`` of every library imported so far with a row missing among
    the libraries its guard needs."""
    out = []
    for row in PATCHES:
        if row.kind != "guard" or not missing(row.needs, ("patch", "guard", "override")):
            continue
        module = sys.modules.get(f"{LIBRARIES[row.library].root}.{row.module}")
        cls = getattr(module, row.owner, None)
        if isinstance(cls, type):
            out.append((row, cls))
    return out


def _refuse_inside_a_library() -> None:
    """[Note: how the door knows the forward is the library's training step.

    The signal is an object of the library's driver class (the class of its guard row, found
    in the imported module by the name the table gives, so it is there even when the guard's
    method is not) being the ``self`` of a frame on the calling thread's stack: a method of
    the very object that drives the model is what called its forward. The HF Trainer calls the
    model in ``compute_loss`` (``self``: the Trainer, a user's subclass included), Lightning in
    ``Strategy.training_step`` (``self``: the strategy); both synchronously, on the thread that
    runs the loop. It is decided by identity (``isinstance``), not by module or function names,
    so it holds across releases that move code between modules, as long as the class keeps its
    name; a library that renamed its driver class too is reported at import, unguarded.

    Rejected: arming every sharded model while such a library is imported (transformers is
    imported by nearly every program that trains an HF model in its own loop, which must not be
    refused); looking for the driver among the model's referrers (``gc.get_referrers``: a scan
    of the heap, and an object holding the model need not be driving it); wrapping the
    library's step methods to mark "inside" (more patched methods, which a release can
    rename just the same).]"""
    drivers = _drivers()
    if not drivers:
        return
    frame = sys._getframe(1)  # up from the hook: torch's module call, the caller of forward, ...
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            me = frame.f_locals.get("self")
            for row, cls in drivers:
                if isinstance(me, cls):
                    # RSDPStrategy relies on the methods it overrides, the others on patches
                    kinds = (("override",) if getattr(me, "_torch_rsdp_strategy", False)
                             else ("patch", "guard"))
                    refuse_if_missing(f"{row.library}.{cls.__name__} (its training step, "
                                      f"in {type(me).__name__}.{code.co_name})",
                                      row.needs, kinds)
        frame = frame.f_back


# the frame walk is plain Python that torch.compile cannot trace: a compiled model runs it
# eagerly (a graph break in the degraded case only)
_disable = getattr(getattr(torch, "compiler", None), "disable", None)
if _disable is not None:
    _refuse_inside_a_library = _disable(_refuse_inside_a_library)
