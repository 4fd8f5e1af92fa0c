#!/usr/bin/env bash
# On a machine with a GPU and a CUDA build of torch: build torch_rsdp with its
# CUDA parts, run the CUDA tests, then the CUDA benchmarks (single GPU: ranks
# share it through CUDA IPC; with several GPUs stock NCCL is the baseline).
# Results land in benchmarks/results/. UCX_HOME may point at an unpacked UCX
# where Debian's libucx-dev cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -c "import torch, sys; sys.exit(0 if torch.version.cuda else 'torch has no CUDA')"
export RSDP_WITH_CUDA=1 PYTHONUNBUFFERED=1
MAX_JOBS=${MAX_JOBS:-8} bash scripts/setup.sh
$PY -c "import torch_rsdp; print(torch_rsdp.build_info()); assert torch_rsdp.cuda_available()"
$PY -m pytest -q -x tests/cuda/test_cuda_sources.py tests/cuda/test_cuda_unavailable.py tests/cuda/test_cuda.py
$PY benchmarks/bench_collectives.py --device cuda --world-size "${RSDP_BENCH_RANKS:-2}" --no-plot
$PY benchmarks/bench_rsdp_training.py --device cuda --single-gpu --world-size 2 --small
