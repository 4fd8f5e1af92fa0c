"""docs/configuration.md stays the whole, short truth about the environment.

The page has two tables: the user's settings, and, in a section of its own ("For the project's
own tests and scripts (not for users)"), the test hooks and script knobs. Checked here, without
a build:

* every ``RSDP_*`` variable the code reads (the C++ backend, the Python package, the tests'
  support code, setup.py and the scripts) is documented, in the user table or in the project's
  section, and every documented one is still read somewhere;
* the user table holds at most 15 ``RSDP_*`` variables (``RSDP_ALGO_<OP>`` is one family row),
  none of them named ``RSDP_TEST_*``;
* the backend's test hooks are named ``RSDP_TEST_*`` and read only in csrc/core/test_hooks.cpp.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
PROJECT_HEADING = "## For the project's own tests and scripts (not for users)"
MAX_USER_VARIABLES = 15
# Names the code reads that are no configuration: made up by a test for the launcher to pass on.
NOT_VARIABLES = {"RSDP_X"}  # tests/support/test_harness.py

_NAME = re.compile(r"(?<![A-Z0-9_])RSDP_[A-Z0-9_]*[A-Z0-9](?:_<OP>)?")
# A read: a C++ env("...")/getenv("..."), Python's os.environ / env.get("..."), a shell ${...}.
_CPP_READ = re.compile(r"\b(?:env|getenv)\(\s*\"(RSDP_[A-Z0-9_]+)\"")
_PY_READ = re.compile(r"(?:environ|env)(?:\.get\(|\[)\s*[\"'](RSDP_[A-Z0-9_]+)[\"']|"
                      r"^[A-Z_]+\s*=\s*[\"'](RSDP_[A-Z0-9_]+)[\"']", re.M)
_SH_READ = re.compile(r"\$\{(RSDP_[A-Z0-9_]+)")


def _sections():
    text = PAGE.read_text()
    assert PROJECT_HEADING in text, f"{PAGE.name} has no section {PROJECT_HEADING!r}"
    user, project = text.split(PROJECT_HEADING, 1)
    return user, project


def _table_names(section: str):
    """The variables a section's table rows document (their first column)."""
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(_NAME.findall(line.split(" | ", 1)[0]))
    return names


def _tracked(*patterns):
    """The files of the working tree git does not ignore that match `patterns`."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--",
                          *patterns], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file()]


def _reads():
    """{variable: [files reading it]} over the code that reads the environment."""
    found = {}
    for path in _tracked("csrc/*.cpp", "csrc/*.h", "csrc/*.cu"):
        for name in _CPP_READ.findall(path.read_text(errors="replace")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    for path in _tracked("torch_rsdp/*.py", "tests/*.py", "setup.py"):
        for groups in _PY_READ.findall(path.read_text(errors="replace")):
            for name in filter(None, groups):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    for path in _tracked("scripts/*.sh"):
        for name in _SH_READ.findall(path.read_text(errors="replace")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _documented(name: str, names) -> bool:
    return name in names or (name.startswith("RSDP_ALGO_") and "RSDP_ALGO_<OP>" in names)


def test_every_variable_read_is_documented():
    user, project = _sections()
    names = _table_names(user) | _table_names(project)
    missing = {n: files for n, files in _reads().items()
               if not _documented(n, names) and n not in NOT_VARIABLES}
    assert not missing, f"read but not in {PAGE.name}: {missing}"


def test_every_documented_variable_is_read():
    user, project = _sections()
    reads = _reads()
    # RSDP_ALGO_<OP> is read under names built from the op table (algo_env_var).
    stale = sorted(n for n in _table_names(user) | _table_names(project)
                   if n not in reads and n != "RSDP_ALGO_<OP>")
    assert not stale, f"documented in {PAGE.name} but read nowhere: {stale}"


def test_the_user_table_is_short_and_holds_no_test_hook():
    user, project = _sections()
    names = _table_names(user)
    assert len(names) <= MAX_USER_VARIABLES, (len(names), sorted(names))
    hooks = sorted(n for n in names if n.startswith("RSDP_TEST_"))
    assert not hooks, f"test hooks among the user's settings: {hooks}"
    assert not names & _table_names(project), "a variable in both tables"


def test_the_backend_reads_its_test_hooks_in_one_place():
    elsewhere = {}
    for path in _tracked("csrc/*.cpp", "csrc/*.h", "csrc/*.cu"):
        rel = str(path.relative_to(ROOT))
        for name in _CPP_READ.findall(path.read_text(errors="replace")):
            if name.startswith("RSDP_TEST_") and rel != "csrc/core/test_hooks.cpp":
                elsewhere.setdefault(name, []).append(rel)
    assert not elsewhere, f"test hooks read outside csrc/core/test_hooks.cpp: {elsewhere}"
