#!/bin/bash
# GPT-2 on WOS, one GPU; survives the time limit: checkpoint on Slurm's warning, requeue, resume.
#   sbatch slurm/gpt.sh [gpt_train.py flags]          the default partition; 20 minutes (normal)
#   sbatch -p debug --time=5 slurm/gpt.sh --tokens 2000000    the 5-minute debug queue: pass --time
#   sbatch -p 2080Ti slurm/gpt.sh                     another course cluster's queue
#   sbatch -p cpu --gres=none slurm/gpt.sh --preset tiny --tokens 200000   no GPUs there (slurm/README.md)
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
SCRIPT=$0  # under sbatch a spool copy: Slurm's record of the job gives the submitted path, then the arguments
[ "${0##*/}" != slurm_script ] || SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
. "$(dirname "${SCRIPT%" $*"}")/common.sh" || exit 2  # cut the arguments, not at a space: the path may hold one
run_dir gpt "$@" || exit 2  # the given --out-dir, else one folder per job (common.sh)
[ -z "$NEW_DIR" ] || set -- --out-dir "$OUT_DIR" "$@"
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
    requeue
fi
exit $rc
