#!/bin/bash
# Every GPU-side check and measurement in one call, for a lent GPU machine or the first GPU node: builds
# gelu_ext for this GPU, runs the CUDA tests, measures what README and report leave empty (GELU
# bandwidth, LeNet-5 three ways, the tokenizer, the 12M-token GPT run cold and warm and with GPT-2's
# tokenizer, the acceleration ladder) with nvidia-smi logged during each training, then the report.
#
#   bash benchmarks/gpu_check.sh --prepare DIR [--python 3.11]   here: what a bare machine lacks (<= 48 MiB)
#   bash benchmarks/gpu_check.sh --from DIR --out OUT [--budget S]   there: offline install, every step
#   bash benchmarks/gpu_check.sh --out OUT [--mnist D] [--text X.txt] [--gpt2-tokenizer F]   a GPU node
#   bash benchmarks/gpu_check.sh --rehearse [--from DIR] --out OUT [--budget S]   the same plumbing on a CPU
#
# A device call brings back only what is under OUT, at most 8 files, and may be killed at its time
# limit: so OUT holds results.json (an entry per step: ok, cut at N s, failed, skipped: why; and every
# result so far), logs.tar.gz, runs.tar.gz (TensorBoard events, run metrics), report.tar.gz and
# gpu_check.log, each rewritten as soon as a step ends. The --budget clock (default 540 s) starts
# before the install and the build; each step runs under `timeout` at the smaller of its own cap and
# what is left of the budget (less the report's reserve), so a slow step is cut and the next one runs.
#
# --prepare DIR (default Python 3.12, the lent image's) carries wheels of datasets and its
# dependencies but numpy and pyarrow (torch and the image bring those), MNIST as .gz, the corpus
# gzipped with its source path and document count, and GPT-2's tokenizer files. There, only the
# wheels of packages the machine lacks are installed, with --no-deps into a folder of the run's own
# (PYTHONPATH), never over the image's packages; then requirements and every step's imports are
# checked in one go, and a step whose imports fail is skipped with the reason. The datasets version is
# pinned to one whose requirements the lent image satisfies (pyarrow >= 24, huggingface-hub >= 1.31,
# fsspec <= 2026.9). DIR gets a .gitignore of its own, so it is never committed wherever it is made.
#
# --rehearse runs every step on the CPU at the smallest sizes (1,000 documents, vocabulary 1,024,
# tiny GPT preset for 4,096 tokens, LeNet-5 for one epoch of 1,024 images, GELU at 2^10 and 2^12,
# the ladder's first row at sequence 16): the install, the import check, the (CPU) build, each
# command line, the cuts and the results written as they come, before any GPU time is spent.
set -uo pipefail
START=$(date +%s)  # the budget's clock: install, unpacking and build count
CALLER=$PWD  # paths a user types mean what they meant there; the script works from the repository
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
TOOLS="$REPO/benchmarks/gpu_check_tools.py"
SHARED="$REPO/../shared/data"
ARGS="$*"
DATASETS=datasets==5.2.0
MODE=run PREP="" OUT="" MNIST=data TEXT=data/WebOfScience/WOS46985/X.txt GPT2TOK="" BUDGET=540 PYVER=3.12
REHEARSE=0 ONLY="" CAPS=""
STEPS="build lenet-torch tokenizer cuda-tests gelu-bench lenet-cpp lenet-lightning gpt-cold gpt-warm gpt-gpt2tok ladder report"
die() { echo "error: $1" >&2; exit "${2:-1}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --rehearse) REHEARSE=1; shift; continue ;;
        --prepare|--from|--out|--mnist|--text|--gpt2-tokenizer|--budget|--python|--only|--cap)
            [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value" 2 ;;
        *) die "unknown argument $1 (see the header of $0)" 2 ;;
    esac
    path=$2
    [[ $path == /* ]] || path="$CALLER/$path"
    case $1 in
        --prepare) MODE=prepare PREP=$path ;;
        --from) PREP=$path ;;
        --out) OUT=$path ;;
        --mnist) MNIST=$path ;;
        --text) TEXT=$path ;;
        --gpt2-tokenizer) GPT2TOK=$path ;;
        --budget) BUDGET=$2 ;;
        --python) PYVER=$2 ;;
        --only) ONLY=${2//,/ } ;;
        --cap) CAPS+=" $2" ;;
    esac
    shift 2
done
[[ $BUDGET =~ ^[0-9]+$ ]] && [ "$BUDGET" -gt 0 ] || die "--budget takes whole seconds > 0, not '$BUDGET'" 2
[[ $PYVER =~ ^3\.[0-9]+$ ]] || die "--python takes a version like 3.12, not '$PYVER'" 2
for s in $ONLY; do [[ " $STEPS " == *" $s "* ]] || die "--only: no step '$s' (steps: $STEPS)" 2; done
for c in $CAPS; do
    [[ $c =~ ^([a-z0-9-]+)=([0-9]+)$ ]] && [[ " $STEPS " == *" ${BASH_REMATCH[1]} "* ]] \
        || die "--cap takes STEP=SECONDS with a step of: $STEPS (not '$c')" 2
done

# ---------------------------------------------------------------------------- --prepare (here)
if [ "$MODE" = prepare ]; then
    # the inputs first: a missing file stops it before the download and before DIR is made
    src=${LAB5_MNIST:-$SHARED/MNIST/raw}
    corpus=${LAB5_TEXT:-$SHARED/wos-standin/X.txt}
    gpt2=${LAB5_GPT2_TOKENIZER:-$SHARED/gpt2-tokenizer}
    mnist_files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
    for f in $mnist_files; do
        [ -f "$src/$f.gz" ] || [ -f "$src/$f" ] || die "$src/$f not found (set LAB5_MNIST)"
    done
    [ -f "$corpus" ] || die "corpus $corpus not found (set LAB5_TEXT)"
    [ -f "$gpt2/tokenizer.json" ] || die "GPT-2's tokenizer $gpt2/tokenizer.json not found (set LAB5_GPT2_TOKENIZER)"
    [ ! -e "$PREP" ] || [ -z "$(ls -A "$PREP")" ] || die "$PREP is not empty: prepare into a new folder"
    mkdir -p "$PREP/wheels" "$PREP/MNIST/raw" "$PREP/gpt2-tokenizer"
    echo '*' > "$PREP/.gitignore"  # never committed, wherever DIR is
    python -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$PREP/wheels" "$DATASETS" 2>&1 | grep -v "^WARNING: Location" \
        ; [ "${PIPESTATUS[0]}" -eq 0 ] || die "pip download of $DATASETS for Python $PYVER failed"
    rm -f "$PREP"/wheels/numpy-*.whl "$PREP"/wheels/pyarrow-*.whl
    for f in $mnist_files; do
        if [ -f "$src/$f.gz" ]; then cp "$src/$f.gz" "$PREP/MNIST/raw/"; else gzip -c "$src/$f" > "$PREP/MNIST/raw/$f.gz"; fi
    done
    gzip -c "$corpus" > "$PREP/X.txt.gz"
    printf '%s\t%s\n' "$(realpath "$corpus")" "$(grep -c '[^[:space:]]' "$corpus")" > "$PREP/corpus_source.tsv"
    cp "$gpt2"/* "$PREP/gpt2-tokenizer/"
    size=$(du -sm "$PREP" | cut -f1)
    ls "$PREP/wheels"
    echo "prepared $PREP for Python $PYVER: ${size} MiB (limit 48)"
    [ "$size" -le 48 ] || die "$PREP is ${size} MiB, over the 48 MiB a device call can carry"
    exit 0
fi

# ---------------------------------------------------------------------------- the checks
# Everything a user can get wrong, before any work and before OUT is made.
[ -n "$OUT" ] || die "--out OUTDIR is required" 2
if [ "$REHEARSE" = 0 ]; then
    nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU here (nvidia-smi -L failed; --rehearse runs on a CPU)"
fi
[ ! -e "$OUT" ] || [ -z "$(ls -A "$OUT")" ] || die "$OUT is not empty: give a new or empty folder"
if [ -n "$PREP" ]; then
    for f in wheels MNIST/raw X.txt.gz corpus_source.tsv gpt2-tokenizer/tokenizer.json; do
        [ -e "$PREP/$f" ] || die "$PREP/$f not found: make DIR with --prepare"
    done
else
    [ -f "$TEXT" ] || die "corpus $TEXT not found (--text)"
    [ -z "$GPT2TOK" ] || [ -f "$GPT2TOK" ] || die "GPT-2 tokenizer $GPT2TOK not found (--gpt2-tokenizer)"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/gpu_check.log") 2>&1  # the whole console comes back too
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results" LOGS="$WORK/logs"
mkdir -p "$RESULTS" "$LOGS" "$WORK/runs"
: > "$WORK/steps.tsv"
# compile and micro-batch caches start cold; PYTHONPATH: the carried packages, never over the image's
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="$WORK/cache" PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
now() { echo $(( $(date +%s) - START )); }
say() { echo "[$(now) s] $*"; }

# What the run is, first: the versions that decide whether the extension gets CUDA kernels (nvcc
# where gelu_ext/setup.py looks too), and a CUDA major that differs from torch's said in one line.
NVCC=$("$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)
TORCH_CUDA=$(python -c 'import torch; print(torch.version.cuda or "")')
say "nvcc ${NVCC:-not found}; torch $(python -c 'import torch; print(torch.__version__)') with CUDA ${TORCH_CUDA:-none}"
[ -z "$NVCC" ] || [ -z "$TORCH_CUDA" ] || [ "${NVCC%%.*}" = "${TORCH_CUDA%%.*}" ] \
    || say "warning: nvcc's CUDA $NVCC and torch's $TORCH_CUDA differ in the major version: the build may lose CUDA"

if [ -n "$PREP" ]; then  # a bare machine: the carried packages it lacks, the data unpacked
    mapfile -t wheels < <(python "$TOOLS" missing-wheels "$PREP/wheels")
    if [ ${#wheels[@]} -gt 0 ]; then
        say "installing into $WORK/site (--no-deps): ${wheels[*]##*/}"
        python -m pip install -q --no-index --no-deps --target "$WORK/site" "${wheels[@]}" > "$LOGS/pip.log" 2>&1 \
            || say "pip install failed: $(tail -n 1 "$LOGS/pip.log")"
    fi
    MNIST="$PREP"  # lenet5.py looks in DIR and DIR/MNIST/raw
    IFS=$'\t' read -r CORPUS_SOURCE CORPUS_DOCS < "$PREP/corpus_source.tsv"
    # keep the source's folder name: the report tells the stand-in from WOS by it
    TEXT="$WORK/corpus/$(basename "$(dirname "$CORPUS_SOURCE")")/X.txt"
    mkdir -p "$(dirname "$TEXT")"
    gunzip -c "$PREP/X.txt.gz" > "$TEXT"
    GPT2TOK="$PREP/gpt2-tokenizer/tokenizer.json"
else
    CORPUS_SOURCE=$(realpath "$TEXT") CORPUS_DOCS=$(grep -c '[^[:space:]]' "$TEXT")
    [ -n "$GPT2TOK" ] || [ ! -f "$SHARED/gpt2-tokenizer/tokenizer.json" ] || GPT2TOK="$SHARED/gpt2-tokenizer/tokenizer.json"
fi
if [ "$REHEARSE" = 1 ]; then  # the smallest sizes: the first 1,000 documents, 1,024 images
    head -n 1000 "$TEXT" > "$WORK/small.txt"
    mkdir -p "$WORK/corpus-small/$(basename "$(dirname "$TEXT")")"
    TEXT="$WORK/corpus-small/$(basename "$(dirname "$TEXT")")/X.txt"
    mv "$WORK/small.txt" "$TEXT"
    python "$TOOLS" mnist-subset "$MNIST" "$WORK/mnist-small" 1024 256 || die "MNIST files missing under $MNIST"
    MNIST="$WORK/mnist-small"
fi

if [ "$REHEARSE" = 1 ]; then GPU=rehearsal_cpu; else
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -c 'A-Za-z0-9\n' '_' | tr -s '_')
    nvidia-smi > "$LOGS/nvidia-smi-idle.txt"
