#!/bin/bash
# Every GPU-side check and measurement in one run, for the first GPU node or a lent GPU machine:
# builds gelu_ext for this GPU, runs the CUDA tests, measures what README and report leave empty
# (GELU bandwidth, LeNet-5, the acceleration ladder, the 12M-token GPT run with nvidia-smi logged
# beside it), each result named after the GPU.
#
#   bash benchmarks/gpu_check.sh --prepare DIR              here: what a bare GPU machine lacks, <= 48 MiB
#   bash benchmarks/gpu_check.sh --from DIR --out OUTDIR    there: offline install, every check, <= 6 files out
#   bash benchmarks/gpu_check.sh --out OUTDIR [--mnist D] [--text X.txt]   a GPU node with requirements installed
#
# --prepare writes wheels (for Python 3.12) of datasets and everything it needs except numpy and
# pyarrow (torch and transformers bring those; together they are 70 MB), MNIST as .gz and the
# corpus, gzipped. Keep DIR git-ignored (.gpu-prep/ is). There, pip resolves datasets against what
# is installed, taking from DIR only what is missing; if that fails (an older pyarrow, say), the
# steps that need datasets are skipped with the reason and the others still run.
# A run stays within --budget seconds (default 540): each step prints its elapsed seconds, and a
# step whose estimate would overrun the budget is skipped with a message.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
MODE=run PREP="" OUT="" MNIST=data TEXT=data/WebOfScience/WOS46985/X.txt BUDGET=540
SHARED="$REPO/../shared/data"
while [ $# -gt 0 ]; do
    case $1 in
        --prepare) MODE=prepare PREP=$2; shift ;;
        --from) PREP=$2; shift ;;
        --out) OUT=$2; shift ;;
        --mnist) MNIST=$2; shift ;;
        --text) TEXT=$2; shift ;;
        --budget) BUDGET=$2; shift ;;
        *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
    shift
done

# ---------------------------------------------------------------------------- --prepare (here)
if [ "$MODE" = prepare ]; then
    [ -n "$PREP" ] || { echo "error: --prepare needs a folder" >&2; exit 2; }
    # the inputs first: a missing file stops it before the download and before DIR is made
    src=${LAB5_MNIST:-$SHARED/MNIST/raw}
    corpus=${LAB5_TEXT:-$SHARED/wos-standin/X.txt}
    mnist_files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
    for f in $mnist_files; do
        [ -f "$src/$f.gz" ] || [ -f "$src/$f" ] || { echo "error: $src/$f not found (set LAB5_MNIST)" >&2; exit 1; }
    done
    [ -f "$corpus" ] || { echo "error: corpus $corpus not found (set LAB5_TEXT)" >&2; exit 1; }
    mkdir -p "$PREP/wheels" "$PREP/MNIST/raw"
    version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
    python -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$PREP/wheels" "datasets==$(version datasets)" || { echo "error: pip download failed" >&2; exit 1; }
    rm -f "$PREP"/wheels/numpy-*.whl "$PREP"/wheels/pyarrow-*.whl
    for f in $mnist_files; do
        if [ -f "$src/$f.gz" ]; then cp "$src/$f.gz" "$PREP/MNIST/raw/"; else gzip -c "$src/$f" > "$PREP/MNIST/raw/$f.gz"; fi
    done
    gzip -c "$corpus" > "$PREP/X.txt.gz"
    echo "$corpus" > "$PREP/corpus_source.txt"
    size=$(du -sm "$PREP" | cut -f1)
    ls -la "$PREP/wheels"
    echo "prepared $PREP: ${size} MiB (limit 48)"
    [ "$size" -le 48 ] || { echo "error: $PREP is ${size} MiB, over the 48 MiB a device call can carry" >&2; exit 1; }
    exit 0
fi

# ---------------------------------------------------------------------------- the checks (on the GPU)
[ -n "$OUT" ] || { echo "error: --out OUTDIR is required" >&2; exit 2; }
nvidia-smi -L >/dev/null 2>&1 || { echo "error: no NVIDIA GPU here (nvidia-smi -L failed)" >&2; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
RESULTS="$WORK/results" LOGS="$WORK/logs"
mkdir -p "$RESULTS" "$LOGS"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="$WORK/cache"  # compile and micro-batch caches start cold
if [ -n "$PREP" ]; then  # a bare machine: install the carried wheels offline, unpack the data
    python -m pip install -q --no-index --find-links "$PREP/wheels" datasets 2>&1 | tail -n 3
    MNIST="$PREP/MNIST"
    TEXT="$WORK/X.txt"
    gunzip -c "$PREP/X.txt.gz" > "$TEXT"
fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -c 'A-Za-z0-9\n' '_' | tr -s '_')
START=$(date +%s)
status=0
nvidia-smi > "$LOGS/nvidia-smi.txt"

