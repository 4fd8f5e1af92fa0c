"""A stand-in accelerator for CPU CI: a device with memory of its own, whose bytes a test can
count.

Offload ([Note: shards offloaded to host memory] in torch_rsdp/rsdp/_rotation/device_copies.py)
is a claim about *where* bytes live: shards, their gradients and optimizer state in host
memory, only the shard in hand on the device. On a CPU-only machine nothing tells a host
tensor from a device tensor, so this module makes a device torch treats as separate:
``torch.device("standin")``, torch's PrivateUse1 key renamed and set up as a Python backend
(``torch.utils.backend_registration._setup_privateuseone_for_python_backend``). Its tensors
are wrapper subclasses (:class:`StandinTensor`) over CPU tensors of their own:

* every op on them runs on their CPU payloads and returns stand-in tensors, and an op that
  mixes a stand-in tensor with a CPU tensor of more than zero dimensions raises, as CUDA does
  (a layer that computed on a host shard would fail the test instead of passing it);
* moves happen only through ``.to`` / ``copy_`` between the two devices, as with CUDA;
* ``untyped_storage()`` and ``data_ptr()`` are the payload's, apart from every host storage;
* :data:`MEMORY` counts the bytes of every stand-in storage alive (each counted once, views
  included), and its peak: what a CUDA caching allocator's ``max_memory_allocated`` would say
  without the caching.

Set it up in a test's worker process only (renaming PrivateUse1 is once per process), and
before the process's first backward: autograd's engine counts each backend's devices once.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._pytree import tree_map

NAME = "standin"
_HOST = torch.device("cpu")


class Memory:
    """Bytes of stand-in storages alive now (``current``) and at most (``peak``)."""

    def __init__(self):
        self.current = 0
        self.peak = 0
        self._refs = {}  # storage address -> [bytes, wrappers alive]

    def reset_peak(self) -> None:
        self.peak = self.current

    def _track(self, raw: torch.Tensor) -> None:
        # by the payload's lifetime: the wrapper itself may be swapped
        # (torch.utils.swap_tensors refuses tensors with weak references)
        st = raw.untyped_storage()
        key = st.data_ptr()
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [st.nbytes(), 0]
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(raw, self._untrack, key)

    def _untrack(self, key) -> None:
        entry = self._refs[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self._refs[key]
            self.current -= entry[0]


MEMORY = Memory()
DEVICE: torch.device = None  # set by setup()


class StandinTensor(torch.Tensor):
    """A tensor on the stand-in device; ``raw`` is its payload in CPU memory."""

    @staticmethod
    def __new__(cls, raw: torch.Tensor):
        t = torch.Tensor._make_wrapper_subclass(
            cls, raw.size(), strides=raw.stride(), storage_offset=raw.storage_offset(),
            dtype=raw.dtype, device=DEVICE, requires_grad=False)
        t.raw = raw
        MEMORY._track(raw)
        return t

    def __repr__(self):
        return f"StandinTensor({self.raw!r})"

    # The payload's storage stands for the device storage: code that tells buffers apart by
    # their storage (saved-tensor hooks keyed on a rotation buffer) works as on CUDA
    def untyped_storage(self):
        return self.raw.untyped_storage()

    def data_ptr(self):
        return self.raw.data_ptr()

    # ``t.data = other`` swaps what the tensor holds below Python: the payload must follow
    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new):
        torch.Tensor.data.__set__(self, new)
        self.raw = new.raw if isinstance(new, StandinTensor) else new

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            return _to_copy(args[0], **kwargs)
        if func is torch.ops.aten.copy_.default:
            return _copy_into(args[1], args[0])

        def payload(x):
            if isinstance(x, StandinTensor):
                return x.raw
            if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() > 0:
                raise RuntimeError(f"{func}: expected every tensor on {NAME}, got a cpu tensor "
                                   f"of shape {tuple(x.shape)}")
            if isinstance(x, torch.device) and x.type == NAME:
                return _HOST
            return x

        out = func(*tree_map(payload, args), **tree_map(payload, kwargs))
        return tree_map(lambda x: StandinTensor(x) if isinstance(x, torch.Tensor) else x, out)


def _to_copy(src, device=None, **kw):
    raw = src.raw if isinstance(src, StandinTensor) else src
    out = torch.ops.aten._to_copy.default(raw, **kw)
    if device is not None and torch.device(device).type == "cpu":
        return out
    return StandinTensor(out)


def _copy_into(src, dst):
    (dst.raw if isinstance(dst, StandinTensor) else dst).copy_(
        src.raw if isinstance(src, StandinTensor) else src)
    return dst


class _Module:
    """``torch.standin``: one device, and "not available" to code that would drive it like a
    real accelerator (torch.distributed.checkpoint then writes as on a CPU-only machine: the
    families that share the worker process must not see another writer)."""

    def is_available(self) -> bool:
        return False

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass


def setup() -> torch.device:
    """Registers the stand-in device (once per process) and returns it."""
    global DEVICE, _LIB
    if DEVICE is not None:
        return DEVICE
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME, backend_module=_Module())
    DEVICE = torch.device(NAME, 0)
    # Factories with device="standin" reach the PrivateUse1 key with no tensor to dispatch
    # on; copies into a fresh stand-in tensor reach ``_copy_from``.
    _LIB = torch.library.Library("aten", "IMPL")
    _LIB.impl("empty.memory_format",
              lambda size, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None: StandinTensor(torch.empty(size, dtype=dtype)), "PrivateUse1")
    _LIB.impl("empty_strided",
              lambda size, stride, dtype=None, layout=None, device=None, pin_memory=None:
              StandinTensor(torch.empty_strided(size, stride, dtype=dtype)), "PrivateUse1")
    _LIB.impl("_copy_from", lambda src, dst, non_blocking=False: _copy_into(src, dst),
              "PrivateUse1")
    return DEVICE


_LIB = None
