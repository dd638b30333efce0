#!/bin/bash
# Every GPU-side check and measurement in one run, for the first GPU node (or a lent GPU machine):
# builds gelu_ext for this GPU, runs the CUDA tests, then writes the GPU figures that README and
# report leave empty into report/results/ (or $RESULTS), each named after the GPU.
#   bash benchmarks/gpu_check.sh [MNIST_DIR] [X_TXT]        (defaults: data/, the WOS X.txt)
# Takes ~10 minutes on an H100-class GPU, longer on a 2080Ti (the 12M-token run dominates).
set -uo pipefail
cd "$(dirname "$0")/.."
MNIST=${1:-data}
TEXT=${2:-data/WebOfScience/WOS46985/X.txt}
RESULTS=${RESULTS:-report/results}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -c 'A-Za-z0-9\n' '_' | tr -s '_')
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
step() { echo; echo "=== $* ==="; }
status=0

step "build gelu_ext for this GPU"
unset TORCH_CUDA_ARCH_LIST  # the visible GPU's architecture only: the fastest build
pip install -q --no-build-isolation -e ./gelu_ext || exit 1
step "CUDA tests"
python -m pytest -q tests/test_gelu_ext.py || status=1
step "GELU benchmark"
python benchmarks/gelu_bench.py --device cuda --metrics-out "$RESULTS/gelu_bench_$GPU.json" || status=1
step "LeNet-5 (torch GELU, then the CUDA GELU)"
python lenet5.py --data-dir "$MNIST" --no-download --out-dir "runs/lenet5/$GPU-torch" \
    --metrics-out "$RESULTS/lenet_run_$GPU.json" || status=1
python lenet5.py --data-dir "$MNIST" --no-download --act cpp --out-dir "runs/lenet5/$GPU-cpp" \
    --metrics-out "$RESULTS/lenet_run_cpp_$GPU.json" || status=1
step "tokenizer + tokenised cache"
python tokenizer_train.py --text "$TEXT" --out "data/tokenizer/tokenizer.json" --force --compare none \
    --metrics-out "$RESULTS/tokenizer_$GPU.json" || status=1
step "acceleration ladder"
python benchmarks/gpt_bench.py --metrics-out "$RESULTS/gpt_bench_$GPU.json" || status=1
step "GPT-2 124M, 12M tokens"
python gpt_train.py --text "$TEXT" --tokenizer data/tokenizer/tokenizer.json --out-dir "runs/gpt/$GPU-12M" \
    --metrics-out "$RESULTS/gpt_run_$GPU.json" || status=1
step "report"
python report/make_report.py "runs/lenet5/$GPU-torch" "runs/gpt/$GPU-12M" || status=1
exit $status
