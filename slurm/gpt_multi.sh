#!/bin/bash
# GPT-2 on WOS, data parallel over N nodes x G GPUs (DDP: torchrun per node, accelerate inside).
#   sbatch slurm/gpt_multi.sh [gpt_train.py flags]                  2 nodes x 1 GPU (a course cluster's nodes)
#   sbatch --nodes=2 --gres=gpu:4 slurm/gpt_multi.sh ...            nodes with 4 GPUs: ask on the command line
#   sbatch --nodes=2 --gres=none slurm/gpt_multi.sh --preset tiny    CPU-only nodes: one process each (gloo)
#   bash slurm/gpt_multi.sh ...          without Slurm: all GPUs of this machine (one process on a CPU)
# Each node runs one process per allocated GPU; the global batch is kept by accumulation.
# Submit from the repository root (log in runs/slurm/, appended across restarts); elsewhere add -o %x-%j.out.
# The nodes talk over the first network interface NCCL picks; where that is the wrong one (a node
# with several: Ethernet beside InfiniBand, docker0, a management port), name the one the nodes share:
#   NCCL_SOCKET_IFNAME=eth0 sbatch slurm/gpt_multi.sh ...    (`ip -brief addr` on a node lists them;
# sbatch passes the environment on). NCCL_DEBUG=INFO logs which one it took.
#SBATCH --job-name=gpt-multi
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=00:20:00
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
#SBATCH --output=runs/slurm/%x-%j.out
#SBATCH --open-mode=append
SCRIPT=$0  # under sbatch a spool copy: Slurm's record of the job gives the submitted path, then the arguments
[ "${0##*/}" != slurm_script ] || SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
. "$(dirname "${SCRIPT%" $*"}")/common.sh" || exit 2  # cut the arguments, not at a space: the path may hold one
GPUS=${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
NPROC=$(( GPUS > 0 ? GPUS : 1 ))  # CPU-only nodes: one gloo process per node
run_dir gpt-multi "$@" || exit 2  # the given --out-dir, else one folder per job (common.sh)
[ -z "$NEW_DIR" ] || set -- --out-dir "$OUT_DIR" "$@"

if [ -z "${SLURM_JOB_ID:-}" ]; then  # one machine, no Slurm
    exec torchrun --standalone --nproc_per_node "$NPROC" "$REPO/gpt_train.py" "$@"
fi

# The rendezvous: the first node of the allocation, by the name Slurm gives it. This script runs
# there (Slurm starts a batch script on the first node), so it can pick a port that is free there.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
echo "nodes $SLURM_JOB_NODELIST x $NPROC processes, master $MASTER_ADDR:$MASTER_PORT, out $OUT_DIR"

# USR1 (90 s before the limit) comes to this shell only; it sends TERM to the torchrun launchers,
# which pass it to every rank and give them 30 s: gpt_train.py agrees on the stop at the next
# step, checkpoints, exits. Then this job requeues itself; a plain scancel does not requeue.
STOP=""
trap 'STOP=USR1; echo "USR1: checkpointing"; scancel --signal=TERM "$SLURM_JOB_ID"' USR1
trap 'echo "TERM: the ranks checkpoint"' TERM
srun --kill-on-bad-exit=1 bash -c 'exec torchrun --nnodes "$SLURM_NNODES" --node_rank "$SLURM_NODEID" \
    --nproc_per_node "$0" --master_addr "$1" --master_port "$2" "${@:3}"' \
    "$NPROC" "$MASTER_ADDR" "$MASTER_PORT" "$REPO/gpt_train.py" "$@" &
wait_for $!; rc=$?
if [ "$STOP" = USR1 ] && [ ! -e "$OUT_DIR/metrics.json" ]; then
    requeue
    exit 3
fi
exit $rc
