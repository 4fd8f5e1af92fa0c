"""``load_pretrained(model, path)``: a Hugging Face checkpoint into a sharded model, each rank
reading only its slices.

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, LoraConfig(...))     # optional: adapters on a frozen base
    rsdp.shard(model)
    model.to_empty(device="cpu")                      # this rank's shards, uninitialised
    rsdp.load_pretrained(model, path)                 # save_pretrained's directory

The reading is torch's (``torch.distributed.checkpoint`` with its
``HuggingFaceStorageReader``: safetensors files, a model split over several included, each
rank reading the slices its shards cover). What this adds is what makes that safe on the
models users fine-tune:

* **names**: a peft model's keys (``base_model.model.`` in front, ``.base_layer`` inside a
  wrapped layer) are matched to the base model's; LoRA adapters of a model just materialised
  get peft's own initialisation (``lora_B`` zeros: the model starts as the checkpoint);
* **what is missing**: a head tied to its embedding is absent from the checkpoint and loads
  with it; any other parameter or persistent buffer of the model that the checkpoint lacks
  raises (``strict=False`` leaves them as they are);
* **shapes**: every tensor's shape is checked against the checkpoint before a byte is read,
  and a mismatch raises naming the rank, the tensor and both shapes.

A model just materialised hands ``dcp.load`` its own tensors ([Note: loading a materialised
model in place] in :mod:`torch_rsdp._checkpoint_hooks`), so loading peaks at this rank's shards
plus the slice in flight.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn

__all__ = ["load_pretrained"]

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


def _checkpoint_shapes(path: str) -> Dict[str, List[int]]:
    """Every tensor's shape in the safetensors files of ``path``, read from their headers."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"torch_rsdp.rsdp.load_pretrained: no .safetensors file in "
                                f"{path!r} (a save_pretrained directory)")
    shapes = {}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def load_pretrained(model: nn.Module, path: str, *, strict: bool = True,
                    init_adapters: Optional[bool] = None) -> None:
    """Loads the Hugging Face checkpoint in ``path`` (a ``save_pretrained`` directory) into
    ``model``, sharded or not, each rank reading only what it holds. Collective: every rank of
    the model's group calls it.

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
    shapes = _checkpoint_shapes(path)
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
    dcp.load(wanted, storage_reader=dcp.HuggingFaceStorageReader(path))
    # The values are the model's own tensors when it was just materialised, else copies: load
    # them either way (a copy onto itself costs one pass over this rank's share)
    model.load_state_dict({k: wanted[checkpoint_key(k)] for k in sd
                           if checkpoint_key(k) in wanted}, strict=False)
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
