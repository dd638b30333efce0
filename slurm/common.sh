# Sourced by the launchers in this folder (not a job itself), once they know the repository ($REPO).
#
# Paths: the working directory stays the folder the job was submitted from (plain bash: the
# caller's), so relative paths in the flags mean what the user typed; the scripts themselves
# and the default outputs (runs/) are the repository's.
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

# out_dir_flag ARGS...: the value of the last --out-dir in ARGS (as argparse takes it), or nothing.
# A given but empty one (--out-dir=, --out-dir "$UNSET") stops the job in one line: left to the
# default, the job would print one folder and gpt_train.py take the empty value.
out_dir_flag() {
    local out="" given=""
    while [ $# -gt 0 ]; do
        case $1 in
            --out-dir) out=${2:-}; given=1; shift ;;
            --out-dir=*) out=${1#--out-dir=}; given=1 ;;
        esac
        shift
    done
    if [ -n "$given" ] && [ -z "${out//[[:space:]]/}" ]; then
        echo "error: --out-dir is empty; give a folder, or leave the flag out for a new runs/gpt/ folder" >&2
        return 2
    fi
    echo "$out"
}