fi
python - "$WORK/facts.json" "$GPU" "$NVCC" "$CORPUS_SOURCE" "$CORPUS_DOCS" "$TEXT" "$BUDGET" "$REHEARSE" "$ARGS" <<'EOF'
import json, platform, sys, time, torch
out, gpu, nvcc, source, docs, text, budget, rehearse, argv = sys.argv[1:]
json.dump({"gpu": gpu, "rehearsal": rehearse == "1", "budget_seconds": int(budget),
           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
           "command": "bash benchmarks/gpu_check.sh " + argv, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "nvcc": nvcc or None,
           # what the corpus is, not what it is called: a stand-in must never be quoted as WOS
           "corpus": {"source": source, "documents": int(docs), "used": text}}, open(out, "w"), indent=2)
EOF

# publish: OUT as it stands after a step (each file written beside and renamed, so a kill mid-write
# leaves the previous one); at most 5 files plus one .tmp.
publish() {
    python "$TOOLS" results "$WORK" "$OUT/results.json"
    tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK" logs && mv -f "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
    (cd "$WORK" && find runs \( -name 'events.out.tfevents.*' -o -name '*.json' \) -not -path '*ckpt*' -print0 \
        | tar -czf "$OUT/runs.tar.gz.tmp" --null -T -) && mv -f "$OUT/runs.tar.gz.tmp" "$OUT/runs.tar.gz"
    if [ -d "$WORK/report" ]; then
        tar -czf "$OUT/report.tar.gz.tmp" -C "$WORK" report && mv -f "$OUT/report.tar.gz.tmp" "$OUT/report.tar.gz"
    fi
}
record() { printf '%s\t%s\t%s\n' "$1" "$2" "${3:-}" >> "$WORK/steps.tsv"; say "$1: $2"; publish; }

