#!/bin/bash -l
# Slurm batch script: DDP training (examples/train_ddp.py) across several CPU nodes on the
# rsdp backend -- shared memory inside each node, UCX between nodes, hierarchical collectives.
#
#   sbatch --nodes=2 examples/slurm_multinode_cpu.sh                 # rsdp, 8 ranks per node
#   BACKEND=gloo sbatch --nodes=2 examples/slurm_multinode_cpu.sh    # the stock baseline
#   NPROC_PER_NODE=16 sbatch --nodes=4 examples/slurm_multinode_cpu.sh --steps 500
#
# Extra arguments after the script name are passed to train_ddp.py unchanged.
#
#SBATCH --job-name=rsdp_cpu_multinode
#SBATCH --output=%x-%j.out
#SBATCH --error=%x-%j.err
#SBATCH --nodes=2                       # override with sbatch --nodes=N
#SBATCH --ntasks-per-node=1             # one torchrun per node; it starts the node's ranks
#SBATCH --cpus-per-task=32
#SBATCH --mem=0
#SBATCH --time=01:00:00
#SBATCH --exclusive

set -euo pipefail

# The repository must be on a shared file system; run sbatch from its root (or set REPO).
REPO=${REPO:-${SLURM_SUBMIT_DIR:-$(pwd)}}
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

BACKEND=${BACKEND:-rsdp}
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
# Each rank gets its share of the node's cores for intra-op parallelism.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( ${SLURM_CPUS_PER_TASK:-$NPROC_PER_NODE} / NPROC_PER_NODE ))}

# UCX picks the inter-node wire; TCP works everywhere, add rc/ud_x (InfiniBand) where present,
# and pin the interface when nodes have several (e.g. UCX_NET_DEVICES=eth0 or mlx5_0:1).
export UCX_TLS=${UCX_TLS:-tcp}
# gloo needs the interface name when the host name does not resolve to the right one.
# export GLOO_SOCKET_IFNAME=eth0
# export RSDP_DEBUG=1                   # print every group's topology at init

MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
echo "nodes: $SLURM_JOB_NODELIST, $NPROC_PER_NODE ranks per node, backend $BACKEND, UCX_TLS=$UCX_TLS"

srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
  torchrun --nnodes "$SLURM_NNODES" --nproc-per-node "$NPROC_PER_NODE" \
    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    examples/train_ddp.py --backend "$BACKEND" --threads "$OMP_NUM_THREADS" "$@"
