"""The public API is what ``docs/api.md`` lists, and users' code needs nothing else.

* The page's tables and the public modules' ``__all__`` name the same names, and each name's
  link is the file that defines it (its docstring is the reference).
* Every example (``examples/*.py``) and every Python block of the README and ``docs/*.md``
  imports only public modules of ``torch_rsdp`` and uses only names of their ``__all__``
  (``from torch_rsdp.plan import apply``, ``plan.apply(...)`` and ``torch_rsdp.rsdp.shard``
  alike). Tests and benchmarks may reach internals; the rest of the package may not
  (``test_import_rules.py``).

Reads sources only (``ast``); needs no build. The last tests plant violations.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"

#: The public modules (dotted name -> source file): those ``docs/api.md`` has a section for.
PUBLIC = {
    "torch_rsdp": "torch_rsdp/__init__.py",
    "torch_rsdp.rsdp": "torch_rsdp/rsdp/__init__.py",
    "torch_rsdp.plan": "torch_rsdp/plan/__init__.py",
    "torch_rsdp.integrations": "torch_rsdp/integrations/__init__.py",
    "torch_rsdp.torchft": "torch_rsdp/torchft.py",
}
#: Public for tests and benchmarks, not part of the API a user learns.
TESTING = {"torch_rsdp.testing", "torch_rsdp.testing.netns"}


def exports(root: Path = ROOT) -> Dict[str, Set[str]]:
    """Each public module's ``__all__``, read from its source."""
    out = {}
    for module, path in PUBLIC.items():
        for node in ast.parse((root / path).read_text()).body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                out[module] = set(ast.literal_eval(node.value))
    return out


_SECTION = re.compile(r"^## `([\w.]+)`", re.M)
_ROW = re.compile(r"^\| \[`(\w+)`\]\(\.\./([\w/.]+)\) \| (.+) \|$", re.M)


def page_names(text: str) -> Dict[str, Dict[str, str]]:
    """module -> {name: linked file} from the page's sections and table rows."""
    out: Dict[str, Dict[str, str]] = {}
    parts = _SECTION.split(text)
    for module, body in zip(parts[1::2], parts[2::2]):
        out[module] = {name: path for name, path, _ in _ROW.findall(body)}
    return out


def defines(source: str, name: str) -> bool:
    """Whether a module's source defines ``name``: a function or class (at any depth: Lightning's
    strategy class is built when Lightning is there), or a top-level assignment."""
    tree = ast.parse(source)
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
           and n.name == name for n in ast.walk(tree)):
        return True
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def page_problems(text: str, root: Path = ROOT) -> List[str]:
    found, want = page_names(text), exports(root)
    out = []
    for module in sorted(set(found) | set(want)):
        listed, exported = set(found.get(module, {})), want.get(module, set())
        out += [f"{module}.{n}: in __all__, not on the page" for n in sorted(exported - listed)]
        out += [f"{module}.{n}: on the page, not in __all__" for n in sorted(listed - exported)]
        for name, path in found.get(module, {}).items():
            file = root / path
            if not file.is_file() or not defines(file.read_text(), name):
                out.append(f"{module}.{name}: its link {path} does not define it")
    total = sum(len(v) for m, v in want.items() if m != "torch_rsdp.torchft")
    if f"{total} names:" not in text:
        out.append(f"the page's count is not the {total} names of __all__")
    return out


def non_public_uses(source: str, where: str, public: Dict[str, Set[str]]) -> List[str]:
    """Every use in ``source`` of a torch_rsdp module or name outside the public API."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a fragment or a shell block: nothing to check
    modules = set(public) | TESTING
    out, alias = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] != "torch_rsdp":
                    continue
                if a.name not in modules:
                    out.append(f"{where}:{node.lineno}: import {a.name} (not a public module)")
                alias[a.asname or a.name] = a.name
                if not a.asname:  # ``import torch_rsdp.plan`` binds torch_rsdp
                    alias["torch_rsdp"] = "torch_rsdp"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == \
                "torch_rsdp":
            if node.module not in modules:
                out.append(f"{where}:{node.lineno}: from {node.module} (not a public module)")
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in modules:
                    alias[a.asname or a.name] = sub
                elif node.module in public and a.name not in public[node.module]:
                    out.append(f"{where}:{node.lineno}: {sub} (not in {node.module}.__all__)")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, n = [], node
        while isinstance(n, ast.Attribute):
            chain.append(n.attr)
            n = n.value
        if not isinstance(n, ast.Name) or n.id not in alias:
            continue
        chain.reverse()
        module, rest = alias[n.id], chain
        while rest and f"{module}.{rest[0]}" in modules:
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if rest and module in public and rest[0] not in public[module] \
                and not rest[0].startswith("__"):
            out.append(f"{where}:{node.lineno}: {module}.{rest[0]} (not in {module}.__all__)")
    return sorted(set(out))


def user_code(root: Path = ROOT):
    """(where, source) of every example and every Python block of the docs."""
    for f in sorted((root / "examples").glob("*.py")):
        yield str(f.relative_to(root)), f.read_text()
    for f in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read_text(), re.M | re.S)
        for i, block in enumerate(blocks):
            yield f"{f.relative_to(root)} (python block {i + 1})", block


# ------------------------------------------------------------------------------------ tests
def test_the_page_lists_exactly_the_public_names():
    problems = page_problems(PAGE.read_text())
    assert not problems, "docs/api.md and __all__ disagree:\n" + "\n".join(problems)


def test_examples_and_doc_snippets_use_the_public_api_only():
    public = exports()
    problems = [p for where, src in user_code() for p in non_public_uses(src, where, public)]
    assert not problems, "non-public uses:\n" + "\n".join(problems)
    assert sum(1 for _ in user_code()) > 20  # the scan saw the examples and the docs' blocks


def test_planted_page_errors_are_caught():
    text = PAGE.read_text()
    row = "| [`shard`](../torch_rsdp/rsdp/_shard.py) |"
    assert row in text
    problems = page_problems(text.replace(row, "| [`shard`](../torch_rsdp/rsdp/_state.py) |"))
    assert problems == ["torch_rsdp.rsdp.shard: its link torch_rsdp/rsdp/_state.py does not "
                        "define it"], problems
    dropped = "\n".join(l for l in text.splitlines() if not l.startswith(row))
    assert page_problems(dropped) == ["torch_rsdp.rsdp.shard: in __all__, not on the page"]


def test_planted_non_public_uses_are_caught():
    public = exports()
    snippet = ("import torch_rsdp.rsdp as rsdp\n"
               "from torch_rsdp import plan\n"
               "from torch_rsdp.rsdp._layers.sharded_linear import RSDPLinear\n"
               "from torch_rsdp.plan import apply, resolve\n"
               "import torch_rsdp.plan._planner\n"
               "model = rsdp.shard(model)\n"
               "ring = rsdp.rsdp_state(model).ring\n"    # an attribute of a public object
               "x = rsdp.local_shard_of(model, 'w', w)\n"
               "p = plan.auto(model, example)\n"
               "torch_rsdp.plan.parse_strategy('rotate')\n")
    found = non_public_uses(snippet, "s", public)
    assert found == [
        "s:10: torch_rsdp.plan.parse_strategy (not in torch_rsdp.plan.__all__)",
        "s:3: from torch_rsdp.rsdp._layers.sharded_linear (not a public module)",
        "s:4: torch_rsdp.plan.resolve (not in torch_rsdp.plan.__all__)",
        "s:5: import torch_rsdp.plan._planner (not a public module)",
        "s:8: torch_rsdp.rsdp.local_shard_of (not in torch_rsdp.rsdp.__all__)",
    ], found
