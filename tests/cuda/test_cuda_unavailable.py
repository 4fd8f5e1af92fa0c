"""What torch_rsdp says about its CUDA support agrees with torch and with itself.

Runs everywhere, with or without a GPU (CI has none): ``cuda_built()`` / ``cuda_available()``
are bools consistent with torch, ``build_info()`` describes the build consistently (no CUDA =>
no CUDA or NCCL version), and a build without CUDA does not register the backend for CUDA
tensors. On CPU-only torch no CUDA tensor can be made at all; ops on CUDA tensors (and the
errors for mixed devices) are tested by tests/cuda/test_cuda.py where a GPU exists.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist


def _api(name):
    import torch_rsdp
    from torch_rsdp import _cuda  # cuda_built is private; build_info()["cuda"] is its public form

    fn = getattr(torch_rsdp, name, None) or getattr(_cuda, name, None)
    assert callable(fn), f"torch_rsdp.{name}() is missing"
    return fn


def test_cuda_flags_are_bools_consistent_with_torch():
    built = _api("cuda_built")()
    available = _api("cuda_available")()
    assert isinstance(built, bool), f"cuda_built() returned {built!r}"
    assert isinstance(available, bool), f"cuda_available() returned {available!r}"
    assert available == (built and torch.cuda.is_available()), (
        f"cuda_available() = {available}, but cuda_built() = {built} and "
        f"torch.cuda.is_available() = {torch.cuda.is_available()}")
    if torch.version.cuda is None:
        assert not built, (f"cuda_built() is True but torch {torch.__version__} has no CUDA: "
                           "the extension cannot serve CUDA tensors with it")
    if not torch.cuda.is_available():
        assert not available, "cuda_available() is True without a CUDA device"


def test_build_info_is_consistent():
    info = _api("build_info")()
    assert isinstance(info, dict), f"build_info() returned {type(info).__name__}"
    missing = {"cuda", "cuda_version", "nccl_version", "torch"} - set(info)
    assert not missing, f"build_info() lacks {sorted(missing)}: {info}"
    assert isinstance(info["cuda"], bool), f"build_info()['cuda'] = {info['cuda']!r}"
    assert info["cuda"] == _api("cuda_built")(), f"build_info() {info} vs cuda_built()"
    if not info["cuda"]:
        assert info["cuda_version"] is None, f"no CUDA in the build, yet {info}"
        assert info["nccl_version"] is None, f"no CUDA in the build, yet {info}"
    else:
        cv, nv = info["cuda_version"], info["nccl_version"]
        assert isinstance(cv, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", cv), f"cuda_version {cv!r}"
        assert isinstance(nv, str) and re.fullmatch(r"\d+\.\d+\.\d+", nv), f"nccl_version {nv!r}"
        assert torch.version.cuda is not None, f"a CUDA build ({cv}) under CPU-only torch"
        assert cv.split(".")[0] == torch.version.cuda.split(".")[0], (
            f"built with CUDA {cv}, torch uses CUDA {torch.version.cuda}")
    assert isinstance(info["torch"], str) and info["torch"], f"build_info()['torch'] = {info['torch']!r}"
    assert info["torch"].split("+")[0] == torch.__version__.split("+")[0], (
        f"build_info()['torch'] = {info['torch']!r}, running torch {torch.__version__}")


def test_backend_registered_for_cuda_only_in_a_cuda_build():
    built = _api("cuda_built")()
    devices = dist.Backend.backend_capability.get("rsdp")
    assert devices is not None, "importing torch_rsdp did not register the 'rsdp' backend"
    assert "cpu" in devices, f"rsdp registered for {devices}"
    assert ("cuda" in devices) == built, (
        f"rsdp registered for {devices} but cuda_built() = {built}")
