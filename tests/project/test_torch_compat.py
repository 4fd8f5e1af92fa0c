"""The C++ glue compiles against the oldest torch that setup.py accepts.

c10d::Backend gains virtual members from one torch release to the next, and an ``override`` of
a member the installed torch does not declare is a compile error: the extension then does not
build there at all (torch 2.11 lacks ``getMemoryStats``). Installing an old torch to check costs
gigabytes, so ``torch_2_9_c10d_headers/`` holds torch 2.9's c10d interface headers (and its
``torch/version.h``) and this test puts them first on the include path of a syntax-only compile
of the CPU glue headers; ATen and c10 come from the installed torch. A few seconds, no build.

* ``test_glue_compiles_against_oldest_torch``: the headers as they are compile there;
* ``test_planted_unguarded_override_fails``: a copy of backend_rsdp.h with ``getMemoryStats``
  declared ``override`` without its version guard fails, naming that line (the check is strict);
* ``test_setup_py_floor_is_the_vendored_torch``: the vendored headers are those of the torch
  that ``install_requires`` names as the oldest.

Both compiles run at once (one core each).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
OLD_HEADERS = Path(__file__).resolve().parent / "torch_2_9_c10d_headers"

#: The CPU headers that derive from torch's classes (work_rsdp.h comes in through
#: backend_rsdp.h, and is named for clarity). The CUDA ones (backend/cuda/) need a CUDA torch.
GLUE_HEADERS = ["backend/backend_rsdp.h", "backend/work_rsdp.h", "backend/work_tracker.h",
                "backend/store_bootstrap.h", "backend/tensor_args.h",
                # the one source that builds a c10d type whose constructor changed (WorkInfo)
                "backend/work_tracker.cpp"]

# Fails the compile unless the vendored headers really shadowed the installed ones: torch 2.9's
# Backend has no getMemoryStats, and its version.h says 2.9.
SHADOW_PROBE = """
#include <type_traits>
template <typename T, typename = void> struct HasMemoryStats : std::false_type {};
template <typename T>
struct HasMemoryStats<T, std::void_t<decltype(&T::getMemoryStats)>> : std::true_type {};
static_assert(!HasMemoryStats<c10d::Backend>::value,
              "the installed Backend.hpp was used, not the vendored one");
static_assert(TORCH_VERSION_MAJOR == VENDORED_MAJOR && TORCH_VERSION_MINOR == VENDORED_MINOR,
              "the installed torch/version.h was used, not the vendored one");
"""

UNGUARDED = "  std::unordered_map<std::string, uint64_t> getMemoryStats() override;"


def _vendored_version():
    text = (OLD_HEADERS / "torch" / "version.h").read_text()
    major = int(re.search(r"#define TORCH_VERSION_MAJOR (\d+)", text).group(1))
    minor = int(re.search(r"#define TORCH_VERSION_MINOR (\d+)", text).group(1))
    return major, minor


def _start_compile(tmp: Path, first_includes):
    """Starts g++ -fsyntax-only over the glue headers; returns the Popen."""
    from torch.utils.cpp_extension import include_paths
    major, minor = _vendored_version()
    unit = tmp / "glue.cpp"
    unit.write_text("".join(f'#include "{h}"\n' for h in GLUE_HEADERS)
                    + f"#define VENDORED_MAJOR {major}\n#define VENDORED_MINOR {minor}\n"
                    + SHADOW_PROBE)
    # C++17: what torch 2.9-2.11 build extensions as (2.12 moved to C++20), so our headers
    # must stay C++17. Newer c10 headers only warn about it.
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-fsyntax-only"]
    cmd += [f"-I{d}" for d in first_includes]
    cmd += [f"-I{OLD_HEADERS}"] + [f"-I{p}" for p in include_paths()] + [f"-I{CSRC}", str(unit)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp), cmd


def _errors(output: str) -> str:
    return "\n".join(line for line in output.splitlines() if "error" in line) or output[-3000:]


@pytest.fixture(scope="module")
def compiles(tmp_path_factory):
    """{"as_is": (rc, output, cmd), "planted": ...}, both compiled concurrently."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler")
    as_is_dir = tmp_path_factory.mktemp("as_is")
    planted_dir = tmp_path_factory.mktemp("planted")
    # The planted copy sits in <tmp>/backend/, found before csrc/ for "backend/backend_rsdp.h";
    # its own quoted includes resolve to csrc/ as usual.
    header = (CSRC / "backend" / "backend_rsdp.h").read_text()
    lines = [UNGUARDED if "getMemoryStats()" in line and line.lstrip().startswith("std::")
             else line for line in header.splitlines()]
    assert UNGUARDED in lines, "backend_rsdp.h declares getMemoryStats differently: update UNGUARDED"
    (planted_dir / "backend").mkdir()
    (planted_dir / "backend" / "backend_rsdp.h").write_text("\n".join(lines) + "\n")
    runs = {"as_is": _start_compile(as_is_dir, []),
            "planted": _start_compile(planted_dir, [planted_dir])}
    results = {}
    for name, (proc, cmd) in runs.items():
        out, _ = proc.communicate(timeout=300)
        results[name] = (proc.returncode, out, " ".join(shlex.quote(c) for c in cmd))
    return results


def test_glue_compiles_against_oldest_torch(compiles):
    rc, out, cmd = compiles["as_is"]
    major, minor = _vendored_version()
    assert rc == 0, (f"the glue headers do not compile against torch {major}.{minor}'s c10d "
                     f"headers (guard newer overrides with RSDP_OVERRIDE_SINCE_*, "
                     f"backend_rsdp.h):\n{_errors(out)}\n\n{cmd}")


def test_planted_unguarded_override_fails(compiles):
    rc, out, _ = compiles["planted"]
    assert rc != 0, "an unguarded getMemoryStats() override compiled against torch 2.9's headers"
    assert re.search(r"backend_rsdp\.h:\d+:\d+: error: .*getMemoryStats\(\).* marked .override., "
                     r"but does not override", out), _errors(out)


def test_setup_py_floor_is_the_vendored_torch():
    floor = re.search(r'"torch>=(\d+)\.(\d+)', (ROOT / "setup.py").read_text())
    assert floor, "setup.py's install_requires names no torch>=X.Y"
    assert tuple(map(int, floor.groups())) == _vendored_version(), (
        "setup.py's oldest torch and the vendored headers (tests/project/torch_2_9_c10d_headers) "
        "differ: vendor the headers of the oldest torch setup.py accepts")
