#!/bin/bash
# LeNet-5 on MNIST, one GPU.   sbatch slurm/lenet.sh [lenet5.py flags]   (or: bash slurm/lenet.sh ...)
# Partition: sbatch -p <name> overrides the default below (the lab's 2080Ti queue).
#SBATCH --job-name=lenet5
#SBATCH --partition=2080Ti
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=00:15:00
#SBATCH --output=runs/slurm/%x-%j.out
set -euo pipefail
# Under sbatch the script runs from a spool copy: find the repository from the submit directory.
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
mkdir -p runs/slurm
echo "host $(hostname), job ${SLURM_JOB_ID:-none}, GPUs ${CUDA_VISIBLE_DEVICES:-none}"
exec python lenet5.py "$@"
