"""Shared pytest setup for the torch_rsdp test-suite.

- tests/ is importable (harness.py, values.py) in spawned workers too (spawn copies sys.path).
- When torch_rsdp is not installed (pip install -e), fall back to the source tree so that an
  in-place build (python setup.py build_ext --inplace) is found from any working directory.
- The backend under test is chosen with RSDP_TEST_BACKEND (default "rsdp"; "gloo" validates
  the tests themselves).
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

if HERE not in sys.path:
    sys.path.insert(0, HERE)
if importlib.util.find_spec("torch_rsdp") is None and ROOT not in sys.path:
    sys.path.append(ROOT)


def pytest_report_header(config):
    from harness import backend_under_test

    return [f"torch_rsdp tests: backend under test = {backend_under_test()!r} "
            f"(set RSDP_TEST_BACKEND=gloo to validate the tests against gloo)"]
