"""The documentation holds together: every relative Markdown link in the repository resolves,
and the README stays a front door (at most 12,000 characters).

A link ``[text](path)`` must name an existing file or directory, relative to the page that
holds it; ``[text](path#anchor)`` into a Markdown file must also name one of its headings by
GitHub's slug, and a bare ``[text](#anchor)`` one of its own page's. Web and mail links are not
followed. Runs in a fraction of a second; needs no build.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT = 12_000

# Directories that hold no documentation of this project (build outputs, vendored code).
SKIP_DIRS = {".git", "build", "dist", "vendor", "third_party", "node_modules", ".eggs",
             "__pycache__", ".pytest_cache", ".hypothesis", ".venv", "venv", ".whl", ".gl"}
# Generated output (ignored by git): result tables the benchmarks and examples write.
SKIP_PATHS = {"benchmarks/results", "examples/results"}

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) or [text](target "title"); images ![alt](target) too. The text may hold
# backquoted code and nested brackets one level deep.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")


def markdown_files() -> List[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = Path(dirpath).relative_to(ROOT)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.endswith(".egg-info")
                             and (rel / d).as_posix() not in SKIP_PATHS)
        out += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".md")]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _lines_outside_code(path: Path) -> List[Tuple[int, str]]:
    lines, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, line))
    return lines


_anchor_cache: Dict[Path, Set[str]] = {}


def anchors(path: Path) -> Set[str]:
    if path not in _anchor_cache:
        seen: Dict[str, int] = {}
        found = set()
        for _, line in _lines_outside_code(path):
            m = _HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links(path: Path) -> List[Tuple[int, str]]:
    out = []
    for n, line in _lines_outside_code(path):
        for m in _LINK.finditer(_INLINE_CODE.sub("", line)):
            out.append((n, m.group(1)))
    return out


def broken_links(path: Path) -> List[str]:
    problems = []
    for n, target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        where = f"{path.relative_to(ROOT)}:{n}: ({target})"
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        if file_part and not dest.exists():
            problems.append(f"{where}: no such file {file_part}")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def test_markdown_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert "README.md" in names and "docs/README.md" in names, sorted(names)


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_door():
    size = len((ROOT / "README.md").read_bytes())  # bytes, as `wc -c` counts: >= characters
    assert size <= README_LIMIT, (
        f"README.md has {size} bytes, more than {README_LIMIT}: move the detail "
        f"to a page under docs/ and link to it")


def test_slug_matches_github():
    assert slug("Open MPI as a peer (`--peers mpi`)") == "open-mpi-as-a-peer---peers-mpi"
    assert slug("RSDP against FSDP2: `bench_rsdp_fsdp2.py`") == \
        "rsdp-against-fsdp2-bench_rsdp_fsdp2py"
    assert slug("Choosing the plan: `plan.auto`") == "choosing-the-plan-planauto"


def test_nothing_cites_a_design_document_outside_the_repository():
    """docs/architecture.md is the project's design document: code, tests and docs cite it (or
    the page that says the thing), never a document a reader of the repository does not have."""
    import subprocess
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    cited = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".h", ".cpp", ".cu", ".md", ".sh", ".txt", ".def"}:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "DESIGN" + ".md" in line:
                cited.append(f"{name}:{n}: {line.strip()[:120]}")
    assert not cited, "cites a document the repository does not have:\n" + "\n".join(cited)
