#!/bin/bash -l
# Slurm batch script: fine-tune the chess language model (examples/finetune_chess.py) on one or
# more GPU nodes with RSDP, FSDP2 or DDP, launched by torchrun on every node.
#
#   sbatch examples/slurm_finetune.sh                                  # defaults below
#   STRATEGY=fsdp2 BACKEND=nccl sbatch --nodes=2 examples/slurm_finetune.sh
#   TOTAL_BATCH_SIZE=256 BATCH_SIZE_PER_DEVICE=8 sbatch examples/slurm_finetune.sh --steps 500
#   COMPARE=1 sbatch examples/slurm_finetune.sh                        # every strategy, one table
#
# Extra arguments after the script name are passed to finetune_chess.py unchanged.
#
#SBATCH --job-name=rsdp_finetune        # name shown by squeue
#SBATCH --output=%x-%j.out              # stdout file: <job name>-<job id>.out
#SBATCH --error=%x-%j.err               # stderr file
#SBATCH --nodes=1                       # nodes; torchrun runs once per node (override: sbatch --nodes=N)
#SBATCH --ntasks-per-node=1             # ONE Slurm task per node: torchrun itself starts the per-GPU ranks
#SBATCH --gres=gpu:4                    # GPUs per node (torchrun starts one rank per GPU)
#SBATCH --cpus-per-task=32              # CPU cores for the node's ranks (data generation, Python overhead)
#SBATCH --mem=0                         # all of the node's memory (RSDP/FSDP2 shard CPU-side state too)
#SBATCH --partition=gpu                 # adjust to your cluster's GPU partition
#SBATCH --time=01:00:00                 # wall-clock limit (HH:MM:SS)
#SBATCH --exclusive                     # no other jobs on our nodes: cleaner throughput numbers

set -euo pipefail

# --- software environment: adapt to your site (module system, conda, venv).
# module purge; module load cuda
# conda activate torch_rsdp
# The repository must be on a shared file system; run sbatch from its root (or set REPO).
REPO=${REPO:-${SLURM_SUBMIT_DIR:-$(pwd)}}
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # an uninstalled checkout works too

# --- what to run (environment variables override these defaults at submission time).
STRATEGY=${STRATEGY:-rsdp}              # rsdp | fsdp2 | ddp
# rsdp = the torch_rsdp backend: shared memory inside a node, and NCCL/UCX for
# CUDA tensors and between nodes where built. Use BACKEND=nccl for stock FSDP2/DDP baselines.
BACKEND=${BACKEND:-rsdp}
COMPARE=${COMPARE:-0}                   # 1: train every strategy of RUNS in turn, print one table
RUNS=${RUNS:-rsdp:rsdp,fsdp2:rsdp,ddp:rsdp,fsdp2:nccl}

# --- batch configuration, as in the usual FSDP recipe:
#   total batch = per-device batch x number of GPUs x gradient-accumulation steps.
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}}
[ "$GPUS_PER_NODE" -ge 1 ] || GPUS_PER_NODE=1   # no GPU visible: one CPU rank per node
NNODES=${SLURM_NNODES:-1}
NUM_GPUS=$((GPUS_PER_NODE * NNODES))
BATCH_SIZE_PER_DEVICE=${BATCH_SIZE_PER_DEVICE:-8}
TOTAL_BATCH_SIZE=${TOTAL_BATCH_SIZE:-$((BATCH_SIZE_PER_DEVICE * NUM_GPUS * 2))}
GRADIENT_ACCUMULATION_STEPS=$((TOTAL_BATCH_SIZE / BATCH_SIZE_PER_DEVICE / NUM_GPUS))
if [ "$GRADIENT_ACCUMULATION_STEPS" -lt 1 ] || \
   [ $((GRADIENT_ACCUMULATION_STEPS * BATCH_SIZE_PER_DEVICE * NUM_GPUS)) -ne "$TOTAL_BATCH_SIZE" ]; then
    echo "TOTAL_BATCH_SIZE=$TOTAL_BATCH_SIZE is not a multiple of" \
         "BATCH_SIZE_PER_DEVICE=$BATCH_SIZE_PER_DEVICE x $NUM_GPUS GPUs" >&2
    exit 1
fi

# --- rendezvous: the first node of the allocation hosts torchrun's c10d rendezvous store.
# (Outside Slurm, e.g. `bash examples/slurm_finetune.sh` on a workstation, it runs torchrun
# directly on this machine.)
JOB_ID=${SLURM_JOB_ID:-0}
if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
else
    MASTER_ADDR=127.0.0.1
fi
MASTER_PORT=${MASTER_PORT:-$((20000 + JOB_ID % 20000))}   # per-job port: jobs can share a node
export MASTER_ADDR MASTER_PORT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((${SLURM_CPUS_PER_TASK:-8} / GPUS_PER_NODE))}
# export NCCL_DEBUG=WARN               # uncomment to debug NCCL set-up
# export RSDP_DEBUG=1                   # torch_rsdp: print each group's set-up

echo "job $JOB_ID: $NNODES node(s) x $GPUS_PER_NODE GPU(s) = $NUM_GPUS ranks; rendezvous $MASTER_ADDR:$MASTER_PORT"
echo "strategy $STRATEGY over $BACKEND (compare=$COMPARE: $RUNS)"
echo "total batch $TOTAL_BATCH_SIZE = $BATCH_SIZE_PER_DEVICE per device x $NUM_GPUS GPUs x $GRADIENT_ACCUMULATION_STEPS accumulation steps"

EXTRA=()
if [ "$COMPARE" = "1" ]; then
    EXTRA+=(--compare --runs "$RUNS")
fi

# srun starts one torchrun per node (--ntasks-per-node=1); each torchrun starts GPUS_PER_NODE
# ranks and joins the c10d rendezvous on MASTER_ADDR, which assigns global ranks across nodes.
#   --nnodes            nodes in the job (fixed size: no elastic range)
#   --nproc-per-node    ranks per node = GPUs per node
#   --rdzv-id           unique per job, so concurrent jobs never join each other's rendezvous
#   --rdzv-backend c10d torchrun's built-in TCP rendezvous (no etcd needed)
#   --rdzv-endpoint     host:port of the rendezvous store (the first node)
LAUNCH=()
if [ -n "${SLURM_JOB_ID:-}" ]; then
    LAUNCH=(srun --kill-on-bad-exit=1)   # one torchrun per node; a failing node stops the job
fi
"${LAUNCH[@]}" torchrun \
    --nnodes="$NNODES" \
    --nproc-per-node="$GPUS_PER_NODE" \
    --rdzv-id="$JOB_ID" \
    --rdzv-backend=c10d \
    --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \
    examples/finetune_chess.py \
        --strategy "$STRATEGY" \
        --backend "$BACKEND" \
        --batch-size-per-device "$BATCH_SIZE_PER_DEVICE" \
        --gradient-accumulation-steps "$GRADIENT_ACCUMULATION_STEPS" \
        --json-out "${SLURM_JOB_NAME:-rsdp_finetune}-${JOB_ID}.json" \
        "${EXTRA[@]}" \
        "$@"