# nvidia-smi beside a training: every 250 ms into a CSV, and the full snapshot at the highest
# utilisation seen (checked every 2 s) — the handout's screenshot, taken during training.
smi_start() {
    [ "$REHEARSE" = 0 ] || return 0
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm \
        --format=csv -lms 250 > "$LOGS/nvidia-smi-$1.csv" 2>&1 &
    SMI_PIDS="$!"
    ( best=-1; while sleep 2; do
          snap=$(nvidia-smi) || break
          util=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -n 1)
          [[ $util =~ ^[0-9]+$ ]] && [ "$util" -ge "$best" ] && { best=$util; echo "$snap" > "$LOGS/nvidia-smi-during-$1.txt"; }
      done ) &
    SMI_PIDS="$SMI_PIDS $!"
}
smi_stop() { [ -z "${SMI_PIDS:-}" ] || kill $SMI_PIDS 2>/dev/null; SMI_PIDS=""; }

SKIP=""  # step<TAB>why, from the import check
RESERVE=30  # kept for the report and the last publish; a sixth of a small budget
[ "$RESERVE" -le $(( BUDGET / 6 )) ] || RESERVE=$(( BUDGET / 6 ))

# step NAME CAP [--smi] [--bg] CMD...: CMD under timeout at min(CAP, what the budget leaves), its
# output in logs/NAME.log; then (--bg: at `finish NAME`) one line with its status, and OUT brought up
# to date.
declare -A PID T0 CAP
step() {
    local name=$1 cap=$2 smi="" bg="" left why
    shift 2
    while [ "$1" = --smi ] || [ "$1" = --bg ]; do [ "$1" = --smi ] && smi=1 || bg=1; shift; done
    [ -z "$ONLY" ] || [[ " $ONLY " == *" $name "* ]] || { record "$name" "skipped: not asked (--only)"; return; }
    why=$(awk -F'\t' -v s="$name" '$1 == s { print $2 }' <<< "$SKIP")
    [ -z "$why" ] || { record "$name" "skipped: $why"; return; }
    for c in $CAPS; do [ "${c%%=*}" = "$name" ] && cap=${c#*=}; done
    left=$(( BUDGET - $(now) ))
    [ "$name" = report ] || left=$(( left - RESERVE ))
    [ "$left" -ge 5 ] || { record "$name" "skipped: budget spent (${left} s left of ${BUDGET} s)"; return; }
    [ "$left" -lt "$cap" ] && cap=$left
    say "$name: start (cap ${cap} s)"
    [ -z "$smi" ] || smi_start "$name"
    T0[$name]=$(date +%s) CAP[$name]=$cap
    timeout -k 5 "$cap" "$@" > "$LOGS/$name.log" 2>&1 &
    PID[$name]=$!
    [ -n "$bg" ] || finish "$name"
}
finish() {
    local name=$1 rc seconds
    [ -n "${PID[$name]:-}" ] || return 0  # skipped: already recorded
    wait "${PID[$name]}"; rc=$?
    smi_stop
    seconds=$(( $(date +%s) - T0[$name] ))
    tail -n 3 "$LOGS/$name.log" | cut -c1-300 | sed 's/^/    /'
    case $rc in
        0) record "$name" ok "$seconds" ;;
        124|137) record "$name" "cut at $(( T0[$name] - START + CAP[$name] )) s (cap ${CAP[$name]} s)" "$seconds" ;;
        *) record "$name" "failed (exit $rc): $(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-200)" "$seconds" ;;
    esac
}

