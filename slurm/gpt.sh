#!/bin/bash
# GPT-2 on WOS, one GPU; survives the time limit: checkpoint on Slurm's warning, requeue, resume.
#   sbatch slurm/gpt.sh [gpt_train.py flags]          the default partition; 20 minutes (normal)
#   sbatch -p debug --time=5 slurm/gpt.sh --tokens 2000000    the 5-minute debug queue: pass --time
#   sbatch -p 2080Ti slurm/gpt.sh                     another course cluster's queue
#   bash slurm/gpt.sh ...                             the same without Slurm (Ctrl-C checkpoints)
# Submit from the repository root (the log goes to runs/slurm/, appended across restarts);
# from elsewhere add -o %x-%j.out. Relative paths in the flags are read from the submit folder.
#SBATCH --job-name=gpt
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=00:20:00
#SBATCH --signal=B:USR1@90
#SBATCH --requeue
#SBATCH --output=runs/slurm/%x-%j.out
#SBATCH --open-mode=append
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash or sbatch, not sh" >&2; exit 2; }
set -uo pipefail
SCRIPT=$0  # under sbatch a spool copy: Slurm records the submitted path, then the arguments
if [ "${0##*/}" = slurm_script ]; then
    SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
    [ $# -eq 0 ] || SCRIPT=${SCRIPT%" $*"}  # the path may hold spaces: cut the arguments, not at a space
fi
REPO=$(cd "$(dirname "$SCRIPT")/.." && pwd)
source "$REPO/slurm/common.sh"
# One run directory per job (unless --out-dir is given): a requeued job keeps its id, so it finds
# its own checkpoints and resumes.
OUT_DIR=$(out_dir_flag "$@") || exit 2
if [ -z "$OUT_DIR" ]; then
    OUT_DIR="$REPO/runs/gpt/${SLURM_JOB_NAME:-gpt}-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)-$$}"
    set -- --out-dir "$OUT_DIR" "$@"
fi
echo "out $OUT_DIR"  # the micro-batch: gpt_train.py's --micro-batch auto probes what fits this GPU

# Slurm sends USR1 to this shell 90 s before the limit (B: above); TERM comes with scancel, INT
# with Ctrl-C. Each is passed to Python, which checkpoints at the next step and exits with 3.
# Only after USR1 does the job requeue itself: the next start resumes from the checkpoint.
# Python starts with USR1 ignored, until gpt_train.py's first lines catch it (ms in; the default would
# kill it unsaved). In its first seconds a USR1 is therefore not passed at once (it could find Python
# not yet ignoring it, or be lost) but 2 and 5 s after it came (a repeat is harmless).
PID="" STOP="" STARTED=0
forward() { [ -n "$PID" ] && kill "-$1" "$PID" 2>/dev/null; }
later() { { sleep 2; forward USR1; sleep 3; forward USR1; } & }
usr1() {
    STOP=USR1; echo "USR1: checkpointing"
    [ -z "$PID" ] || if [ $((SECONDS - STARTED)) -ge 2 ]; then forward USR1; else later; fi
}
trap usr1 USR1
trap 'forward TERM' TERM INT
(trap '' USR1; exec python "$REPO/gpt_train.py" "$@") &
PID=$! STARTED=$SECONDS
[ "$STOP" = USR1 ] && later  # arrived before Python's pid was known
wait_for $PID; rc=$?
if [ "$rc" -eq 3 ] && [ "$STOP" = USR1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "[$(date '+%F %T')] checkpointed; requeueing job $SLURM_JOB_ID (the restart appends to this log)"
    # Slurm now ends this run and queues the job again. Ending first, with exit 3, would race it
    # and could record the job as FAILED: wait to be ended instead.
    scontrol requeue "$SLURM_JOB_ID" && { sleep 300 & wait $!; }
fi
exit $rc
