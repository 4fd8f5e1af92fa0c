"""The planner: ``plan.auto`` chooses every unit's strategy under a memory budget (OSDP).

Owns: :mod:`.profile` (what is measured here, cached), :mod:`.cost` (a unit's choices, each
priced by its strategy's handler), :mod:`.search` (the exact knapsack over units),
:mod:`.cluster` (links of a cluster we do not have), :mod:`.explain` (the table) and
:mod:`.auto` (the entry points ``auto``, ``predict``, ``plan_profile``).

May import: the rest of ``torch_rsdp.plan`` below its ``__init__``: the strategy layer
(``spec``, ``registry``, ``units``, ``mesh``, ``compression``, ``cost_terms``, ``strategies``
through its ``__all__``) and what a user calls (``apply`` to time a unit or a plan under a
strategy, ``accumulate`` and ``feedback_state`` to train and measure candidates);
``torch_rsdp.rsdp``'s public API, the backend's public modules and the neutral modules
(``torch_rsdp._utils``, ``_grad_sync``...). Nothing outside this package imports its private
names; ``torch_rsdp.plan`` imports the names of ``__all__``.
"""
from .auto import AutoPlan, auto, default_units, parse_budget, plan_profile, predict
from .cluster import Cluster
from .search import BudgetError

__all__ = ["auto", "predict", "plan_profile", "AutoPlan", "Cluster", "BudgetError",
           "default_units", "parse_budget"]