# The extension, built in a copy of its sources and moved into gelu_ext/ by a rename (a process that
# has the old one loaded keeps it), for this GPU only. CPU-only is said in one line (the step's status).
build() {
    rm -rf "$WORK/gelu_ext-src" && cp -r gelu_ext "$WORK/gelu_ext-src" && rm -f "$WORK"/gelu_ext-src/_C.*.so || return 1
    (cd "$WORK/gelu_ext-src" && unset TORCH_CUDA_ARCH_LIST && python setup.py -q build_ext --inplace) || return 1
    local so
    so=$(ls "$WORK"/gelu_ext-src/_C.*.so) || return 1
    cp "$so" "gelu_ext/.${so##*/}.tmp" && mv -f "gelu_ext/.${so##*/}.tmp" "gelu_ext/${so##*/}"
    python -c 'import sys, torch, gelu_ext
if gelu_ext.built_with_cuda():
    print("gelu_ext: CPU + CUDA kernels")
else:  # where there is a GPU, a step that failed: the CUDA tests and benchmark need the kernels
    print(f"gelu_ext: CPU-only build (no usable nvcc for torch CUDA {torch.version.cuda})")
    sys.exit(torch.cuda.is_available())'
}
# The rehearsal runs the same build but leaves an existing extension in place: others may be using it.
rehearse_build() {
    local so
    so=$(python -c 'import sysconfig; print("_C" + sysconfig.get_config_var("EXT_SUFFIX"))')
    if [ -f "gelu_ext/$so" ]; then
        rm -rf "$WORK/gelu_ext-src" && cp -r gelu_ext "$WORK/gelu_ext-src" && rm -f "$WORK"/gelu_ext-src/_C.*.so \
            && (cd "$WORK/gelu_ext-src" && GELU_EXT_CPU_ONLY=1 python setup.py -q build_ext --inplace) \
            && echo "rehearsal: built in $WORK/gelu_ext-src; gelu_ext/$so left in place"
    else build; fi
}
lenet() {  # lenet NAME FLAGS...
    local name=$1; shift
    python lenet5.py --data-dir "$MNIST" --no-download --out-dir "$WORK/runs/lenet5/$GPU-$name" \
        --metrics-out "$RESULTS/lenet_run_${name}_$GPU.json" "${SMALL_LENET[@]}" "$@"
}
gpt() {  # gpt NAME FLAGS...: the cold run's compile cache is the warm run's
    local name=$1; shift
    python gpt_train.py --text "$TEXT" --cache-dir "$WORK/data-cache" --compile-cache "$WORK/compile-cache" \
        --ckpt-every 0 --out-dir "$WORK/runs/gpt/$GPU-$name" --metrics-out "$RESULTS/gpt_run_${name}_$GPU.json" \
        "${SMALL_GPT[@]}" "$@"
}
report() {
    local runs=()
    for d in "$WORK/runs/lenet5/$GPU-torch" "$WORK/runs/gpt/$GPU-$NAME12M-cold"; do [ -d "$d" ] && runs+=("$d"); done
    python report/make_report.py "${runs[@]}" --runs-root "$WORK/runs" --results "$RESULTS" --gpu-logs "$LOGS" \
        --out "$WORK/report" --no-screenshots
}
export -f build rehearse_build lenet gpt report
export REPO WORK RESULTS GPU MNIST TEXT TOOLS

