"""Which layers pair up into rotation units: tensor-parallel plans in torch's vocabulary.

A *rotation unit* (:mod:`.rotation_unit`) is a module whose column-split layers feed
per-head / per-column computation into one row-split layer (Megatron's pairing: attention's
q/k/v -> o, an MLP's gate/up -> down). The plan that says which layer is which comes from,
in order:

1. ``shard(model, tp_plan={...})``: fully qualified name patterns (``*`` matches one name
   component, e.g. ``"layers.*.self_attn.q_proj"``) mapped to ``"colwise"`` / ``"rowwise"``
   (or torch's ``ColwiseParallel()`` / ``RowwiseParallel()`` objects, as for
   ``torch.distributed.tensor.parallel.parallelize_module``);
2. with ``tp_plan="auto"``: the model's own ``config.base_model_tp_plan`` (Hugging Face);
3. otherwise built-in rules for the usual names (``q_proj``/``k_proj``/``v_proj`` ->
   ``o_proj``, ``gate_proj``/``up_proj`` -> ``down_proj``).

Patterns are matched against a module's qualified name and, for Hugging Face models, against
the name inside the base model (``model.layers.0...`` is ``layers.0...`` there, which is what
``base_model_tp_plan`` uses), a peft model's wrapper (``base_model.model.``) taken off first:
its LoRA layers then pair up like the layers they wrap (:mod:`.unit_adapters`). Values other than column / row (``"gather"``, ``"colwise_rep"``,
...) are ignored: those layers are sharded one by one as usual.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

import torch.nn as nn

__all__ = ["COL", "ROW", "BUILTIN_RULES", "resolve_plan", "group_units"]

COL, ROW = "colwise", "rowwise"
# suffix -> style; applied when neither the caller nor the model's config gives a plan
#: Where a peft model (``PeftModel`` over a tuner such as ``LoraModel``) holds the model it wraps
PEFT_PREFIX = "base_model.model."
BUILTIN_RULES = {"q_proj": COL, "k_proj": COL, "v_proj": COL, "o_proj": ROW,
                 "gate_proj": COL, "up_proj": COL, "down_proj": ROW}


def _style(value) -> Optional[str]:
    """"colwise" / "rowwise" for a plan value (a string or a torch ParallelStyle), else None."""
    if isinstance(value, str):
        v = value.lower()
    else:
        v = {"ColwiseParallel": COL, "RowwiseParallel": ROW}.get(type(value).__name__, "")
    if v in (COL, "local_colwise"):
        return COL
    if v in (ROW, "local_rowwise"):
        return ROW
    return None


def _regex(pattern: str) -> "re.Pattern":
    return re.compile("\\.".join("[^.]+" if p == "*" else re.escape(p)
                                 for p in pattern.split(".")))


def resolve_plan(model: nn.Module, tp_plan) -> Dict[str, str]:
    """Qualified module name -> ``"colwise"`` / ``"rowwise"`` for the layers the plan names."""
    if tp_plan is None:
        return {}
    if tp_plan == "auto":
        cfg = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
        if not cfg:
            return {n: BUILTIN_RULES[n.rpartition(".")[2]] for n, _ in model.named_modules()
                    if n.rpartition(".")[2] in BUILTIN_RULES}
        tp_plan = cfg
    if not isinstance(tp_plan, dict):
        raise ValueError(f"tp_plan must be None, 'auto' or a dict of name pattern -> "
                         f"'colwise' / 'rowwise', got {type(tp_plan).__name__}")
    rules = [(_regex(k), _style(v)) for k, v in tp_plan.items()]
    prefix = getattr(model, "base_model_prefix", "") or ""
    out = {}
    for name, _ in model.named_modules():
        names = [name]
        if name.startswith(PEFT_PREFIX):
            names.append(name[len(PEFT_PREFIX):])
        if prefix and names[-1].startswith(prefix + "."):
            names.append(names[-1][len(prefix) + 1:])
        for rx, style in rules:
            if style is not None and any(rx.fullmatch(n) for n in names):
                out[name] = style
                break
    return out


def group_units(styles: Dict[str, str]) -> Dict[str, List[str]]:
    """Parent module name -> its planned children's names, for parents with more than one
    planned child (a unit candidate; :func:`.rotation_unit.unit_problem` judges it). A lone
    planned layer (a ``colwise`` output head) is simply sharded on its own."""
    by_parent: Dict[str, List[str]] = {}
    for name in styles:
        by_parent.setdefault(name.rpartition(".")[0], []).append(name)
    return {parent: kids for parent, kids in by_parent.items() if len(kids) > 1}
