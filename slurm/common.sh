# Sourced by the four launchers here as their first command (not a job itself). Under sbatch a launcher
# runs from a spool copy, so it finds this file from Slurm's record of the job (the submitted path, then
# the arguments); this file then finds the repository ($REPO) from its own path.
#
# Paths: the working directory stays the folder the job was submitted from (plain bash: the
# caller's), so relative paths in the flags mean what the user typed; the scripts themselves
# and the default outputs (runs/) are the repository's.
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash or sbatch, not sh" >&2; exit 2; }
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$REPO/runs/slurm"
echo "[$(date '+%F %T')] host $(hostname), job ${SLURM_JOB_ID:-none} (restart ${SLURM_RESTART_COUNT:-0})," \
     "partition ${SLURM_JOB_PARTITION:-none}, GPUs ${CUDA_VISIBLE_DEVICES:-none}, cwd $PWD"

# wait_for PID: its exit status. `wait` also returns (with 128+n) whenever a trapped signal
# arrives, so wait again while the process lives; bash keeps the status of a finished child.
wait_for() {
    wait "$1"
    while kill -0 "$1" 2>/dev/null; do wait "$1"; done
    wait "$1"
}

# run_dir NAME ARGS...: sets OUT_DIR to the last --out-dir in ARGS (as argparse takes it), else to a new
# runs/gpt/NAME-<job id> and NEW_DIR=1 (the launcher then passes it on): a requeued job keeps its id, so
# it finds its own checkpoints and resumes. A given but empty one (--out-dir=, --out-dir "$UNSET")
# stops the job in one line: left to the default, the job would print one folder and Python take another.
run_dir() {
    local name=$1 given=""
    shift
    OUT_DIR="" NEW_DIR=""
    while [ $# -gt 0 ]; do
        case $1 in
            --out-dir) OUT_DIR=${2:-}; given=1; shift ;;
            --out-dir=*) OUT_DIR=${1#--out-dir=}; given=1 ;;
        esac
        shift
    done
    if [ -z "$given" ]; then
        OUT_DIR="$REPO/runs/gpt/${SLURM_JOB_NAME:-$name}-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)-$$}"
        NEW_DIR=1
    elif [ -z "${OUT_DIR//[[:space:]]/}" ]; then
        echo "error: --out-dir is empty; give a folder, or leave the flag out for a new runs/gpt/ folder" >&2
        return 2
    fi
}

# requeue: after a USR1 and a checkpoint, Slurm ends this run and queues the job again (the restart
# appends to the same log). Ending first, with exit 3, would race it and could record the job as
# FAILED: wait to be ended instead.
requeue() {
    echo "[$(date '+%F %T')] checkpointed; requeueing job $SLURM_JOB_ID (the restart appends to this log)"
    scontrol requeue "$SLURM_JOB_ID" && { sleep 300 & wait $!; }
}
