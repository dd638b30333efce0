#!/bin/bash
# Own BPE tokenizer + tokenised-corpus cache (CPU only; run once before slurm/gpt.sh).
#   sbatch slurm/tokenizer.sh [tokenizer_train.py flags]    the default partition (fits debug and normal)
#   bash slurm/tokenizer.sh ...                             the same without Slurm
# Without --out it (re)trains the default data/tokenizer/tokenizer.json, replacing one left by the CPU
# try-out (--force): a job that stopped at "exists; pass --force" would leave the GPT job queued after
# it waiting forever. With your own --out an existing file is refused, as tokenizer_train.py does.
# Submit from the repository root (the log goes to runs/slurm/); from elsewhere add -o %x-%j.out.
#SBATCH --job-name=tokenizer
#SBATCH --cpus-per-task=8
#SBATCH --time=00:05:00
#SBATCH --output=runs/slurm/%x-%j.out
#SBATCH --open-mode=append
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash or sbatch, not sh" >&2; exit 2; }
set -euo pipefail
SCRIPT=$0  # under sbatch a spool copy: Slurm records the submitted path, then the arguments
if [ "${0##*/}" = slurm_script ]; then
    SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
    [ $# -eq 0 ] || SCRIPT=${SCRIPT%" $*"}  # the path may hold spaces: cut the arguments, not at a space
fi
REPO=$(cd "$(dirname "$SCRIPT")/.." && pwd)
source "$REPO/slurm/common.sh"
FORCE=(--force)
for a in "$@"; do case $a in --out|--out=*) FORCE=() ;; esac; done
exec python "$REPO/tokenizer_train.py" "${FORCE[@]}" "$@"
