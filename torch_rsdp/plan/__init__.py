"""Per-module sharding strategies, mixed freely in one model.

    import torch_rsdp.plan as plan
    model = plan.apply(model, {"model.embed_tokens": "rotate",
                               "model.layers.*": "full_shard",
                               "model.layers.3.mlp": "split:4",
                               "lm_head": "no_shard"})
    opt = plan.make_optimizer(model, torch.optim.AdamW, lr=1e-4)  # or any torch.optim over
                                                                  # model.parameters()

Strategies (names follow FSDP's ``ShardingStrategy``, lower case):

* ``no_shard``: replicated parameters, gradients averaged by bucketed all-reduces overlapped
  with backward (DDP);
* ``shard_optim``: as ``no_shard``, optimizer state sharded (ZeRO-1, via :func:`make_optimizer`);
* ``full_shard`` / ``shard_grad_op``: torch's FSDP2 ``fully_shard`` with
  ``reshard_after_forward=True`` / ``False`` (ZeRO-3 / ZeRO-2);
* ``hybrid_shard``: FSDP2 on a (replicate = nodes, shard = ranks of a node) mesh;
* ``rotate``: RSDP (:mod:`torch_rsdp.rsdp`), shards rotating around the ring;
* ``split:k``: OSDP's operator splitting, each Linear computed in ``k`` gathered slices.

:func:`no_sync` accumulates gradients over micro-batches for every strategy;
:func:`full_state_dict` / :func:`load_full_state_dict` move checkpoints between plans, and
``torch.distributed.checkpoint`` (``get_state_dict`` / ``set_state_dict``, ``dcp.save`` /
``dcp.load``) saves each rank's shards and reshards them on load under any plan and world size
(:mod:`torch_rsdp._checkpoint_hooks`; :class:`CheckpointReader` checks a checkpoint's files
first);
:func:`report` shows what each unit costs on this rank. A unit may send its cross-node
traffic quantised (``"full_shard+int8"``; ``apply(..., compression=)`` for the whole model,
:mod:`._plan_compression`); :func:`feedback_state_dict` checkpoints its error feedback.

:func:`auto` chooses the strategies itself: the fastest plan whose predicted peak memory per
rank fits a budget, from costs measured here (or for a :class:`Cluster` we do not have).

The public API is ``__all__``; everything else is private and may change. Layout (what each
part owns; imports point downwards only, ``tests/project/test_import_rules.py`` checks it):

* the user-facing names, here;
* ``_planner/``: ``auto`` and its profile, cost model, search, ``Cluster`` and explanation
  (it applies and trains candidate plans, so it builds on the layer below);
* ``_apply``, ``_accumulate``, ``_checkpoint``, ``_checkpoint_reader``, ``_clip``,
  ``_feedback_state``, ``_optim``, ``_cost_report``, ``_async_stager``: what a user calls on a
  planned model; each loops over units and asks each unit's strategy handler;
* ``_strategies/``: one handler per strategy family, the code that knows how a strategy
  works (the planner's cost model and ``_feedback_state`` name strategies too, as kinds to
  price and to find error feedback in);
* ``_spec`` (plans as data), ``_registry`` (the strategy names and their handlers, against
  which ``_spec`` checks names), ``_ownership`` (which unit owns which parameter), ``_mesh``,
  ``_mixed_precision``, ``_plan_compression`` (settings), ``_cost_terms`` (``UnitProfile``,
  ``Links``, ``Cost``: what the handlers price and the planner reads): what the handlers
  build on.

May import ``torch_rsdp.rsdp`` through its public API only, the backend's modules
(``torch_rsdp._compression``, ``_topology``, ``_ring``) and the neutral modules
``torch_rsdp._utils``, ``_dtensor_params``, ``_grad_sync``, ``_checkpoint_hooks``; nothing
below imports this package.
"""
from ._accumulate import no_sync
from ._apply import apply, plan_state
from ._checkpoint import full_state_dict, load_full_state_dict
from ._checkpoint_reader import CheckpointReader
from ._clip import clip_grad_norm_, grad_norm
from ._feedback_state import feedback_state_dict, set_feedback_state_dict
from ._optim import make_optimizer
from ._planner import AutoPlan, BudgetError, Cluster, auto, predict
from ._cost_report import report
from ._spec import Plan
from ._async_stager import CopyOnceStager
from ._strategies import STRATEGIES

__all__ = [
    "apply",
    "auto",
    "predict",
    "AutoPlan",
    "Cluster",
    "BudgetError",
    "Plan",
    "STRATEGIES",
    "make_optimizer",
    "no_sync",
    "full_state_dict",
    "load_full_state_dict",
    "clip_grad_norm_",
    "grad_norm",
    "CheckpointReader",
    "CopyOnceStager",
    "feedback_state_dict",
    "set_feedback_state_dict",
    "report",
    "plan_state",
]
