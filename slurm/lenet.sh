#!/bin/bash
# LeNet-5 on MNIST, one GPU (a CPU node works too). Flags go to lenet5.py.
#   sbatch slurm/lenet.sh                        the cluster's default partition (fits debug and normal)
#   sbatch -p debug slurm/lenet.sh --act cpp     the 5-minute debug queue (-p normal, -p 2080Ti likewise)
#   sbatch -p cpu --gres=none slurm/lenet.sh     a partition without GPUs (README.md here: troubleshooting)
#   bash slurm/lenet.sh --epochs 1               the same without Slurm
# Submit from the repository root (the log goes to runs/slurm/); from elsewhere add -o %x-%j.out.
# Relative paths in the flags are read from the folder you submit from.
#SBATCH --job-name=lenet5
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=00:05:00
#SBATCH --output=runs/slurm/%x-%j.out
#SBATCH --open-mode=append
SCRIPT=$0  # under sbatch a spool copy: Slurm's record of the job gives the submitted path, then the arguments
[ "${0##*/}" != slurm_script ] || SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=//p')
. "$(dirname "${SCRIPT%" $*"}")/common.sh" || exit 2  # cut the arguments, not at a space: the path may hold one
exec python "$REPO/lenet5.py" "$@"
