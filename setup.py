"""Builds torch_rsdp and its native extension torch_rsdp._C.

Build against the torch that is installed (no build isolation):
    pip install --no-build-isolation .
"""
import glob
import os
import shutil
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
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args=["-O3", "-Wall", "-Wno-unused-function"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
)
