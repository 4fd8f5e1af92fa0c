"""scripts/check_import.py on a planted crash, without building the real extension.

A compiler wrapper once built an extension that segfaulted at import (docs/cuda.md); setup.sh
and run_cuda_checks.sh run check_import.py after building so that such a build is caught,
blamed on its compiler and rebuilt with /usr/bin/g++. Here a tiny package ``crashpkg`` stands
in for torch_rsdp: its ``_C`` extension (built with g++ in a temporary folder, well under a
second) segfaults in its init function, and the "rebuild" is a shell line that copies a good
``_C`` into place and notes the compiler it was given. The checks:

* a working import: exit 0, nothing printed;
* a crash built with a wrapper: reported as SIGSEGV with the wrapper's name, resolved path and
  ``--version`` line; build/'s objects and the .so removed; rebuilt with CXX=/usr/bin/g++
  CC=/usr/bin/gcc; imports; exit 0; the compiler noted for setup.sh's next run;
* the rebuild still crashing: exit 1 with a message that says so;
* a crash built by /usr/bin/g++ itself: no rebuild (another compiler cannot help), exit 1.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_import.py"
SYSTEM_CXX = "/usr/bin/g++"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

MODULE_SRC = """
#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
extern "C" PyObject* PyInit__C(void) {
#ifdef CRASH
  *(volatile int*)nullptr = 1;  // what a broken libstdc++ mix does, on purpose (-O0 keeps it)
#endif
  return PyModule_Create(&def);
}
"""

pytestmark = pytest.mark.skipif(not os.path.exists(SYSTEM_CXX),
                                reason=f"{SYSTEM_CXX} is the compiler the repair uses")


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """{"good": path, "crash": path} of two built _C extensions."""
    d = tmp_path_factory.mktemp("ext")
    (d / "mod.cpp").write_text(MODULE_SRC)
    built = {}
    for name, flags in (("good", []), ("crash", ["-DCRASH"])):
        out = d / f"{name}{SUFFIX}"
        subprocess.run([SYSTEM_CXX, "-O0", "-shared", "-fPIC", *flags,
                        f"-I{sysconfig.get_paths()['include']}", str(d / "mod.cpp"), "-o",
                        str(out)], check=True)
        built[name] = out
    return built


def _checkout(tmp: Path, ext: Path, rebuild_with: Path) -> Path:
    """A fake checkout: crashpkg/ with `ext` as its _C, stale build objects, rebuild.sh."""
    root = tmp / "checkout"
    (root / "crashpkg").mkdir(parents=True)
    (root / "crashpkg" / "__init__.py").write_text("from . import _C  # noqa: F401\n")
    shutil.copy(ext, root / "crashpkg" / f"_C{SUFFIX}")
    (root / "build" / "temp.test").mkdir(parents=True)
    (root / "build" / "temp.test" / "stale.o").write_text("")
    (root / "rebuild.sh").write_text(
        'echo "$CXX $CC" > cxx_used.txt\n'
        f'test ! -e build/temp.test || {{ echo "objects not cleaned"; exit 3; }}\n'
        f'cp "{rebuild_with}" crashpkg/_C{SUFFIX}\n')
    return root


def _check(root: Path, cxx: str):
    env = dict(os.environ, CXX=cxx)
    env.pop("CC", None)
    p = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--module", "crashpkg",
                        "--rebuild", "sh rebuild.sh", "--remember", str(root / "safe-cc")],
                       env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def _wrapper(tmp: Path) -> Path:
    """A compiler wrapper like the GPU machine's (a different file from /usr/bin/g++)."""
    w = tmp / "wrapped-gcc" / "g++"
    w.parent.mkdir()
    w.write_text(f'#!/bin/sh\nexec {SYSTEM_CXX} "$@"\n')
    w.chmod(0o755)
    return w


def test_working_import_is_silent(tmp_path, modules):
    root = _checkout(tmp_path, modules["good"], modules["good"])
    rc, out = _check(root, str(_wrapper(tmp_path)))
    assert (rc, out) == (0, "")
    assert not (root / "cxx_used.txt").exists()


def test_planted_crash_is_reported_and_rebuilt_with_system_gxx(tmp_path, modules):
    root = _checkout(tmp_path, modules["crash"], modules["good"])
    wrapper = _wrapper(tmp_path)
    rc, out = _check(root, str(wrapper))
    print(out)
    version = subprocess.run([SYSTEM_CXX, "--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    assert "'import crashpkg' died from signal SIGSEGV" in out
    assert f"built with CXX={wrapper} -> {wrapper}: {version}" in out
    assert f"rebuilding from clean with CXX={SYSTEM_CXX} CC=/usr/bin/gcc" in out
    assert (root / "cxx_used.txt").read_text().split() == [SYSTEM_CXX, "/usr/bin/gcc"]
    assert "works now" in out and rc == 0, out
    assert (root / "safe-cc").read_text().split() == [SYSTEM_CXX, "/usr/bin/gcc"]


def test_crash_after_the_rebuild_exits_nonzero(tmp_path, modules):
    root = _checkout(tmp_path, modules["crash"], modules["crash"])
    rc, out = _check(root, str(_wrapper(tmp_path)))
    assert rc == 1, out
    assert (root / "cxx_used.txt").exists(), "the repair was not tried"
    assert "still broken after a clean rebuild with /usr/bin/g++" in out
    assert out.count("died from signal SIGSEGV") == 2
    assert not (root / "safe-cc").exists()


def test_crash_built_by_system_gxx_is_not_rebuilt(tmp_path, modules):
    root = _checkout(tmp_path, modules["crash"], modules["good"])
    rc, out = _check(root, SYSTEM_CXX)
    assert rc == 1, out
    assert "died from signal SIGSEGV" in out and "is the system compiler" in out
    assert not (root / "cxx_used.txt").exists()
