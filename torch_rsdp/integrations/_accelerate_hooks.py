"""``accelerate.Accelerator`` over a model sharded by torch_rsdp.

``prepare_model`` wraps a model in ``DistributedDataParallel`` on every multi-process CPU or
GPU run. Around a sharded model DDP would broadcast rank 0's shards over every rank's own at
construction and all-reduce gradients the model already synchronised (torch_rsdp makes DDP
refuse such a model outright), so a sharded model is prepared as for evaluation: mixed
precision's autocast and ``torch.compile`` as configured, no wrapper, no device move (its
parameters are where its shards live). The model synchronises its gradients in every backward,
so ``accumulate()``'s skipped synchronisation (DDP's ``no_sync``) is a no-op for it: the
accumulated gradient is the same, at the cost of one synchronisation per micro-batch.

``get_state_dict`` (and so ``save_model``) gathers whole tensors on the main process
(collective: accelerate documents ``save_model`` as called on every process), and
``clip_grad_norm_`` of a sharded model's parameters computes one process's norm.
FSDP and DeepSpeed plugins shard a model themselves and refuse a sharded one.
"""
from __future__ import annotations

from ._refusal import refuse_if_missing
from ._sharded import clip_grad_norm_ as one_process_clip
from ._sharded import full_model_state_dict, is_sharded

__all__ = ["guard_prepare", "prepare_model", "get_state_dict", "clip_grad_norm"]


def _unwrap(model):
    return getattr(model, "_orig_mod", model)  # torch.compile's wrapper


def _refuse_other_sharding(acc) -> None:
    kind = str(acc.distributed_type)
    if "FSDP" in kind or "DEEPSPEED" in kind:
        raise ValueError(
            f"accelerate.Accelerator.prepare (rank {acc.process_index}): the model is sharded "
            f"by torch_rsdp already, and accelerate's {kind} would shard it again; run "
            f"accelerate without an FSDP or DeepSpeed plugin (torch_rsdp.plan.apply chooses "
            f"the sharding) or pass the unsharded model to accelerate's FSDP")


def guard_prepare(original):
    def prepare(self, *args, **kwargs):
        if any(is_sharded(_unwrap(a)) for a in list(args) + list(kwargs.values())):
            refuse_if_missing("accelerate.Accelerator.prepare", ("accelerate",))
        return original(self, *args, **kwargs)
    return prepare


def prepare_model(original):
    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        if not is_sharded(_unwrap(model)):
            return original(self, model, device_placement=device_placement,
                            evaluation_mode=evaluation_mode)
        _refuse_other_sharding(self)
        return original(self, model, device_placement=False, evaluation_mode=True)
    return prepare_model


def get_state_dict(original):
    def get_state_dict(self, model, unwrap=True):
        inner = _unwrap(self.unwrap_model(model))
        if not is_sharded(inner):
            return original(self, model, unwrap=unwrap)
        return full_model_state_dict(inner if unwrap else model)
    return get_state_dict


def clip_grad_norm(original):
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        parameters = list(parameters) if not hasattr(parameters, "grad") else [parameters]
        ids = {id(p) for p in parameters}
        for model in getattr(self, "_models", []):
            inner = _unwrap(model)
            if is_sharded(inner) and ids == {id(p) for p in inner.parameters()}:
                self.unscale_gradients()
                return one_process_clip(inner, max_norm, norm_type)
        return original(self, parameters, max_norm, norm_type)
    return clip_grad_norm_
