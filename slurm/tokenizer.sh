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
SCRIPT=$0  # under sbatch a spool copy: Slurm's record of the job gives the submitted path, then the arguments
[ "${0##*/}" != slurm_script ] || SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
. "$(dirname "${SCRIPT%" $*"}")/common.sh" || exit 2  # cut the arguments, not at a space: the path may hold one
FORCE=--force  # the default file is replaced; one named with --out is the student's (see above)
for a in "$@"; do case $a in --out|--out=*) FORCE="" ;; esac; done
[ -z "$FORCE" ] || set -- "$FORCE" "$@"
exec python "$REPO/tokenizer_train.py" "$@"
