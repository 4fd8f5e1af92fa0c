"""Builds torch_rsdp and its native extension torch_rsdp._C.

Build against the torch that is installed (no build isolation):
    pip install --no-build-isolation .
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup


def _require(module, hint):
    try:
        return __import__(module)
    except ImportError:
        sys.exit(f"torch_rsdp: cannot build: Python package '{module}' is missing. {hint}")


_require("torch", "Install it first (pip install torch==2.13.0), then build with "
         "'pip install --no-build-isolation .' so the extension matches it.")
if shutil.which("ninja") is None:
    _require("ninja", "Install it with 'pip install ninja' (or apt-get install ninja-build).")

from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

os.environ.setdefault("MAX_JOBS", "2")
ROOT = os.path.dirname(os.path.abspath(__file__))

UCX_MISSING = ("torch_rsdp: cannot build: UCX not found; install Debian's libucx-dev "
               "(apt-get install libucx-dev) or set UCX_HOME")


def _ucx_flags():
    """Include dirs, library dirs and libraries of UCX (the network transport).

    UCX_HOME wins when set ($UCX_HOME/include, $UCX_HOME/lib); otherwise pkg-config.
    """
    home = os.environ.get("UCX_HOME")
    if home:
        inc, lib = os.path.join(home, "include"), os.path.join(home, "lib")
        if not os.path.isfile(os.path.join(inc, "ucp", "api", "ucp.h")):
            sys.exit(f"{UCX_MISSING} (UCX_HOME={home} has no include/ucp/api/ucp.h)")
        # The rpath lets the extension find a UCX outside the loader's search path.
        return [inc], [lib], ["ucp", "uct", "ucs"], [f"-Wl,-rpath,{lib}"]
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "ucx"], capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        sys.exit(UCX_MISSING)
    incs = [f[2:] for f in out if f.startswith("-I")]
    libdirs = [f[2:] for f in out if f.startswith("-L")]
    libs = [f[2:] for f in out if f.startswith("-l")]
    other = [f for f in out if f.startswith(("-Wl,", "-pthread"))]
    return incs, libdirs, libs, other + [f"-Wl,-rpath,{d}" for d in libdirs]


UCX_INCLUDE_DIRS, UCX_LIBRARY_DIRS, UCX_LIBRARIES, UCX_LINK_ARGS = _ucx_flags()
sources = sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True)
)

setup(
    name="torch_rsdp",
    version="0.1.0",
    description="A c10d backend for sharded training over shared memory, UCX and NCCL",
    packages=find_packages(include=["torch_rsdp", "torch_rsdp.*"]),
    ext_modules=[
        CppExtension(
            name="torch_rsdp._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "csrc")] + UCX_INCLUDE_DIRS,
            library_dirs=UCX_LIBRARY_DIRS,
            libraries=UCX_LIBRARIES,
            extra_compile_args=["-O3", "-Wall", "-Wno-unused-function"],
            extra_link_args=UCX_LINK_ARGS,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
