#!/bin/bash
# GPT-2 on WOS, one GPU, survives the 20-minute limit: checkpoint on Slurm's warning, requeue, resume.
#   sbatch slurm/gpt.sh [gpt_train.py flags]        (or: bash slurm/gpt.sh ... without Slurm)
#   sbatch -p A100 slurm/gpt.sh                     (another partition; SBATCH_PARTITION works too)
# The 2080Ti partition (11 GB, Turing): micro-batch 4, fp16 + GradScaler, no torch.compile (auto).
#SBATCH --job-name=gpt
#SBATCH --partition=2080Ti
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=00:20:00
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
#SBATCH --output=runs/slurm/%x-%j.out
set -uo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
mkdir -p runs/slurm
# One run directory per job: a requeued job keeps its id, so it finds its own checkpoints and resumes.
OUT_DIR="runs/gpt/${SLURM_JOB_NAME:-gpt}-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}"
MICRO=()
if nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | awk '$1 < 20000 {f=1} END {exit !f}'; then
    MICRO=(--micro-batch 4)  # < 20 GB (2080Ti): 4 x 1024 tokens per micro-batch, accumulated to the global batch
fi
echo "host $(hostname), job ${SLURM_JOB_ID:-none} (restart ${SLURM_RESTART_COUNT:-0}), GPUs ${CUDA_VISIBLE_DEVICES:-none}, out $OUT_DIR"

# The batch shell gets USR1 90 s before the limit (B: above) and passes it on to Python, which
# checkpoints and exits with 3; the job then requeues itself and the next start resumes.
PID=""
trap 'echo "USR1: checkpointing"; [ -n "$PID" ] && kill -USR1 $PID' USR1  # set first: USR1 would otherwise kill this shell
python gpt_train.py --out-dir "$OUT_DIR" "${MICRO[@]}" "$@" &
PID=$!
wait $PID; rc=$?
while kill -0 $PID 2>/dev/null; do wait $PID; rc=$?; done  # wait returns early when the trap fires
if [ "$rc" -eq 3 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "checkpointed; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit $rc