# step NAME ESTIMATE_S CMD...: run CMD unless the budget would be overrun; log its output and time.
# The estimates are an H100-class GPU's (about 450 s in all); a slower GPU skips the last steps.
step() {
    local name=$1 estimate=$2 elapsed t0 rc
    shift 2
    elapsed=$(( $(date +%s) - START ))
    if [ $(( elapsed + estimate )) -gt "$BUDGET" ]; then
        echo "=== $name: SKIPPED (${elapsed} s elapsed + ~${estimate} s > budget ${BUDGET} s)"
        return 0
    fi
    echo "=== $name (at ${elapsed} s, ~${estimate} s)"
    t0=$(date +%s)
    "$@" > "$LOGS/$name.log" 2>&1; rc=$?
    tail -n 4 "$LOGS/$name.log"
    echo "=== $name: exit $rc after $(( $(date +%s) - t0 )) s"
    [ "$rc" -eq 0 ] || status=1
}

# nvidia-smi every 500 ms beside a training run: the utilisation figure the handout asks for.
with_smi_log() {
    local name=$1 pid rc
    shift
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw \
        --format=csv -lms 500 > "$LOGS/nvidia-smi-$name.csv" &
    pid=$!
    "$@"; rc=$?
    nvidia-smi >> "$LOGS/nvidia-smi.txt"
    kill $pid
    return $rc
}

build() { unset TORCH_CUDA_ARCH_LIST; python -m pip install -q --no-build-isolation -e ./gelu_ext; }  # this GPU only
lenet() {
    local act=$1
    with_smi_log "lenet-$act" python lenet5.py --data-dir "$MNIST" --no-download --act "$act" \
        --out-dir "$WORK/runs/lenet5/$GPU-$act" --metrics-out "$RESULTS/lenet_run_${act}_$GPU.json"
}
tokenizer() {
    python tokenizer_train.py --text "$TEXT" --out "$WORK/tokenizer.json" --force --compare none \
        --cache-dir "$WORK/data-cache" --metrics-out "$RESULTS/tokenizer_$GPU.json"
}
gpt_run() {
    local name=$1
    shift
    with_smi_log "gpt-$name" python gpt_train.py --text "$TEXT" --tokenizer "$WORK/tokenizer.json" \
        --cache-dir "$WORK/data-cache" --out-dir "$WORK/runs/gpt/$GPU-$name" \
        --metrics-out "$RESULTS/gpt_run_${name}_$GPU.json" "$@"
}

step build 45 build || true
step cuda-tests 25 python -m pytest -q tests/test_gelu_ext.py
step gelu-bench 45 python benchmarks/gelu_bench.py --device cuda --metrics-out "$RESULTS/gelu_bench_$GPU.json"
step lenet-torch 20 lenet torch
step lenet-cpp 20 lenet cpp
step lenet-lightning 25 with_smi_log lenet-lightning python lenet5.py --data-dir "$MNIST" --no-download \
    --engine lightning --out-dir "$WORK/runs/lenet5/$GPU-lightning" --metrics-out "$RESULTS/lenet_run_lightning_$GPU.json"
# The GPT steps need datasets (data/wos.py); where it does not import, they say why, once each.
if python -c "import datasets" 2> "$LOGS/datasets-import.log"; then
    step tokenizer 15 tokenizer
    step gpt-12M 100 gpt_run 12M
    step gpt-12M-warm-cache 70 gpt_run 12M-warm  # the same run again: the compile cache is warm now
    step ladder 100 python benchmarks/gpt_bench.py --metrics-out "$RESULTS/gpt_bench_$GPU.json"
else
    for name in tokenizer gpt-12M gpt-12M-warm-cache ladder; do
        echo "=== $name: SKIPPED (datasets does not import: $(tail -n 1 "$LOGS/datasets-import.log"))"
    done
    status=1
fi
step report 20 python report/make_report.py "$WORK/runs/lenet5/$GPU-torch" "$WORK/runs/gpt/$GPU-12M" \
    --results "$RESULTS" --gpu-logs "$LOGS" --out "$WORK/report"

# At most 6 files back: one JSON with every result, one tar with the rest, this script's log.
python - "$RESULTS" "$OUT/gpu_results_$GPU.json" <<'EOF'
import json, sys
from pathlib import Path
results = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(results, indent=2) + "\n")
print(f"{len(results)} result files -> {sys.argv[2]}")
EOF
tar -czf "$OUT/gpu_check_$GPU.tar.gz" -C "$WORK" results logs report \
    $(cd "$WORK" && find runs -name 'events.out.tfevents.*' -o -name '*.json' | grep -v ckpt)
echo "total $(( $(date +%s) - START )) s; exit $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $status
