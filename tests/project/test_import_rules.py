"""The import rules of the package docstrings ("Owns" / "May import"), checked.

An ``ast`` walk over every ``.py`` under ``torch_rsdp/`` (imports at module level, inside
functions and under ``TYPE_CHECKING`` alike; relative imports resolved; ``from pkg import
name`` counts as importing ``pkg.name`` when that is a module) fails when a module

* imports a part of ``torch_rsdp`` its layer may not (``RULES``: upward, or sideways into a
  layer it does not build on);
* imports a private module (a ``_module`` or ``_package`` anywhere in its dotted name) from
  outside the package that holds it: ``torch_rsdp.rsdp._layers`` is for ``torch_rsdp.rsdp``
  alone, ``torch_rsdp._utils`` for all of ``torch_rsdp`` (tests are not checked: they may
  import internals from their private homes);
* imports a private ``_attribute`` of a module from outside that module's public package (a
  private subpackage belongs to the public package above it);
* reaches into a package that offers a public API only (``PUBLIC_API_ONLY``) other than
  through that package's ``__all__``;
* imports part of torch_rsdp inside a function, where a dodged cycle would hide an upward
  import (``LAZY``: the exceptions, each with its reason). Optional dependencies and heavy
  imports of other packages may stay inside functions.

The last two tests plant violations and check that the checker reports them.
"""
from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "torch_rsdp"

# ------------------------------------------------------------------------------------ rules
# The layers, bottom to top. A rule's key is a module or a package (then it covers everything
# below it that has no rule of its own; the longest key wins); its value the parts of
# torch_rsdp the module may import (a package named covers its modules).

#: The backend and its public helpers (torch_rsdp's top-level modules).
BACKEND = {"torch_rsdp._C", "torch_rsdp._extension", "torch_rsdp._registration",
           "torch_rsdp._shrink_world",
           "torch_rsdp._ring", "torch_rsdp._topology", "torch_rsdp._compression",
           "torch_rsdp._comm_memory", "torch_rsdp._cuda", "torch_rsdp._health",
           "torch_rsdp._p2p_ring", "torch_rsdp._derived_topology"}
#: What rsdp and plan may use of the backend: its public modules.
BACKEND_API = {"torch_rsdp._ring", "torch_rsdp._topology", "torch_rsdp._compression"}
#: Neutral ground that ``rsdp`` and ``plan`` both build on (each module's docstring says so).
SHARED = {"torch_rsdp._utils", "torch_rsdp._dtensor_params", "torch_rsdp._grad_sync",
          "torch_rsdp._checkpoint_hooks", "torch_rsdp._apply_guard", "torch_rsdp._materialize",
          "torch_rsdp._host_staging"}
#: plan's bottom: plans as data, the handler registry, units, meshes, mixed precision,
#: compression settings, and the terms handlers price units in.
PLAN_BOTTOM = {"torch_rsdp.plan._spec", "torch_rsdp.plan._registry", "torch_rsdp.plan._ownership",
               "torch_rsdp.plan._mesh", "torch_rsdp.plan._mixed_precision",
               "torch_rsdp.plan._plan_compression", "torch_rsdp.plan._cost_terms"}
#: What a user calls on a planned model (each asks the units' handlers).
PLAN_CALLS = {f"torch_rsdp.plan._{m}" for m in (
    "apply", "accumulate", "checkpoint", "checkpoint_reader", "clip", "feedback_state",
    "optim", "cost_report", "async_stager")}
STRATEGIES = {"torch_rsdp.plan._strategies"}
RSDP = {"torch_rsdp.rsdp"}
RSDP_ROTATION = {"torch_rsdp.rsdp._rotation"}
RSDP_LAYERS = {"torch_rsdp.rsdp._layers"}
RSDP_UNITS = {"torch_rsdp.rsdp._units"}

