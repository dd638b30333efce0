#!/bin/bash
# LeNet-5 on MNIST, one GPU (a CPU node works too). Flags go to lenet5.py.
#   sbatch slurm/lenet.sh                        the cluster's default partition (fits debug and normal)
#   sbatch -p debug slurm/lenet.sh --act cpp     the 5-minute debug queue (-p normal, -p 2080Ti likewise)
#   bash slurm/lenet.sh --epochs 1               the same without Slurm
# Submit from the repository root (the log goes to runs/slurm/); from elsewhere add -o %x-%j.out.
# Relative paths in the flags are read from the folder you submit from.
#SBATCH --job-name=lenet5
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=00:05:00
#SBATCH --output=runs/slurm/%x-%j.out
#SBATCH --open-mode=append
set -euo pipefail
# Under sbatch this file runs from a spool copy (.../slurm_script); Slurm knows the submitted path.
SCRIPT=$0
[ "${0##*/}" = slurm_script ] && SCRIPT=$(scontrol show job -o "$SLURM_JOB_ID" | grep -o 'Command=[^ ]*' | cut -d= -f2-)
REPO=$(cd "$(dirname "$SCRIPT")/.." && pwd)
source "$REPO/slurm/common.sh"
exec python "$REPO/lenet5.py" "$@"
