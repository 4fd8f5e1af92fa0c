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

import torch  # noqa: E402
from torch.utils.cpp_extension import (  # noqa: E402
    CUDA_HOME, BuildExtension, CppExtension, CUDAExtension)

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
        # A Debian package unpacked into UCX_HOME keeps its libraries one level down.
        multiarch = glob.glob(os.path.join(lib, "*-linux-gnu"))
        if not glob.glob(os.path.join(lib, "libucp.so*")) and multiarch:
            lib = multiarch[0]
        if not os.path.isfile(os.path.join(inc, "ucp", "api", "ucp.h")):
            sys.exit(f"{UCX_MISSING} (UCX_HOME={home} has no include/ucp/api/ucp.h)")
        # The rpath lets the extension find a UCX outside the loader's search path;
        # old-style (DT_RPATH) so it also serves UCX's own dependencies (libnuma).
        return [inc], [lib], ["ucp", "uct", "ucs"], ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{lib}"]
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

# Sources that only CUDA builds compile: everything under these folders.
CUDA_ONLY_DIRS = ("csrc/cuda/", "csrc/transport/cuda_ipc/", "csrc/transport/nccl/",
                  "csrc/algorithms/cuda/", "csrc/backend/cuda/")


def _want_cuda():
    """Build the CUDA parts when the installed torch has CUDA and nvcc is found.

    RSDP_WITH_CUDA=0 forces a CPU-only build; RSDP_WITH_CUDA=1 makes a missing
    CUDA torch or nvcc an error instead of a silent CPU-only build.
    """
    flag = os.environ.get("RSDP_WITH_CUDA", "auto").strip().lower()
    if flag in ("0", "off", "no", "false"):
        return False
    why = None
    if torch.version.cuda is None:
        why = f"the installed torch {torch.__version__} has no CUDA"
    elif CUDA_HOME is None:
        why = "nvcc was not found (set CUDA_HOME)"
    if why and flag in ("1", "on", "yes", "true"):
        sys.exit(f"torch_rsdp: cannot build with CUDA (RSDP_WITH_CUDA={flag}): {why}")
    if why:
        print(f"torch_rsdp: building without CUDA: {why}")
    return why is None


def _nccl_flags():
    """Include dir, library dir and library of NCCL: NCCL_HOME, else the
    nvidia-nccl package that CUDA builds of torch depend on."""
    home = os.environ.get("NCCL_HOME")
    if home:
        inc, lib = os.path.join(home, "include"), os.path.join(home, "lib")
    else:
        try:
            import nvidia.nccl  # the wheel of nvidia-nccl-cu*; a namespace package
        except ImportError:
            sys.exit("torch_rsdp: cannot build with CUDA: NCCL not found; install the "
                     "nvidia-nccl package matching your torch or set NCCL_HOME")
        base = list(nvidia.nccl.__path__)[0]
        inc, lib = os.path.join(base, "include"), os.path.join(base, "lib")
    if not os.path.isfile(os.path.join(inc, "nccl.h")):
        sys.exit(f"torch_rsdp: cannot build with CUDA: no nccl.h in {inc}")
    libs = sorted(glob.glob(os.path.join(lib, "libnccl.so*")))
    if not libs:
        sys.exit(f"torch_rsdp: cannot build with CUDA: no libnccl.so in {lib}")
    # Wheels ship only libnccl.so.2 (no unversioned link), so name the file.
    name = "nccl" if os.path.exists(os.path.join(lib, "libnccl.so")) else ":" + os.path.basename(libs[0])
    return inc, lib, name


WITH_CUDA = _want_cuda()
all_sources = sorted(
    os.path.relpath(p, ROOT)
    for pattern in ("*.cpp", "*.cu")
    for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True)
)
sources = [s for s in all_sources if WITH_CUDA or not s.startswith(CUDA_ONLY_DIRS)]

include_dirs = [os.path.join(ROOT, "csrc")] + UCX_INCLUDE_DIRS
library_dirs = list(UCX_LIBRARY_DIRS)
libraries = list(UCX_LIBRARIES)
link_args = list(UCX_LINK_ARGS)
cxx_flags = ["-O3", "-Wall", "-Wno-unused-function"]
# RSDP_SANITIZE=address|thread builds the extension under the sanitizers for
# scripts/run_sanitized.sh (which also gives the build its own folders, so the normal build
# stays incremental). -O1 and frame pointers give whole stacks in the reports; -g1 (line
# tables only) names file and line in every frame, at a fraction of full -g's compile time
# (most of which is torch's headers); UBSan rides with ASan (they combine; TSan combines with
# neither).
SANITIZERS = {"address": "address,undefined", "thread": "thread"}
sanitize = os.environ.get("RSDP_SANITIZE", "").strip().lower()
if sanitize:
    if sanitize not in SANITIZERS:
        sys.exit(f"torch_rsdp: RSDP_SANITIZE={sanitize!r}: expected one of "
                 f"{', '.join(SANITIZERS)}")
    flag = "-fsanitize=" + SANITIZERS[sanitize]
    cxx_flags = ["-O1", "-g1", "-fno-omit-frame-pointer", flag, "-Wall", "-Wno-unused-function"]
    # GCC's UBSan reports and goes on; a report must stop the test that caused it.
    if sanitize == "address":
        cxx_flags.append("-fno-sanitize-recover=undefined")
    link_args.append(flag)
ext_kwargs = dict(name="torch_rsdp._C", sources=sources, include_dirs=include_dirs,
                  library_dirs=library_dirs, libraries=libraries, extra_link_args=link_args)
if WITH_CUDA:
    nccl_inc, nccl_lib, nccl_name = _nccl_flags()
    include_dirs.append(nccl_inc)
    library_dirs.append(nccl_lib)
    libraries.append(nccl_name)
    link_args.append(f"-Wl,-rpath,{nccl_lib}")
    # Without a GPU in sight torch would build for every architecture it knows.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    extension = CUDAExtension(
        define_macros=[("RSDP_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-std=c++17"]},
        **ext_kwargs,
    )
else:
    extension = CppExtension(extra_compile_args=cxx_flags, **ext_kwargs)

setup(
    name="torch_rsdp",
    version="0.1.0",
    description="A c10d backend for sharded training over shared memory, UCX and NCCL",
    packages=find_packages(include=["torch_rsdp", "torch_rsdp.*"]),
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
    # The torch releases the C++ glue is checked against: c10d::Backend's virtual members
    # differ between them (csrc/backend/backend_rsdp.h guards those by version), and
    # tests/project/test_torch_compat.py compiles the glue against 2.9's headers. Raise the
    # ceiling after building against the next release.
    install_requires=["torch>=2.9,<2.14"],
)
