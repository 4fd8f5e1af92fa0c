"""The planner: ``plan.auto`` chooses every unit's strategy under a memory budget (OSDP).

Owns: :mod:`.profile` (what is measured here, cached), :mod:`.cost` (a unit's choices, each
priced by its strategy's handler), :mod:`.search` (the exact knapsack over units),
:mod:`.cluster` (links of a cluster we do not have), :mod:`.explain` (the table) and
:mod:`.auto` (the entry points ``auto``, ``predict``, ``plan_profile``).

May import: ``torch_rsdp.plan``'s strategy layer (``spec``, ``units``, ``strategies``,
``mesh``, ``apply`` to time a unit under a strategy), ``torch_rsdp.rsdp``'s public API and
``torch_rsdp._utils``. Nothing outside this package imports its private names.
"""
from .auto import AutoPlan, auto, default_units, parse_budget, plan_profile, predict
from .cluster import Cluster
from .search import BudgetError

__all__ = ["auto", "predict", "plan_profile", "AutoPlan", "Cluster", "BudgetError",
           "default_units", "parse_budget"]
