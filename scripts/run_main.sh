#!/usr/bin/env bash
# Sets everything up, then runs the main job on CPU ranks (about 10 minutes after set-up
# on 2 cores; examples/README.md gives a run's times and its machine), printing each
# comparison against the stock backend (gloo):
#   1. fine-tuning a Hugging Face Llama (1 M parameters, built from a config, 200 steps) on chess games
#      the project generates, one rank per core (--nproc N to change it): RSDP, FSDP2 over
#      rsdp and over gloo, DDP and the planner's plan (its explanation and its in-place check
#      against the best uniform plans printed), from the same weights on the same batches,
#      taking turns step by step -- progress, then one table (tokens/s, memory per rank
#      split, losses, legal next moves), JSON and plots in examples/results/; RSDP's model
#      is saved with save_pretrained (examples/results/pretrained/);
#   2. fine-tuning that pretrained model on a notation it never saw (every move seen from
#      Black's side): built on meta, sharded, loaded shard by shard, LoRA adapters on the
#      frozen base, under RSDP and FSDP2 -- the learning check before and after, memory per
#      rank and tokens/s side by side, 40 steps (examples/finetune_lora.py;
#      examples/results/lora.json);
#   3. the same fine-tuning where the weights dominate memory (--preset weights: a wider
#      Llama, 15.7 M parameters, 2 games per rank) with RSDP, FSDP2 and DDP: RSDP's peak
#      memory per rank is well below both; table, JSON and plots in examples/results/weights/;
#   4. the collective benchmark up to 512 KiB, 2 ranks, rsdp (plain and communication-memory
#      buffers) vs gloo, with Open MPI and Intel oneCCL as references (each left out with a note where it
#      cannot run), one round (table, JSON, PNG in benchmarks/results/;
#      --rounds 2-3 of python -m benchmarks collectives when the machine is busy).
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) NPROC="$2"; shift 2 ;;
    --nproc=*) NPROC="${1#*=}"; shift ;;
    *) echo "usage: $0 [--nproc N]" >&2; exit 2 ;;
  esac
done
case "$NPROC" in
  ''|*[!0-9]*) echo "$0: --nproc takes a number of ranks, got '$NPROC'" >&2; exit 2 ;;
esac
[ "$NPROC" -ge 2 ] || NPROC=2  # a comparison of distributed strategies needs two ranks
bash scripts/setup.sh
start=$(date +%s)
python3 examples/finetune_chess.py --compare --nproc "$NPROC" --steps 200 --out examples/results \
  --save-pretrained examples/results/pretrained
# fine-tuning: the model just trained, built on meta, loaded shard by shard, LoRA on a
# notation it never saw, under RSDP and FSDP2
python3 examples/finetune_lora.py --pretrained examples/results/pretrained --nproc "$NPROC" \
  --steps 40 --eval-prompts 16 --out examples/results
python3 examples/finetune_chess.py --compare --preset weights --nproc "$NPROC" \
  --out examples/results/weights
python3 -m benchmarks collectives --backends rsdp,rsdp:pool,gloo --peers mpi,oneccl \
  --world-size 2 --dtypes float32 --max-bytes 512K
echo "main job: $(( $(date +%s) - start )) s after set-up"