RULES: Dict[str, Set[str]] = {
    # The backend (and torchft's process group, testing): torch and each other.
    "torch_rsdp": BACKEND | SHARED,
    "torch_rsdp._host_staging": set(),                        # torch only
    "torch_rsdp._utils": {"torch_rsdp._host_staging"},
    "torch_rsdp._dtensor_params": set(),                      # torch only
    "torch_rsdp._checkpoint_hooks": {"torch_rsdp._dtensor_params"},
    "torch_rsdp._grad_sync": {"torch_rsdp._dtensor_params", "torch_rsdp._compression",
                              "torch_rsdp._host_staging"},
    "torch_rsdp._apply_guard": {"torch_rsdp._dtensor_params", "torch_rsdp._materialize"},
    "torch_rsdp._materialize": {"torch_rsdp._dtensor_params", "torch_rsdp._utils",
                                "torch_rsdp._host_staging"},
    # The package's entry point: the backend, and the integrations it installs.
    "torch_rsdp.__init__": BACKEND | SHARED | {"torch_rsdp.integrations"},
    # `python -m torch_rsdp`: the report (the package's __version__, integrations.status())
    # and the self-check (the backend) sit on top of it all; nothing imports them.
    "torch_rsdp.__main__": {"torch_rsdp._env_report", "torch_rsdp._selfcheck"},
    "torch_rsdp._env_report": {"torch_rsdp"},
    # RSDP: the ring primitive, the backend (_C: native ring schedules), the shared modules.
    "torch_rsdp.rsdp": RSDP | BACKEND_API | {"torch_rsdp._C"} | SHARED,
    # rsdp's floors: the ring core (ring order, rotation schedules, flat shards, buffers), the
    # sharded layers on it, the rotation units on both; shard() and the state on top.
    "torch_rsdp.rsdp._rotation": RSDP_ROTATION | BACKEND_API | SHARED,
    "torch_rsdp.rsdp._layers": RSDP_LAYERS | RSDP_ROTATION | {"torch_rsdp._C"} | SHARED,
    "torch_rsdp.rsdp._units": (RSDP_UNITS | RSDP_LAYERS | RSDP_ROTATION | {"torch_rsdp._C"}
                               | SHARED),
    # plan, bottom to top.
    "torch_rsdp.plan._registry": set(),
    "torch_rsdp.plan._spec": {"torch_rsdp.plan._registry"},
    "torch_rsdp.plan._ownership": {"torch_rsdp.plan._spec"},
    "torch_rsdp.plan._mixed_precision": SHARED,
    "torch_rsdp.plan._plan_compression": {"torch_rsdp.plan._spec"},
    "torch_rsdp.plan._mesh": {"torch_rsdp.plan._plan_compression"} | BACKEND_API,
    "torch_rsdp.plan._cost_terms": BACKEND_API,
    "torch_rsdp.plan._strategies": PLAN_BOTTOM | STRATEGIES | RSDP | BACKEND_API | SHARED,
    **{m: PLAN_BOTTOM | STRATEGIES | PLAN_CALLS | RSDP | BACKEND_API | SHARED
       for m in PLAN_CALLS},
    "torch_rsdp.plan._planner": ({"torch_rsdp.plan._planner"} | PLAN_BOTTOM | STRATEGIES
                                | PLAN_CALLS | RSDP | BACKEND_API | SHARED),
    # The user-facing names: all of plan.
    "torch_rsdp.plan": {"torch_rsdp.plan"} | RSDP | BACKEND_API | SHARED,
    # The top: patches of the stock trainers over what rsdp and plan shard.
    "torch_rsdp.integrations": ({"torch_rsdp.integrations", "torch_rsdp.plan"} | RSDP
                                | BACKEND_API | SHARED),
}


#: Packages the rest of torch_rsdp uses through their ``__all__`` only.
PUBLIC_API_ONLY = {"torch_rsdp.rsdp", "torch_rsdp.plan", "torch_rsdp.integrations",
                   "torch_rsdp.plan._strategies", "torch_rsdp.plan._planner"}

#: (importing module, imported module) pairs of torch_rsdp that may be imported inside a
#: function, with the reason.
_LIGHT_IMPORT = "``import torch_rsdp`` installs the integrations and must not load rsdp or plan"
LAZY: Dict[Tuple[str, str], str] = {
    ("torch_rsdp.integrations._sharded", "torch_rsdp.plan"): _LIGHT_IMPORT,
    ("torch_rsdp.integrations._lightning_strategy", "torch_rsdp.plan"): _LIGHT_IMPORT,
    ("torch_rsdp.integrations._lightning_strategy", "torch_rsdp.rsdp"): _LIGHT_IMPORT,
}


# ---------------------------------------------------------------------------------- checker
def _covers(key: str, module: str) -> bool:
    return module == key or module.startswith(key + ".")


def rule_for(module: str, rules: Dict[str, Set[str]] = RULES) -> Tuple[str, Set[str]]:
    key = max((k for k in rules if _covers(k, module)), key=len)
    return key, rules[key]


