"""Shared pytest setup for the torch_rsdp test-suite.

- tests/ is on sys.path, in spawned workers too (spawn copies sys.path): the helpers import as
  ``support.<module>`` and the test modules as ``<area>.<module>`` (``backend.test_faults``),
  the names under which the harness pickles their worker functions. tests/cuda/ has no
  ``__init__.py`` (a package ``cuda`` would hide cuda-python's ``cuda.bindings``, which torch
  imports): its modules import by their own names (``test_cuda``).
- When torch_rsdp is not installed (pip install -e), fall back to the source tree so that an
  in-place build (python setup.py build_ext --inplace) is found from any working directory.
- The backend under test is chosen with RSDP_TEST_BACKEND (default "rsdp"; "gloo" validates
  the tests themselves).
- ``nodes``: emulated nodes (network namespaces) for a multi-node test module.
- Every test fails if a process it started outlives it (support/leftovers.py); the process is
  killed.
"""

import importlib.util
import os
import sys
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

if HERE not in sys.path:
    sys.path.insert(0, HERE)
if importlib.util.find_spec("torch_rsdp") is None and ROOT not in sys.path:
    sys.path.append(ROOT)


def pytest_report_header(config):
    from support.harness import backend_under_test

    return [f"torch_rsdp tests: backend under test = {backend_under_test()!r} "
            f"(set RSDP_TEST_BACKEND=gloo to validate the tests against gloo)"]


def _say(request, text: str) -> None:
    """A line in pytest's output even when output is captured (which mode ran)."""
    tr = request.config.pluginmanager.getplugin("terminalreporter")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if tr is not None and capman is not None:
        with capman.global_and_fixture_disabled():
            tr.write_line(f"[{request.module.__name__}] {text}")
    print(text)


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    """Fails the test for any process it started that is still running a few seconds after it
    ended (support/leftovers.py); those are killed."""
    from support import leftovers

    leftovers.install()
    start = leftovers.now() - 1  # the clock's tick: a process started in it counts
    yield
    left = leftovers.reap(start)
    assert not left, (f"{request.node.nodeid} left {len(left)} process(es) running (killed): "
                      + "; ".join(f"pid {p}: {cmd}" for p, cmd in left.items()))


@pytest.fixture(scope="module")
def nodes(request):
    """Three emulated nodes for the whole module (2-node topologies use nodes 0 and 1);
    None in loopback mode (no permission for namespaces, or RSDP_TEST_LOOPBACK_NODES=1), where
    ranks share the loopback and RSDP_NODE_ID tells the nodes apart. Removed at the end even
    when tests failed."""
    from torch_rsdp.testing import netns

    stale = netns.cleanup_stale()
    if stale:
        _say(request, f"removed leftovers of an earlier crashed run: {stale}")
    forced = os.environ.get("RSDP_TEST_LOOPBACK_NODES", "") not in ("", "0")
    if forced or not netns.namespaces_available():
        why = ("RSDP_TEST_LOOPBACK_NODES is set" if forced else
               "network namespaces cannot be created here (needs root and iproute2)")
        msg = (f"{why}: the multi-node tests run with all ranks on the loopback, told apart "
               f"by RSDP_NODE_ID; no network link between the nodes is emulated")
        _say(request, f"multi-node mode: RSDP_NODE_ID loopback ({msg})")
        warnings.warn(msg)
        yield None
        return
    with netns.EmulatedNodes(3) as en:
        _say(request, f"multi-node mode: network namespaces ({en.describe()})")
        yield en
    left = [n for n in netns.leftovers() if netns._tag_of(n) == en.tag]
    assert not left, f"emulated nodes not removed: {left}"


# --------------------------------------------------------------------------------------------
# The sanitized selection (tests/sanitized_selection.txt): CI runs it under AddressSanitizer +
# UBSan (--sanitized-selection=only, through scripts/run_sanitized.sh) and the rest of the
# suite as usual (--sanitized-selection=exclude), so that no test runs twice.
# --------------------------------------------------------------------------------------------

SELECTION_FILE = os.path.join(HERE, "sanitized_selection.txt")


def pytest_addoption(parser):
    parser.addoption("--sanitized-selection", choices=("only", "exclude"), default=None,
                     help="run only the tests tests/sanitized_selection.txt lists, or all but "
                          "them (scripts/run_tests.sh runs them under the sanitizers)")


def sanitized_selection() -> list:
    """The selection's patterns as regular expressions: node ids where only ``*`` is a
    wildcard (``[`` and ``]`` are the parametrization's own, not character classes)."""
    import re

    out = []
    with open(SELECTION_FILE) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                out.append(re.compile(".*".join(re.escape(p) for p in line.split("*")) + "$"))
    return out


def pytest_collection_modifyitems(config, items):
    mode = config.getoption("--sanitized-selection")
    if not mode:
        return
    patterns = sanitized_selection()
    keep, drop = [], []
    for item in items:
        listed = any(p.match(item.nodeid) for p in patterns)
        (keep if listed == (mode == "only") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
