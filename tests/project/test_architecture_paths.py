"""docs/architecture.md stays true about where things are: every file and folder it names
exists in the repository.

A name with a slash (``csrc/transport/staging.h``, ``cuda_ipc/``) must be a tracked file or
folder, whole or as the tail of one (the page's file list names folders under their parent's
line); a bare file name (``select.cpp``) must be the name of a tracked file; a glob
(``*_hierarchical.cpp``) must match one. The page's prose names a few things with slashes that
are not paths (``I/O``); they are listed below. Needs no build.
"""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
NOT_PATHS = {"I/O", "send/recv"}
_TOKEN = re.compile(r"\*?[A-Za-z_][\w.\-]*(?:/[\w.\-*]*)+(?:\{[\w,]+\})?"
                    r"|\*?[\w\-]+\.(?:py|cpp|h|cu|def|md|sh)\b")
_BRACES = re.compile(r"^(.*)\{([\w,]+)\}$")


def _expand(tok: str):
    """``dir/name.{h,cpp}`` -> ``dir/name.h``, ``dir/name.cpp``; any other token as it is."""
    m = _BRACES.match(tok)
    return [m.group(1) + alt for alt in m.group(2).split(",")] if m else [tok]


def _tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    dirs = set()
    for f in out:
        d = os.path.dirname(f)
        while d:
            dirs.add(d)
            d = os.path.dirname(d)
    return out, dirs


def missing_paths(text: str, files, dirs):
    names = {os.path.basename(f) for f in files}
    entries = list(files) + sorted(dirs)
    bad = []
    for tok in sorted({t for found in _TOKEN.findall(text) for t in _expand(found)}
                      - NOT_PATHS):
        path = tok.rstrip("/.")
        if "*" in path:
            ok = any(fnmatch.fnmatch(f, "*" + path.lstrip("*")) for f in files)
        elif "/" in tok:
            ok = any(e == path or e.endswith("/" + path) for e in entries)
        else:
            ok = path in names
        if not ok:
            bad.append(tok)
    return bad


def test_every_path_on_the_architecture_page_exists():
    files, dirs = _tracked()
    bad = missing_paths(PAGE.read_text(), files, dirs)
    assert not bad, f"docs/architecture.md names paths that do not exist: {bad}"


def test_a_planted_wrong_path_is_caught():
    files, dirs = _tracked()
    planted = "The C++ unit tests are in `tests/cpp/`, the entry points in `entries_all.cpp`."
    assert missing_paths(planted, files, dirs) == ["entries_all.cpp", "tests/cpp/"]
