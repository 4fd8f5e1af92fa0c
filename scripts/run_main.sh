#!/usr/bin/env bash
# Sets everything up, then runs the main job: DDP training of a small
# transformer on 4 CPU ranks over rsdp and over gloo, then the collective
# benchmark (rsdp vs gloo, 2 ranks), printing both comparisons.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 examples/compare_ddp.py --nproc 4 --backends rsdp,gloo
python3 benchmarks/bench_collectives.py --backends rsdp,gloo --world-size 2