if [ "$REHEARSE" = 1 ]; then
    SMALL_LENET=(--epochs 1 --device cpu)
    SMALL_GPT=(--preset tiny --tokens 4096 --val-batches 2)
    SMALL_LADDER=(--seq-len 16 --micro-batch 1 --vocab-size 64 --warmup 1 --steps 1 --only 1)
    SMALL_TOK=(--vocab-size 1024 --seq-len 64)  # the tiny preset's: gpt_train reads the cache it writes
    GELU=(--device cpu --log2 10 12 --repeats 2) TESTS=(-k cuda)
    BUILD=rehearse_build NAME12M=4K
    # the steps use the extension already built here, if there is one: then its rehearsal build comes
    # last, so that on a small login node it does not take their CPU
    BUILD_AT=first
    python -c 'import sys, gelu_ext; sys.exit(not gelu_ext.is_built())' 2>/dev/null && BUILD_AT=last
else
    SMALL_LENET=() SMALL_GPT=() SMALL_LADDER=() SMALL_TOK=() GELU=(--device cuda) TESTS=()
    BUILD=build NAME12M=12M BUILD_AT=first
fi
export NAME12M
# arrays do not cross `bash -c`: pass them as strings the functions split again
export SMALL_LENET_S="${SMALL_LENET[*]}" SMALL_GPT_S="${SMALL_GPT[*]}"

