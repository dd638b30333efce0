#!/bin/bash
# Own BPE tokenizer + tokenised-corpus cache (CPU only; run once before slurm/gpt.sh).
#   sbatch slurm/tokenizer.sh [tokenizer_train.py flags]     (or: bash slurm/tokenizer.sh ...)
#SBATCH --job-name=tokenizer
#SBATCH --partition=2080Ti
#SBATCH --cpus-per-task=8
#SBATCH --time=00:15:00
#SBATCH --output=runs/slurm/%x-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
mkdir -p runs/slurm
exec python tokenizer_train.py "$@"