#: Compiled modules (absent from a source tree that was not built).
_EXTENSIONS = {"torch_rsdp._C"}


def _is_module(root: Path, dotted: str) -> bool:
    p = root.joinpath(*dotted.split("."))
    return (p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()
            or any(p.parent.glob(p.name + ".*.so")) or dotted in _EXTENSIONS)


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _owner(module: str, root: Path) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return module if (root.joinpath(*module.split(".")) / "__init__.py").is_file() \
        else module.rpartition(".")[0]


def _exports(root: Path, package: str) -> Set[str]:
    """The names in a package's ``__all__``."""
    path = root.joinpath(*package.split(".")) / "__init__.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[Tuple[ast.AST, bool]]:
    """Every node below ``node``, and whether it lies inside a function."""
    for child in ast.iter_child_nodes(node):
        yield child, in_function
        yield from _walk(child, in_function or isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def imports_of(source: str, module: str, is_package: bool, root: Path
               ) -> Iterator[Tuple[int, str, Optional[str], bool]]:
    """(line, imported torch_rsdp module, the name taken from it or None, inside a function)
    for every import of ``source``, the source of ``module``."""
    package = _package_of(module, is_package)
    for node, in_function in _walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _covers(PACKAGE, a.name):
                    yield node.lineno, a.name, None, in_function
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not _covers(PACKAGE, target):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                # a package's export shadows its submodule of the same name (planner.auto)
                exported = ((root.joinpath(*target.split(".")) / "__init__.py").is_file()
                            and a.name in _exports(root, target))
                if a.name != "*" and not exported and _is_module(root, sub):
                    yield node.lineno, sub, None, in_function
                else:
                    yield node.lineno, target, a.name, in_function


def _private_part(module: str) -> Optional[str]:
    """The outermost private module or package of a dotted name (``torch_rsdp.rsdp._layers``
    of ``torch_rsdp.rsdp._layers.shard_state``), or None."""
    parts = module.split(".")
    for i, p in enumerate(parts[1:], 1):
        if p.startswith("_") and not p.startswith("__"):
            return ".".join(parts[:i + 1])
    return None


def _public_package(package: str) -> str:
    """The public package a package belongs to: itself, or the one above its private part."""
    private = _private_part(package)
    return private.rpartition(".")[0] if private else package


def check_source(source: str, module: str, is_package: bool, root: Path = ROOT,
                 where: str = "", rules: Dict[str, Set[str]] = RULES) -> List[str]:
    """Every rule ``source`` (the source of ``module``) breaks, one line each."""
    where = where or module
    # the top package's __init__ has a rule of its own (its key would cover every module)
    key, allowed = rule_for(module + ".__init__" if module == PACKAGE else module, rules)
    own_package = _package_of(module, is_package)
    out = []
    for line, target, name, in_function in imports_of(source, module, is_package, root):
        at = f"{where}:{line}: imports {target}" + (f".{name}" if name else "")
        if in_function and (module, target) not in LAZY:
            out.append(f"{at}: inside a function (import it at module level; a cycle that "
                       f"forbids it is an upward import)")
        if target != module and not any(_covers(a, target) for a in allowed):
            out.append(f"{at}: upward or across layers ({key} may import "
                       f"{', '.join(sorted(allowed)) or 'nothing of torch_rsdp'})")
        private = _private_part(target)
        if private and not _covers(private.rpartition(".")[0], module):
            out.append(f"{at}: private module {private} from outside its package "
                       f"({private.rpartition('.')[0]})")
        if name and name.startswith("_") and not name.startswith("__"):
            owner = _public_package(_owner(target, root))
            if owner != _public_package(own_package):  # a shared module's own private
                out.append(f"{at}: private name {name} of another package ({owner})")
        for api in PUBLIC_API_ONLY:
            if _covers(api, own_package) or not _covers(api, target):
                continue
            if target != api:
                out.append(f"{at}: {api} is used through its public API only (import from "
                           f"{api}, a name of its __all__)")
            elif name is not None and name not in _exports(root, api):
                out.append(f"{at}: {name} is not in {api}.__all__ (its public API)")
    return out


def check_tree(root: Path = ROOT, rules: Dict[str, Set[str]] = RULES) -> List[str]:
    out = []
    for dirpath, _, files in os.walk(root / PACKAGE):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = Path(dirpath) / f
            rel = path.relative_to(root)
            is_package = f == "__init__.py"
            parts = list(rel.with_suffix("").parts)
            module = ".".join(parts[:-1] if is_package else parts)
            out += check_source(path.read_text(), module, is_package, root, str(rel), rules)
    return sorted(out)


# ------------------------------------------------------------------------------------ tests
def test_every_module_has_a_rule():
    for dirpath, _, files in os.walk(ROOT / PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = (Path(dirpath) / f).relative_to(ROOT).with_suffix("")
                assert rule_for(".".join(rel.parts))


def test_imports_follow_the_layers():
    problems = check_tree()
    assert not problems, "import rules broken:\n" + "\n".join(problems)


def test_checker_reports_a_planted_upward_import(tmp_path):
    """A copy of the package with one upward import planted fails with the file, the line, the
    module and the rule: inside a function (as cycles are dodged), and at module level."""
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert check_tree(tmp_path) == []
    victim = tmp_path / PACKAGE / "plan" / "_strategies" / "rotate.py"
    text = victim.read_text()
    victim.write_text(text + "\n\ndef _planted():\n    from .._apply import plan_state\n")
    line = text.count("\n") + 4
    problems = check_tree(tmp_path)
    at = f"torch_rsdp/plan/_strategies/rotate.py:{line}: imports torch_rsdp.plan._apply.plan_state"
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{at}: inside a function"), problems
    assert problems[1].startswith(f"{at}: upward"), problems
    victim.write_text(text + "\nfrom .._apply import plan_state\n")  # at module level
    problems = check_tree(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(
        f"torch_rsdp/plan/_strategies/rotate.py:{line - 2}: imports "
        f"torch_rsdp.plan._apply.plan_state: upward or across layers "
        f"(torch_rsdp.plan._strategies may import "), problems


def test_checker_reports_private_and_non_public_imports():
    as_strategy = "torch_rsdp.plan._strategies.x"
    found = check_source("import torch_rsdp.plan\n", as_strategy, False)
    assert len(found) == 1 and "upward" in found[0]
    found = check_source("from .._planner.profile import _clone_inputs\n", as_strategy, False)
    assert any("upward" in p for p in found) and any("public API only" in p for p in found)
    found = check_source("from ..._utils import _helper\n", as_strategy, False)
    assert len(found) == 1 and "private name _helper" in found[0], found
    found = check_source("from ...rsdp import _C\n", as_strategy, False)
    assert found, found
    found = check_source("from ...rsdp import Ring, _no_such_name\n", as_strategy, False)
    assert len(found) == 3 and "Ring is not in torch_rsdp.rsdp.__all__" in found[0], found
    found = check_source("from torch_rsdp.plan import apply\n", "torch_rsdp.rsdp._shard", False)
    assert found and "torch_rsdp.rsdp may import" in found[0], found
    assert check_source("from .base import Cost\nfrom ...rsdp import shard\n"
                        "from ..._utils import swap_class\n", as_strategy, False) == []


def test_checker_reports_a_private_module_imported_from_outside_its_package():
    """A private module or package is for the package that holds it: rsdp's ring core for
    rsdp, plan's handlers for plan, torch_rsdp's shared modules for all of torch_rsdp."""
    as_strategy = "torch_rsdp.plan._strategies.x"
    found = check_source("from ...rsdp._rotation.flat_shard import chunk_sizes\n", as_strategy,
                         False)
    assert any("private module torch_rsdp.rsdp._rotation from outside its package "
               "(torch_rsdp.rsdp)" in p for p in found), found
    found = check_source("from torch_rsdp.plan._apply import plan_state\n",
                         "torch_rsdp.integrations._sharded", False)
    assert any("private module torch_rsdp.plan._apply from outside its package "
               "(torch_rsdp.plan)" in p for p in found), found
    found = check_source("from .integrations._patching import apply_rows\n", "torch_rsdp",
                         True)
    assert any("private module torch_rsdp.integrations._patching" in p for p in found), found
    # inside its package (however deep), and the shared bottom modules, are fine
    assert check_source("from .._layers.shard_state import ShardState\n",
                        "torch_rsdp.rsdp._units.x", False) == []
    assert check_source("from ..._dtensor_params import local\n",
                        "torch_rsdp.rsdp._units.x", False) == []
    # and a floor of rsdp may not reach up: the ring core below the layers
    found = check_source("from .._layers.shard_state import ShardState\n",
                         "torch_rsdp.rsdp._rotation.x", False)
    assert found and "upward" in found[0], found
