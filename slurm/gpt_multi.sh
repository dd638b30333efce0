#!/bin/bash
# GPT-2 on WOS, data parallel over N nodes x G GPUs (DDP via accelerate; one launcher per node).
#   sbatch --nodes=2 --gres=gpu:4 slurm/gpt_multi.sh [gpt_train.py flags]
#   bash slurm/gpt_multi.sh ...        (without Slurm: all GPUs of this machine)
#SBATCH --job-name=gpt-multi
#SBATCH --partition=2080Ti
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=16
#SBATCH --time=00:20:00
#SBATCH --signal=TERM@90
#SBATCH --requeue
#SBATCH --output=runs/slurm/%x-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
mkdir -p runs/slurm
OUT_DIR="runs/gpt/${SLURM_JOB_NAME:-gpt-multi}-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}"
GPUS_PER_NODE=$(nvidia-smi -L 2>/dev/null | wc -l)
GPUS_PER_NODE=${GPUS_PER_NODE:-1}

if [ -z "${SLURM_JOB_ID:-}" ]; then  # one machine, no Slurm
    exec accelerate launch --multi_gpu --num_processes "$GPUS_PER_NODE" gpt_train.py --out-dir "$OUT_DIR" "$@"
fi

# The rendezvous comes from Slurm: the first node of the allocation is the master.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
echo "nodes $SLURM_JOB_NODELIST, $GPUS_PER_NODE GPUs each, master $MASTER_ADDR:$MASTER_PORT, out $OUT_DIR"
# srun starts one accelerate launcher per node; each starts one process per GPU. Slurm's TERM
# (90 s before the limit, and at scancel) reaches every rank: gpt_train.py checkpoints and exits.
ARGS=$(printf ' %q' "$@")  # quoted again for the inner shell
srun --kill-on-bad-exit=1 bash -c "accelerate launch --multi_gpu \
    --num_machines $SLURM_NNODES --machine_rank \$SLURM_NODEID \
    --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
    --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT \
    gpt_train.py --out-dir $OUT_DIR$ARGS"
