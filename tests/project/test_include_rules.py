"""The C++ layers of docs/architecture.md, as a test: every ``#include "dir/..."`` of a file in
``csrc/<layer>/`` names its own layer or one the table below allows, so dependencies point
downwards. The Python side has the same in test_import_rules.py. Needs no build.

    core        errors, options, dtypes, kernels (no torch headers)
    cuda        device kernels, completion flags (no torch headers)
    patterns    index arithmetic
    transport   shm, ucx, cuda_ipc, emu, nccl
    primitives  ring_shift
    algorithms  the collectives
    rotation    RSDP's Linear schedules (ATen; the ring hops come in as RingHops)
    backend     the c10d glue
    bindings    the Python module: the top, nothing includes it
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
_LOW = ["core", "cuda", "patterns", "transport", "primitives", "algorithms"]
ALLOWED: Dict[str, set] = {
    "core": set(),
    "cuda": {"core"},
    "patterns": {"core"},
    "transport": {"core", "cuda", "patterns"},
    "primitives": {"core", "patterns", "transport"},
    "algorithms": set(_LOW) - {"algorithms"},
    "rotation": {"core"},
    "backend": set(_LOW),
    "bindings": set(_LOW) | {"rotation", "backend"},
}
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources() -> Dict[str, str]:
    """csrc-relative path -> text, for every C++/CUDA source and header."""
    return {str(p.relative_to(CSRC)): p.read_text()
            for p in sorted(CSRC.rglob("*")) if p.suffix in (".h", ".cpp", ".cu", ".cuh", ".def")}


def violations(files: Dict[str, str]) -> List[str]:
    out = []
    for path, text in files.items():
        layer = path.split("/")[0]
        if layer not in ALLOWED:
            out.append(f"csrc/{path}: layer '{layer}' is not in the table")
            continue
        for m in _INCLUDE.finditer(text):
            target = m.group(1)
            other = target.split("/")[0]
            if "/" not in target or other == layer:
                continue
            if other not in ALLOWED:
                continue  # not ours (a vendored or system header named with a slash)
            if other not in ALLOWED[layer]:
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"csrc/{path}:{line}: {layer} includes {target} "
                           f"({other} is not below {layer})")
    return out


def test_csrc_includes_point_downwards():
    bad = violations(sources())
    assert not bad, "C++ include rules broken:\n" + "\n".join(bad)


def test_the_table_covers_every_layer():
    layers = {p.name for p in CSRC.iterdir() if p.is_dir()}
    assert layers == set(ALLOWED), layers ^ set(ALLOWED)


def test_planted_violations_are_caught():
    files = sources()
    files["core/options.cpp"] += '\n#include "algorithms/algorithm_table.h"\n'
    files["rotation/linear_schedule.cpp"] += '\n#include "backend/backend_rsdp.h"\n'
    files["backend/backend_rsdp.cpp"] += '\n#include "bindings/bindings.cpp"\n'
    bad = violations(files)
    assert len(bad) == 3, bad
    assert any(b.startswith("csrc/core/options.cpp:") and "algorithms/algorithm_table.h" in b
               for b in bad), bad
    assert any("rotation includes backend/backend_rsdp.h" in b for b in bad), bad
    assert any("backend includes bindings/bindings.cpp" in b for b in bad), bad
