#!/usr/bin/env bash
# Sets everything up, then runs the main job on CPU ranks, printing each
# comparison against the stock backend (gloo):
#   1. fine-tuning a Hugging Face Llama (13 M parameters, built from a config)
#      on generated chess games, 4 ranks:
#      RSDP vs FSDP2 (over rsdp and gloo) vs DDP vs the planner's mix under a
#      160 MiB per-rank budget (its explanation printed) -- tokens/s, memory, loss;
#   2. DDP training of a small transformer, 4 ranks, over rsdp vs gloo;
#   3. the collective benchmark, 2 ranks, rsdp (plain and communication-memory
#      buffers) vs gloo, with Open MPI and rsdp on one rank as references (table, JSON, PNG in
#      benchmarks/results/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 examples/finetune_chess.py --compare --nproc 4 --memory-budget 160MiB
python3 examples/compare_ddp.py --nproc 4 --backends rsdp,gloo
python3 benchmarks/bench_collectives.py --backends rsdp,rsdp:pool,gloo --peers mpi --world-size 2 \
  --dtypes float32 --rounds 3
