"""``load_pretrained(model, path)``: a Hugging Face checkpoint into a sharded model, each rank
reading only its slices.

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, LoraConfig(...))     # optional: adapters on a frozen base
    rsdp.shard(model)
    model.to_empty(device="cpu")                      # this rank's shards, uninitialised
    rsdp.load_pretrained(model, path)                 # save_pretrained's directory

Each rank reads, from the safetensors files (one, or a model split over several), only the
rows its tensors cover, a few MiB at a time, with plain file reads (the layout of a DTensor's
piece is torch's). Around the reading, what makes it safe on the models users fine-tune:

* **names**: a peft model's keys (``base_model.model.`` in front, ``.base_layer`` inside a
  wrapped layer) are matched to the base model's; LoRA adapters of a model just materialised
  get peft's own initialisation (``lora_B`` zeros: the model starts as the checkpoint);
* **what is missing**: a head tied to its embedding is absent from the checkpoint and loads
  with it; any other parameter or persistent buffer of the model that the checkpoint lacks
  raises (``strict=False`` leaves them as they are);
* **computed buffers**: non-persistent buffers (rotary tables), which no checkpoint holds, are
  computed by the Hugging Face model's own ``_init_weights``, whoever materialised it;
* **shapes**: every tensor's shape is checked against the checkpoint before a byte is read,
  and a mismatch raises naming the rank, the tensor and both shapes.

A model just materialised hands out its own tensors in ``state_dict()`` ([Note: loading a
materialised model in place] in :mod:`torch_rsdp._checkpoint_hooks`), so the slices are read
straight into its shards and loading peaks at this rank's share plus the rows in flight.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._materialize import init_non_persistent_buffers

__all__ = ["load_pretrained"]

#: Rows of a tensor read at a time: what loading holds in flight, beyond the shards.
_CHUNK_BYTES = 16 << 20

#: Names peft gives an adapter's own tensors: never in a base model's checkpoint.
_ADAPTER = re.compile(r"\.(lora_[A-Za-z_]+|lora_magnitude_vector|modules_to_save|"
                      r"hada_\w+|lokr_\w+|ia3_\w+|vera_\w+|oft_\w+|boft_\w+)(\.|$)")


def checkpoint_key(model_key: str) -> str:
    """The base model's name for ``model_key``: peft's wrapper prefix and ``.base_layer``
    segments removed."""
    key = model_key
    for prefix in ("base_model.model.",):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key.replace(".base_layer.", ".")


#: safetensors' dtype names.
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


@dataclass(frozen=True)
class _Entry:
    """Where a tensor lies in a safetensors file: row-major bytes from ``begin``."""

    file: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    begin: int


def _checkpoint_index(path: str) -> Dict[str, _Entry]:
    """Every tensor of the safetensors files of ``path``, from the files' headers (nothing
    else is read)."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"torch_rsdp.rsdp.load_pretrained: no .safetensors file in "
                                f"{path!r} (a save_pretrained directory)")
    index = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            if v["dtype"] not in _DTYPES:
                raise ValueError(f"torch_rsdp.rsdp.load_pretrained: {k!r} in {f!r} has dtype "
                                 f"{v['dtype']}, which this loader does not read")
            index[k] = _Entry(f, _DTYPES[v["dtype"]], tuple(v["shape"]),
                              8 + n + v["data_offsets"][0])
    return index