# Every step's imports, checked once before the first step: a step that cannot import is skipped
# with the reason, the others run. Modules imported inside functions are named here too.
say "checking requirements and imports"
python "$TOOLS" requirements datasets > "$LOGS/requirements.log" 2>&1 \
    || say "datasets' requirements not met: $(paste -sd ';' "$LOGS/requirements.log")"
imports=(build=torch,setuptools cuda-tests=pytest,torch gelu-bench=gelu_bench lenet-torch=lenet5 lenet-cpp=lenet5
         lenet-lightning=lenet5,lightning tokenizer=tokenizer_train,datasets gpt-cold=gpt_train,datasets
         gpt-warm=gpt_train,datasets gpt-gpt2tok=gpt_train,datasets ladder=gpt_bench report=make_report,matplotlib)
asked=()
for i in "${imports[@]}"; do [ -z "$ONLY" ] || [[ " $ONLY " == *" ${i%%=*} "* ]] && asked+=("$i"); done
SKIP=$(python "$TOOLS" imports "${asked[@]}" 2> "$LOGS/imports.log" | grep -v $'\tok$')
[ -z "$SKIP" ] && say "imports: all steps ok" || say "imports missing: $(cut -f2 <<< "$SKIP" | sort -u | paste -sd ';')"
[ -n "$GPT2TOK" ] || SKIP+=$'\n'"gpt-gpt2tok"$'\t'"no GPT-2 tokenizer (--gpt2-tokenizer or --from DIR)"
publish

# Most valuable first; caps are about twice an H200's time for each (the first H200 call: 284 s in all).
# The build runs beside the steps that do not need the extension (two compiler processes of 16 cores),
# niced so that the steps measured meanwhile keep their CPU.
[ "$BUILD_AT" = last ] || step build 150 --bg nice -n 10 bash -c "$BUILD"
step lenet-torch 60 --smi bash -c 'SMALL_LENET=($SMALL_LENET_S); lenet torch --act torch'
step tokenizer 90 python tokenizer_train.py --text "$TEXT" --out "$WORK/tokenizer.json" --force \
    --compare "${GPT2TOK:-none}" --cache-dir "$WORK/data-cache" --metrics-out "$RESULTS/tokenizer_$GPU.json" \
    "${SMALL_TOK[@]}"
finish build
step cuda-tests 130 python -m pytest -q -p no:cacheprovider tests/test_gelu_ext.py "${TESTS[@]}"
step gelu-bench 90 python benchmarks/gelu_bench.py "${GELU[@]}" --metrics-out "$RESULTS/gelu_bench_$GPU.json"
step lenet-cpp 60 --smi bash -c 'SMALL_LENET=($SMALL_LENET_S); lenet cpp --act cpp'
step lenet-lightning 75 --smi bash -c 'SMALL_LENET=($SMALL_LENET_S); lenet lightning --engine lightning'
step gpt-cold 150 --smi bash -c "SMALL_GPT=(\$SMALL_GPT_S); gpt $NAME12M-cold --tokenizer '$WORK/tokenizer.json'"
step gpt-warm 100 --smi bash -c "SMALL_GPT=(\$SMALL_GPT_S); gpt $NAME12M-warm --tokenizer '$WORK/tokenizer.json'"
step gpt-gpt2tok 120 --smi bash -c "SMALL_GPT=(\$SMALL_GPT_S); gpt $NAME12M-gpt2tok --tokenizer '$GPT2TOK'"
# one repeat a row; gpt_bench.py rewrites its JSON after every row, so a cut keeps the rows done
step ladder 600 python benchmarks/gpt_bench.py --repeats 1 --metrics-out "$RESULTS/gpt_bench_$GPU.json" \
    "${SMALL_LADDER[@]}"
[ "$BUILD_AT" = first ] || step build 600 bash -c "$BUILD"
for n in gpt-cold gpt-warm lenet-torch; do  # the report's nvidia-smi figure: one taken during training
    [ ! -f "$LOGS/nvidia-smi-during-$n.txt" ] || { cp "$LOGS/nvidia-smi-during-$n.txt" "$LOGS/nvidia-smi.txt"; break; }
done
step report 60 bash -c report

# exit 0 only when every step asked for is ok
failed=$(awk -F'\t' '$2 != "ok" && $2 !~ /^skipped: not asked/' "$WORK/steps.tsv" | wc -l)
say "done: $(awk -F'\t' '$2 == "ok"' "$WORK/steps.tsv" | wc -l) steps ok, $failed not; OUT: $(ls "$OUT" | paste -sd ' ')"
[ "$failed" -eq 0 ]
