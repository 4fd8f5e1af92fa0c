"""Every committed input of every fuzz target (tests/fuzz/corpus/<target>/: the seeds, and the
inputs that once crashed a decoder, regression-*) runs once through its target, built with the
sanitizers: `scripts/run_fuzz.sh --regress`, libFuzzer where clang has it, else g++ and the
standalone driver. No fuzzing here (CI runs `scripts/run_fuzz.sh` for that); about 15 s from
a clean build/fuzz/ on the 2-core machine, a few seconds once built."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_fuzz_regressions():
    if shutil.which("clang++") is None and shutil.which("clang++-14") is None \
            and shutil.which("g++") is None:
        pytest.fail("neither clang++ nor g++ is on PATH: scripts/setup.sh installs g++ and clang-14")
    run = subprocess.run(["bash", str(ROOT / "scripts" / "run_fuzz.sh"), "--regress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-12000:]
    targets = sorted(p.stem[len("fuzz_"):] for p in (ROOT / "tests" / "fuzz").glob("fuzz_*.cpp"))
    for t in targets:
        assert any(line.startswith(t + " ") and " ok " in line for line in out.splitlines()), \
            f"no result for fuzz target {t}:\n{out[-4000:]}"