def _read_into(fh, e: _Entry, target: torch.Tensor) -> None:
    """Copies this rank's part of the checkpoint tensor ``e`` (``fh``: its file) into
    ``target`` (a DTensor: its local tensor, at its offset; else all of it). Rows are read
    with plain file reads, a few MiB at a time, into a buffer of their own: what loading holds
    beyond the model is that buffer, whatever the tensor's size (safetensors' own slices
    would view the whole memory-mapped tensor)."""
    if isinstance(target, DTensor):
        local = target._local_tensor
        shape, offset = compute_local_shape_and_global_offset(
            target.shape, target.device_mesh, target.placements)
    else:
        local, shape, offset = target, tuple(target.shape), (0,) * target.dim()
    if local.numel() == 0:
        return
    item = torch.empty((), dtype=e.dtype).element_size()
    if not e.shape:  # a scalar
        fh.seek(e.begin)
        local.copy_(torch.frombuffer(bytearray(fh.read(item)), dtype=e.dtype)[0])
        return
    row = math.prod(e.shape[1:]) * item  # bytes of one row of the checkpoint's tensor
    step = max(1, _CHUNK_BYTES // max(1, row))
    cols = tuple(slice(o, o + k) for o, k in zip(offset[1:], shape[1:]))
    with torch.no_grad():
        for r in range(0, shape[0], step):
            n = min(step, shape[0] - r)
            buf = bytearray(n * row)
            fh.seek(e.begin + (offset[0] + r) * row)
            if fh.readinto(buf) != len(buf):
                raise ValueError(f"torch_rsdp.rsdp.load_pretrained: {e.file!r} ends inside a "
                                 f"tensor (truncated?)")
            rows = torch.frombuffer(buf, dtype=e.dtype).view(n, *e.shape[1:])
            local[r:r + n].copy_(rows[(slice(None),) + cols])
            del rows, buf  # before the next chunk's buffer: one in flight at a time


def load_pretrained(model: nn.Module, path: str, *, strict: bool = True,
                    init_adapters: Optional[bool] = None) -> None:
    """Loads the Hugging Face checkpoint in ``path`` (a ``save_pretrained`` directory) into
    ``model``, sharded or not, each rank reading only what it holds. Call it on every rank of
    the model's group (each reads its own rows; nothing is sent between ranks).

    Args:
        model: the model, sharded by :func:`shard` or ``torch_rsdp.plan.apply`` (typically
            built on ``meta`` and materialised by ``to_empty``), peft-wrapped or not.
        path: the directory ``save_pretrained`` wrote (``model.safetensors`` or
            ``model-0000k-of-0000n.safetensors``).
        strict: raise for a parameter or persistent buffer the checkpoint lacks (adapters and
            tied heads excepted); with False such tensors are left as they are.
        init_adapters: give peft's LoRA adapters their initialisation (``lora_B`` zeros).
            Default: when torch_rsdp's ``to_empty`` just materialised the model (its adapters
            are then uninitialised); pass True for a model another library materialised
            (FSDP2's ``fully_shard`` on meta), False to keep the adapters as they are.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if init_adapters is None:
        init_adapters = bool(getattr(model, "_rsdp_unloaded", False))
    index = _checkpoint_index(path)
    shapes = {k: list(e.shape) for k, e in index.items()}
    sd = model.state_dict()
    # key -> id of the parameter or buffer object (tied keys share one)
    obj = {k: id(t) for k, t in list(model.named_parameters(remove_duplicate=False))
           + list(model.named_buffers(remove_duplicate=False))}
    loaded = set()  # ids of the objects the checkpoint fills
    wanted, missing = {}, []
    for key, value in sd.items():
        ck = checkpoint_key(key)
        if ck in shapes:
            if list(value.shape) != list(shapes[ck]):
                raise ValueError(
                    f"torch_rsdp.rsdp.load_pretrained: rank {rank}: {key!r} has shape "
                    f"{list(value.shape)} in the model but {list(shapes[ck])} in the checkpoint "
                    f"{path!r} (as {ck!r})")
            wanted[ck] = value
            loaded.add(obj.get(key))
    for key, value in sd.items():
        ck = checkpoint_key(key)
        if ck in shapes or _ADAPTER.search("." + key):
            continue
        if obj.get(key) in loaded:  # tied to a tensor the checkpoint holds
            continue
        missing.append(key)
    if missing and strict:
        raise ValueError(f"torch_rsdp.rsdp.load_pretrained: rank {rank}: the checkpoint "
                         f"{path!r} has no {', '.join(repr(k) for k in missing[:5])}"
                         f"{' and %d more' % (len(missing) - 5) if len(missing) > 5 else ''} "
                         f"(strict=False leaves them as they are)")
    by_file: Dict[str, List[str]] = {}
    for ck in wanted:
        by_file.setdefault(index[ck].file, []).append(ck)
    for file, keys in sorted(by_file.items()):
        with open(file, "rb") as fh:
            for ck in sorted(keys, key=lambda k: index[k].begin):  # through the file in order
                _read_into(fh, index[ck], wanted[ck])
    # The values are the model's own tensors when it was just materialised, else copies: load
    # them either way (a copy onto itself costs one pass over this rank's share)
    model.load_state_dict({k: wanted[checkpoint_key(k)] for k in sd
                           if checkpoint_key(k) in wanted}, strict=False)
    # computed, not loaded: a model that another library (FSDP2) materialised holds them
    # uninitialised
    init_non_persistent_buffers(model, [(m, n) for m in model.modules()
                                        for n in m._non_persistent_buffers_set
                                        if m._buffers.get(n) is not None])
    if init_adapters:
        _init_adapters(model)


def _init_adapters(model: nn.Module) -> None:
    """peft's own initialisation of the adapters of a model just materialised (``to_empty``
    left them uninitialised; no base checkpoint holds them): ``lora_B`` zeros, so the model
    starts as the checkpoint. Replicated adapters are made equal on every rank by the first
    forward ([Note: replicas agree after materialisation] in :mod:`torch_rsdp._materialize`)."""
    configs = getattr(model, "peft_config", None) or {}
    with torch.no_grad():
        for mod in model.modules():
            reset = getattr(mod, "reset_lora_parameters", None)
            if reset is None:
                continue
            for adapter in list(getattr(mod, "lora_A", {}).keys()):
                init = getattr(configs.get(adapter), "init_lora_weights", True)
                reset(adapter, init)
