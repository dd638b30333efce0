#!/bin/bash
# Every GPU-side check and measurement in one call, made for the lent H200, in the order a TA grades them:
# the 12M-token GPT run as a student runs it (slurm/gpt.sh with its defaults, after the tokenizer step as
# tokenizer.sh, caches cold: no compile cache, no micro-batch probe), end to end, its job time from here;
# LeNet-5 with --act torch and --act cpp (the gelu_ext build for this GPU runs beside the first steps);
# nvidia-smi during each training; compile off vs regional, cold and warm, 2 repeats each; the ladder's key
# rows, 3 interleaved repeats, the default step profiled; fp16 + GradScaler, the CUDA tests, GPT-2's
# vocabulary, GELU bandwidth; the report. Every GPT run reads the tokenizer step's token cache.
#
#   bash benchmarks/gpu_check.sh --prepare DIR [--python 3.12]   here: what a bare machine lacks (<= 48 MiB)
#   bash benchmarks/gpu_check.sh --from DIR --out OUT [--budget S] [--only a,b]   there: offline install, steps
#   bash benchmarks/gpu_check.sh --out OUT [--mnist D] [--text X.txt] [--gpt2-tokenizer F]   a GPU node
#   bash benchmarks/gpu_check.sh --rehearse [--from DIR] --out OUT [--budget S]   the same plumbing on a CPU
#
# So that a call cut short still leaves everything finished so far, OUT holds results.json (an entry per
# step: ok, cut at N s, failed: why, skipped: why, interrupted; every result so far; `clocks`: each GPT and
# LeNet-5 run's wall time from this shell beside its own `process_seconds` and `phases`), logs.tar.gz,
# runs.tar.gz (TensorBoard events, run metrics), report.tar.gz and gpu_check.log, each rewritten as soon as
# a step ends (benchmarks/README.md: which file holds which figure). results.json exists before anything
# that could hang; everything before the first step runs under `timeout`. The --budget clock (default
# 540 s; 900 s rehearsed) starts at once; each step runs under `timeout` in its own process group at the
# smaller of its cap and what the budget leaves (less the report's reserve). The plan line first says
# what fits (each step's seconds on the 2026-11-30 H200; ~: estimated) and what is cut; the last line is
# the `--only` second call for what was cut or failed, at the budget a warm machine has left. OUT is
# locked (a second call into it refuses); Ctrl-C or TERM stops the running steps' process groups,
# records the interruption and exits.
#
# `python` and `python3` are exec wrappers of the interpreter that imports torch (slurm/gpt.sh calls
# `python`; a link to a venv's python3, the lent image's, would start its base interpreter without torch).
#
# --prepare DIR (default Python 3.12, the lent image's) carries wheels of datasets and its
# dependencies but numpy and pyarrow (torch and the image bring those), MNIST as .gz, the corpus
# gzipped with its source path and document count, GPT-2's tokenizer files, and prep.txt: the Python
# and platform the wheels are for (--from on another one stops at once). There, the whole folder is
# checked (every gzip, every wheel's zip, the corpus source line) before anything runs; only the
# wheels of packages the machine lacks are installed, with --no-deps into a folder of the run's own
# (PYTHONPATH), never over the image's packages, then their requirements checked (pip check); every
# step's imports are checked in one go, and a step whose imports fail is skipped with the reason. The
# datasets version is pinned to one whose requirements the lent image satisfies (pyarrow >= 24,
# huggingface-hub >= 1.31, fsspec <= 2026.9). DIR gets a .gitignore of its own, so it is never
# committed wherever it is made.
#
# --rehearse runs every step on the CPU at the smallest sizes (1,000 documents, vocabulary 1,024,
# tiny GPT preset for 4,096 tokens, fp32 where the GPU runs fp16, LeNet-5 for one epoch of 1,024
# images, GELU at 2^10 and 2^12, the ladder at sequence 16, the warm compile pair alone), with python3 a
# venv's first on PATH as the image has it (made once under ~/.cache/lab5: torch only through its
# pyvenv.cfg): the install, the checks, the build (with its CUDA kernels where nvcc is, for
# TORCH_CUDA_ARCH_LIST or sm90, checked compiled in: no device needed), each command line, the cuts and
# the results written as they come, before any GPU time is spent.
set -uo pipefail
START=$(date +%s)  # the budget's clock: install, unpacking and build count
CALLER=$PWD  # paths a user types mean what they meant there; the script works from the repository
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
TOOLS="$REPO/benchmarks/gpu_check_tools.py"
SHARED="$REPO/../shared/data"
ARGS="$*"
DATASETS=datasets==5.2.0
MODE=run PREP="" OUT="" MNIST=data TEXT=data/WebOfScience/WOS46985/X.txt GPT2TOK="" BUDGET="" PYVER=3.12
REHEARSE=0 ONLY="" CAPS=""
PRE=${GPU_CHECK_PRE_TIMEOUT:-30}  # seconds for each command before the first step (nvidia-smi, torch's import)
# The plan, in the order a TA grades: step, expected seconds on the 2026-11-30 H200 (~: estimated, never
# run there), cap (about twice that). Made for the lent H200 (141 GB): elsewhere the caps may cut the GPT
# steps (a line says so; --cap raises them). The build runs beside the first steps. The last runs only
# when asked (--only).
PLAN="tokenizer 21 90|gpt-own-vocab 43 120|build 0 240|lenet-torch 18 60|lenet-cpp ~20 60\
|gpt-own-vocab-regional-compile 56 150|compile-ab ~270 400|ladder ~150 300|gpt-own-vocab-fp16 ~45 120\
|cuda-tests 80 150|gpt-gpt2-vocab 57 150|gelu-bench ~30 90|lenet-lightning ~30 75|report ~20 60"
STEPS=$(tr '|' '\n' <<< "$PLAN" | cut -d' ' -f1 | paste -sd ' ')
ON_REQUEST="lenet-lightning"
die() { echo "error: $1" >&2; exit "${2:-1}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --rehearse) REHEARSE=1; shift; continue ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;  # this header
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
[ -n "$BUDGET" ] || BUDGET=$(( REHEARSE ? 900 : 540 ))  # a CPU compiles for minutes
[[ $BUDGET =~ ^[0-9]+$ ]] && [ "$BUDGET" -gt 0 ] || die "--budget takes whole seconds > 0, not '$BUDGET'" 2
[[ $PYVER =~ ^3\.[0-9]+$ ]] || die "--python takes a version like 3.12, not '$PYVER'" 2
for s in $ONLY; do [[ " $STEPS " == *" $s "* ]] || die "--only: no step '$s' (steps: $STEPS)" 2; done
for c in $CAPS; do
    [[ $c =~ ^([a-z0-9-]+)=([0-9]+)$ ]] && [[ " $STEPS " == *" ${BASH_REMATCH[1]} "* ]] \
        || die "--cap takes STEP=SECONDS with a step of: $STEPS (not '$c')" 2
done
# the GPT steps need the own tokenizer: asked for without it, it comes along (about 20 s)
[[ " $ONLY " =~ \ (gpt-own-vocab|compile-ab) && " $ONLY " != *" tokenizer "* ]] && ONLY="tokenizer $ONLY"
[ -n "$ONLY" ] || ONLY=$(for s in $STEPS; do [[ " $ON_REQUEST " == *" $s "* ]] || echo "$s"; done | paste -sd ' ')

# ---------------------------------------------------------------------------- --prepare (here)
if [ "$MODE" = prepare ]; then
    PY=$(command -v python3 || command -v python) || die "no python3 or python here"
    # the inputs first: a missing file stops it before the download and before DIR is made
    src=${LAB5_MNIST:-$SHARED/MNIST/raw}
    corpus=${LAB5_TEXT:-$SHARED/wos-standin/X.txt}
    gpt2=${LAB5_GPT2_TOKENIZER:-$SHARED/gpt2-tokenizer}
    mnist_files="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
    for f in $mnist_files; do
        [ -f "$src/$f.gz" ] || [ -f "$src/$f" ] || die "$src/$f not found (set LAB5_MNIST)"
    done
    [ -f "$corpus" ] || die "corpus $corpus not found (set LAB5_TEXT)"
    [[ $(realpath "$corpus") != *$'\t'* ]] || die "corpus path $corpus holds a tab: copy it elsewhere"
    [ -f "$gpt2/tokenizer.json" ] || die "GPT-2's tokenizer $gpt2/tokenizer.json not found (set LAB5_GPT2_TOKENIZER)"
    [ ! -e "$PREP" ] || [ -z "$(ls -A "$PREP")" ] || die "$PREP is not empty: prepare into a new folder"
    mkdir -p "$PREP/wheels" "$PREP/MNIST/raw" "$PREP/gpt2-tokenizer"
    echo '*' > "$PREP/.gitignore"  # never committed, wherever DIR is
    "$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
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
    printf 'python %s\nplatform linux-x86_64\n' "$PYVER" > "$PREP/prep.txt"  # what the wheels are for
    size=$(du -sm "$PREP" | cut -f1)
    ls "$PREP/wheels"
    echo "prepared $PREP for Python $PYVER: ${size} MiB (limit 48)"
    [ "$size" -le 48 ] || die "$PREP is ${size} MiB, over the 48 MiB a device call can carry"
    exit 0
fi

# ---------------------------------------------------------------------------- the checks
# Everything a user can get wrong, in seconds, before any work and before OUT is made.
[ -n "$OUT" ] || die "--out OUTDIR is required" 2
if [ "$REHEARSE" = 0 ]; then
    timeout -k 2 "$PRE" nvidia-smi -L >/dev/null 2>&1; rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || die "nvidia-smi -L did not answer in $PRE s: the GPU or its driver hangs"
    [ $rc -eq 0 ] || die "no NVIDIA GPU here (nvidia-smi -L failed; --rehearse runs on a CPU)"
fi
[ ! -e "$OUT" ] || [ -z "$(ls -A "$OUT")" ] || die "$OUT is not empty: give a new or empty folder"
# the interpreter that holds torch: python3 on the lent image, else python (found, not imported: an import
# takes seconds; torch is imported once, below, where its versions are read)
PY=""
for p in python3 python; do
    command -v "$p" >/dev/null && timeout -k 2 "$PRE" "$p" -c \
        'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null \
        && { PY=$(command -v "$p"); break; }
done
[ -n "$PY" ] || die "neither python3 nor python has torch here (in $PRE s)"
if [ "$REHEARSE" = 1 ]; then  # python3 as the lent image has it: a venv's, first on PATH
    { read -r VENV; read -r VENV_NOTE; } < <(timeout -k 2 $(( PRE * 4 )) "$PY" "$TOOLS" rehearsal-venv \
        "${XDG_CACHE_HOME:-$HOME/.cache}/lab5" 2>&1)
    [ -x "${VENV:-}/python3" ] || die "no rehearsal venv: ${VENV:-} ${VENV_NOTE:-}"
    PATH="$VENV:$PATH" PY="$VENV/python3"
fi
if [ -n "$PREP" ]; then  # every file of DIR whole, and made for this Python: one line, not a late traceback
    why=$(timeout -k 2 $(( PRE * 2 )) "$PY" "$TOOLS" check-prep "$PREP" 2>&1) \
        || die "${why:-checking $PREP took over $(( PRE * 2 )) s}"
else
    [ -f "$TEXT" ] || die "corpus $TEXT not found (--text)"
    [ -z "$GPT2TOK" ] || [ ! -d "$GPT2TOK" ] || GPT2TOK="$GPT2TOK/tokenizer.json"  # a folder as data/gpt2-tokenizer/
    [ -z "$GPT2TOK" ] || [ -f "$GPT2TOK" ] || die "GPT-2 tokenizer $GPT2TOK not found (--gpt2-tokenizer)"
fi

# OUT: made and locked (a second gpu_check.sh into it refuses; the lock goes with this process)
mkdir -p "$OUT" || die "cannot make $OUT"
OUT=$(cd "$OUT" && pwd)
exec 9<"$OUT"
if command -v flock >/dev/null; then
    flock -n 9 || die "$OUT is in use by another gpu_check.sh: give another --out (its results are left as they are)"
fi
[ -z "$(ls -A "$OUT")" ] || die "$OUT is not empty: give a new or empty folder"
printf '{"started": "%s", "budget_seconds": %s, "steps": []}\n' "$(date -u +%FT%TZ)" "$BUDGET" > "$OUT/results.json"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1  # the whole console comes back too
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results" LOGS="$WORK/logs"
mkdir -p "$RESULTS" "$LOGS" "$WORK/runs"
: > "$WORK/steps.jsonl"
# caches start cold; PYTHONPATH: the carried packages, never over the image's; `python` (slurm/gpt.sh's) and
# `python3` are the interpreter that imports torch: a script that execs it by its own path, never a link (a
# venv's python3 linked from another folder finds no pyvenv.cfg and starts as its base, without torch)
mkdir -p "$WORK/bin"
for p in python python3; do printf '#!/bin/bash\nexec %q "$@"\n' "$PY" > "$WORK/bin/$p" && chmod +x "$WORK/bin/$p"; done
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR  # the compile caches go with XDG_CACHE_HOME (gpt() below)
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="$WORK/cache" PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" \
    PATH="$WORK/bin:$PATH"
now() { echo $(( $(date +%s) - START )); }
say() { echo "[$(now) s] $*"; }
pre() {  # pre SECONDS CMD...: a command before the first step, cut (and said) if it hangs
    local s=$1 rc
    shift
    timeout -k 2 "$s" "$@"; rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || say "cut after $s s: ${*:0:3}" >&2
    return $rc
}

# publish: OUT as it stands after a step (each file written beside and renamed, so a kill mid-write
# leaves the previous one); at most 5 files plus one .tmp.
publish() {
    pre "$PRE" "$PY" "$TOOLS" results "$WORK" "$OUT/results.json"
    local d pick
    for d in logs runs report; do  # of runs/: the TensorBoard events and the JSON, no checkpoints
        pick=() && [ "$d" = runs ] && pick=(\( -name 'events.out.tfevents.*' -o -name '*.json' \) -not -path '*ckpt*')
        [ -d "$WORK/$d" ] && (cd "$WORK" && find "$d" -type f "${pick[@]}" -print0 \
            | tar -czf "$OUT/$d.tar.gz.tmp" --null -T -) && mv -f "$OUT/$d.tar.gz.tmp" "$OUT/$d.tar.gz"
    done
}
# record NAME STATUS [SECONDS]: one JSON line (any byte of a message survives), said, published
record() { pre "$PRE" "$PY" "$TOOLS" record "$WORK" "$1" "$2" "${3:-}"; say "$1: $2"; publish; }

# nvidia-smi beside a training: every 250 ms into a CSV, and the full snapshot at the highest
# utilisation seen once the step's log shows its training loop (checked every 0.25 s): the handout's
# screenshot, taken during training, never during the start-up.
smi_start() {  # smi_start NAME PATTERN
    [ "$REHEARSE" = 0 ] || return 0
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm \
        --format=csv -lms 250 > "$LOGS/nvidia-smi-$1.csv" 2>&1 &
    SMI_PIDS="$!"
    ( best=-1; while sleep 0.25; do
          grep -aqE "$2" "$LOGS/$1.log" 2>/dev/null || continue
          snap=$(timeout 5 nvidia-smi) || break
          util=$(timeout 5 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -n 1)
          [[ $util =~ ^[0-9]+$ ]] && [ "$util" -ge "$best" ] && { best=$util; echo "$snap" > "$LOGS/nvidia-smi-during-$1.txt"; }
      done ) &
    SMI_PIDS="$SMI_PIDS $!"
}
smi_stop() { [ -z "${SMI_PIDS:-}" ] || kill $SMI_PIDS 2>/dev/null; SMI_PIDS=""; }

SKIP=""  # step<TAB>why, from the import check
RESERVE=30  # kept for the report and the last publish; a sixth of a small budget
[ "$RESERVE" -le $(( BUDGET / 6 )) ] || RESERVE=$(( BUDGET / 6 ))

# step NAME CAP [--smi PATTERN] [--bg] CMD...: CMD under timeout (its own process group) at min(CAP,
# what the budget leaves), its output in logs/NAME.log; then (--bg: at `finish NAME`) one line with its
# status, and OUT brought up to date.
declare -A PID T0 CAP
RUNNING=""
step() {
    local name=$1 cap=$2 smi="" bg="" left why
    shift 2
    while [ "$1" = --smi ] || [ "$1" = --bg ]; do
        if [ "$1" = --smi ]; then smi=$2; shift 2; else bg=1; shift; fi
    done
    [[ " $ONLY " == *" $name "* ]] || { record "$name" "skipped: not asked (--only)"; return; }
    why=$(awk -F'\t' -v s="$name" '$1 == s { print $2 }' <<< "$SKIP")
    [ -z "$why" ] || { record "$name" "skipped: $why"; return; }
    for c in $CAPS; do [ "${c%%=*}" = "$name" ] && cap=${c#*=}; done
    left=$(( BUDGET - $(now) ))
    [ "$name" = report ] || left=$(( left - RESERVE ))
    [ "$left" -ge 5 ] || { record "$name" "skipped: budget spent (${left} s left of ${BUDGET} s)"; return; }
    [ "$left" -lt "$cap" ] && cap=$left
    say "$name: start (cap ${cap} s)"
    T0[$name]=$(date +%s) CAP[$name]=$cap
    timeout -k 5 "$cap" "$@" > "$LOGS/$name.log" 2>&1 9<&- &
    PID[$name]=$! RUNNING+=" $name"
    [ -z "$smi" ] || smi_start "$name" "$smi"
    [ -n "$bg" ] || finish "$name"
}
finish() {
    local name=$1 rc seconds
    [ -n "${PID[$name]:-}" ] || return 0  # skipped: already recorded
    wait "${PID[$name]}"; rc=$?
    RUNNING=${RUNNING/ $name/}
    [ "$name" = build ] || smi_stop
    seconds=$(( $(date +%s) - T0[$name] ))
    tail -n 3 "$LOGS/$name.log" | cut -c1-300 | sed 's/^/    /'
    case $rc in
        0) record "$name" ok "$seconds" ;;
        124|137) record "$name" "cut at $(( T0[$name] - START + CAP[$name] )) s (cap ${CAP[$name]} s)$(cut_note "$name")" \
                        "$seconds" ;;
        *) record "$name" "failed (exit $rc): $(grep -av '^\s*$' "$LOGS/$name.log" | tail -n 1 | cut -c1-200)" "$seconds" ;;
    esac
}
cut_note() {  # the ladder is cut by design: how far it got
    [ "$1" = ladder ] || return 0
    "$PY" -c 'import json, sys
try:
    m = json.load(open(sys.argv[1]))
    print(": %d of %d rows measured (the ladder takes what the budget leaves)" % (len(m["rungs"]), m["rows_planned"]))
except Exception:
    print(": no row measured")' "$RESULTS/gpt_bench_$GPU.json" 2>/dev/null
}

# Ctrl-C or TERM: the running steps' process groups stopped (timeout leads each), the interruption
# recorded, OUT brought up to date; then exit.
interrupted() {
    local sig=$1 code=$2 n
    trap '' INT TERM
    smi_stop
    for n in $RUNNING; do kill -TERM -- "-${PID[$n]}" 2>/dev/null; done
    sleep 2
    for n in $RUNNING; do kill -KILL -- "-${PID[$n]}" 2>/dev/null; done
    for n in $RUNNING; do
        "$PY" "$TOOLS" record "$WORK" "$n" "interrupted by SIG$sig" "$(( $(date +%s) - T0[$n] ))"
    done
    printf 'SIG%s at %s s\n' "$sig" "$(now)" > "$WORK/interrupted"
    say "interrupted by SIG$sig; steps stopped:${RUNNING:- none}"
    publish
    exit "$code"
}
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM

# What the run is, first: the versions that decide whether the extension gets CUDA kernels (nvcc
# where gelu_ext/setup.py looks too), and a CUDA major that differs from torch's said in one line.
NVCC=$(pre "$PRE" "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)
read -r TORCH TORCH_CUDA < <(pre "$PRE" python -c 'import torch; print(torch.__version__, torch.version.cuda or "")')
[ -n "${TORCH:-}" ] || die "$WORK/bin/python (slurm/gpt.sh's python, exec $PY) does not import torch"
say "python (exec $PY): nvcc ${NVCC:-not found}; torch $TORCH with CUDA ${TORCH_CUDA:-none}"
[ -z "${VENV_NOTE:-}" ] || say "$VENV_NOTE"
[ -z "$NVCC" ] || [ -z "$TORCH_CUDA" ] || [ "${NVCC%%.*}" = "${TORCH_CUDA%%.*}" ] \
    || say "warning: nvcc's CUDA $NVCC and torch's $TORCH_CUDA differ in the major version: the build may lose CUDA"
if [ "$REHEARSE" = 1 ]; then GPU=rehearsal_cpu; else
    GPU=$(pre "$PRE" nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr -c 'A-Za-z0-9\n' '_' | tr -s '_')
    GPU=${GPU:-unknown_GPU}
    pre "$PRE" nvidia-smi > "$LOGS/nvidia-smi-idle.txt"
    MEM=$(pre "$PRE" nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
    say "made for the lent H200 (141 GB): 12M-token GPT runs, caps and expected seconds measured there"
    [[ ${MEM:-0} =~ ^[0-9]+$ ]] && [ "${MEM:-0}" -ge 80000 ] || say "warning: $GPU has ${MEM:-?} MiB: expect its GPT \
steps cut at their caps (--cap STEP=SECONDS raises one); its graded figure is slurm/gpt.sh's own run (README step 5)"
fi
if [ -n "$PREP" ]; then
    IFS=$'\t' read -r CORPUS_SOURCE CORPUS_DOCS < "$PREP/corpus_source.tsv"
else
    CORPUS_SOURCE=$(realpath "$TEXT") CORPUS_DOCS=$(grep -c '[^[:space:]]' "$TEXT")
fi
pre "$PRE" "$PY" "$TOOLS" facts "$WORK" "$GPU" "$NVCC" "$CORPUS_SOURCE" "$CORPUS_DOCS" "$BUDGET" "$REHEARSE" \
    "$ARGS" "$PY" "$TORCH" "$TORCH_CUDA"
publish

if [ -n "$PREP" ]; then  # a bare machine: the carried packages it lacks, the data unpacked
    mapfile -t wheels < <(pre "$PRE" "$PY" "$TOOLS" missing-wheels "$PREP/wheels")
    if [ ${#wheels[@]} -gt 0 ]; then
        say "installing into $WORK/site (--no-deps): ${wheels[*]##*/}"
        pre 120 "$PY" -m pip install -q --no-index --no-deps --target "$WORK/site" "${wheels[@]}" > "$LOGS/pip.log" 2>&1 \
            || say "pip install failed: $(tail -n 1 "$LOGS/pip.log")"
        # --no-deps: what the installed wheels need, checked by pip against the image and the run's folder
        pre 120 "$PY" -m pip check > "$LOGS/requirements.log" 2>&1 \
            || say "requirements not met (pip check): $(paste -sd ';' "$LOGS/requirements.log" | cut -c1-600)"
    fi
    MNIST="$PREP"  # lenet5.py looks in DIR and DIR/MNIST/raw
    # keep the source's folder name: the report tells the stand-in from WOS by it
    TEXT="$WORK/corpus/$(basename "$(dirname "$CORPUS_SOURCE")")/X.txt"
    mkdir -p "$(dirname "$TEXT")"
    pre 60 gunzip -c "$PREP/X.txt.gz" > "$TEXT" || die "unpacking $PREP/X.txt.gz failed"
    GPT2TOK="$PREP/gpt2-tokenizer/tokenizer.json"
else
    [ -n "$GPT2TOK" ] || [ ! -f "$SHARED/gpt2-tokenizer/tokenizer.json" ] || GPT2TOK="$SHARED/gpt2-tokenizer/tokenizer.json"
fi
if [ "$REHEARSE" = 1 ]; then  # the smallest sizes: the first 1,000 documents, 1,024 images
    small="$WORK/corpus-small/$(basename "$(dirname "$TEXT")")/X.txt"
    mkdir -p "$(dirname "$small")"
    head -n 1000 "$TEXT" > "$small"
    TEXT=$small
    pre "$PRE" "$PY" "$TOOLS" mnist-subset "$MNIST" "$WORK/mnist-small" 1024 256 || die "MNIST files missing under $MNIST"
    MNIST="$WORK/mnist-small"
fi

# The extension, built in a copy of its sources (a package of its own under $WORK/build), its CUDA
# kernels checked compiled in there, then moved into gelu_ext/ by a rename (a process that has the old
# one loaded keeps it); on a GPU for this GPU only. The rehearsal builds the same way (for
# TORCH_CUDA_ARCH_LIST, default sm90: no device to ask); an extension built here before stays as it is.
build() {
    local so
    rm -rf "$WORK/build" && mkdir -p "$WORK/build" && cp -r gelu_ext "$WORK/build/gelu_ext" \
        && rm -f "$WORK"/build/gelu_ext/_C.*.so || return 1
    if [ "$REHEARSE" = 1 ]; then
        (cd "$WORK/build/gelu_ext" && TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
            "$PY" setup.py -q build_ext --inplace) || return 1
    else
        (cd "$WORK/build/gelu_ext" && unset TORCH_CUDA_ARCH_LIST && "$PY" setup.py -q build_ext --inplace) || return 1
    fi
    PYTHONPATH="$WORK/build" "$PY" "$TOOLS" cuda-ready "$REHEARSE" || return 1
    [ "$BUILD_AT" = first ] || { echo "rehearsal: built and checked in $WORK/build; gelu_ext/ left as it is"; return 0; }
    so=$(ls "$WORK"/build/gelu_ext/_C.*.so) || return 1
    cp "$so" "gelu_ext/.${so##*/}.tmp" && mv -f "gelu_ext/.${so##*/}.tmp" "gelu_ext/${so##*/}"
}
# The CUDA tests, on a GPU only where the kernels are there: without them every CUDA test would skip
# and pytest pass.
cuda_tests() {
    [ "$REHEARSE" = 1 ] || "$PY" "$TOOLS" cuda-ready 0 || return 1
    "$PY" -m pytest -q -p no:cacheprovider tests/test_gelu_ext.py "${TESTS[@]}"
}
clocked() {  # clocked METRICS CMD...: CMD, and its wall time from this shell beside the metrics' own clock
    local metrics=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    "$@"; rc=$?
    [ $rc -ne 0 ] || "$PY" "$TOOLS" clock "$WORK" "$metrics" "$t0" "$(date +%s.%N)"  # a failure's last line stays its own
    return $rc
}
lenet() {  # lenet NAME FLAGS...
    local name=$1; shift
    clocked "$RESULTS/lenet_run_${name}_$GPU.json" "$PY" lenet5.py --data-dir "$MNIST" --no-download \
        --out-dir "$WORK/runs/lenet5/$GPU-$name" --metrics-out "$RESULTS/lenet_run_${name}_$GPU.json" \
        "${SMALL_LENET[@]}" "$@"
}
# Every GPT run reads the tokenizer step's token cache, as a student's job after tokenizer.sh (GPT-2's
# vocabulary adds its own beside it); CACHES names its compile and micro-batch caches (XDG_CACHE_HOME/lab5):
# a new name is cold, a name used before warm.
gpt() {  # gpt NAME CACHES gpt_train.py|gpt.sh FLAGS...: one run, end to end, clocked from here
    local name=$1 caches=$2 run=(python gpt_train.py); shift 2
    [ "$1" = gpt.sh ] && run=(bash slurm/gpt.sh)
    shift
    clocked "$RESULTS/gpt_run_${name}_$GPU.json" env XDG_CACHE_HOME="$WORK/cache-$caches" "${run[@]}" \
        --text "$TEXT" --tokenizer "$WORK/tokenizer.json" --cache-dir "$WORK/data-cache-tokenizer" \
        --out-dir "$WORK/runs/gpt/$GPU-$name" --metrics-out "$RESULTS/gpt_run_${name}_$GPU.json" "${SMALL_GPT[@]}" "$@"
}
fp16() {  # the fp16 + GradScaler path a 2080Ti takes: loss < 7 and the steps GradScaler skipped
    gpt "$TOKENS-own-vocab-fp16" fp16 gpt_train.py "${FP16[@]}" \
        && "$PY" "$TOOLS" gpt-verdict "$RESULTS/gpt_run_$TOKENS-own-vocab-fp16_$GPU.json" "$REHEARSE"
}
compile_ab() {  # compile off vs regional, warm (the caches the cold runs left) and cold again: 2 repeats each,
    # the graded run and the regional-compile step being the first cold pair; the summary after every run
    local run mode state r
    for run in $AB_RUNS; do
        IFS=- read -r mode state r <<< "$run"
        gpt "$TOKENS-own-vocab-ab-$run" "$mode-$r" gpt_train.py --compile "$mode" || return 1
        "$PY" "$TOOLS" compile-ab "$WORK" "$TOKENS" "$GPU" || return 1
    done
}
report() {
    local runs=()
    for d in "$WORK/runs/lenet5/$GPU-torch" "$WORK/runs/gpt/$GPU-$TOKENS-own-vocab-cold"; do [ -d "$d" ] && runs+=("$d"); done
    "$PY" report/make_report.py "${runs[@]}" --runs-root "$WORK/runs" --results "$RESULTS" --gpu-logs "$LOGS" \
        --out "$WORK/report" --no-screenshots
}

if [ "$REHEARSE" = 1 ]; then
    SMALL_LENET=(--epochs 1 --device cpu)
    SMALL_GPT=(--preset tiny --tokens 4096 --val-batches 2)
    SMALL_LADDER=(--seq-len 16 --micro-batch 1 --vocab-size 64 --warmup 0 --steps 1 --repeats 1)
    SMALL_TOK=(--vocab-size 1024 --seq-len 64)  # the tiny preset's
    GELU=(--device cpu --log2 10 12 --repeats 2) TESTS=(-k cuda) FP16=(--precision fp32)  # fp16 needs a GPU
    TOKENS=4K AB_RUNS="off-warm-1 regional-warm-1"  # a CPU compiles for minutes: the warm pair shows the plumbing
    # the steps use the extension already built here, if there is one: then its rehearsal build comes
    # last, so that on a small login node it does not take their CPU
    BUILD_AT=first
    pre "$PRE" "$PY" -c 'import sys, gelu_ext; sys.exit(not gelu_ext.is_built())' 2>/dev/null && BUILD_AT=last
else
    SMALL_LENET=() SMALL_GPT=() SMALL_LADDER=(--repeats 3) SMALL_TOK=() GELU=(--device cuda) TESTS=()
    FP16=(--precision fp16) TOKENS=12M BUILD_AT=first
    AB_RUNS="off-warm-1 regional-warm-1 off-cold-2 regional-cold-2 off-warm-2 regional-warm-2"
fi
export -f build cuda_tests clocked lenet gpt fp16 compile_ab report
export REPO WORK RESULTS LOGS GPU MNIST TEXT TOOLS PY REHEARSE TOKENS AB_RUNS BUILD_AT
# arrays do not cross `bash -c`: pass them as strings the functions split again
export SMALL_LENET_S="${SMALL_LENET[*]}" SMALL_GPT_S="${SMALL_GPT[*]}" FP16_S="${FP16[*]}" TESTS_S="${TESTS[*]}"
ARRAYS='SMALL_LENET=($SMALL_LENET_S) SMALL_GPT=($SMALL_GPT_S) FP16=($FP16_S) TESTS=($TESTS_S);'

# Every step's imports, checked once before the first step: a step that cannot import is skipped
# with the reason, the others run. Modules imported inside functions are named here too.
say "checking imports"
imports=(build=torch,setuptools cuda-tests=pytest,torch gelu-bench=gelu_bench lenet-torch=lenet5 lenet-cpp=lenet5
         lenet-lightning=lenet5,lightning tokenizer=tokenizer_train,datasets gpt-own-vocab=gpt_train,datasets
         gpt-own-vocab-regional-compile=gpt_train,datasets gpt-gpt2-vocab=gpt_train,datasets
         gpt-own-vocab-fp16=gpt_train,datasets compile-ab=gpt_train,datasets ladder=gpt_bench
         report=make_report,matplotlib)
asked=()
for i in "${imports[@]}"; do [[ " $ONLY " == *" ${i%%=*} "* ]] && asked+=("$i"); done
SKIP=$(pre 120 "$PY" "$TOOLS" imports "${asked[@]}" 2> "$LOGS/imports.log" | grep -v $'\tok$')
[ -z "$SKIP" ] && say "imports: all steps ok" || say "imports missing: $(cut -f2 <<< "$SKIP" | sort -u | paste -sd ';')"
[ -n "$GPT2TOK" ] || SKIP+=$'\n'"gpt-gpt2-vocab"$'\t'"no GPT-2 tokenizer (--gpt2-tokenizer or --from DIR)"
publish
say "$("$PY" "$TOOLS" plan "$PLAN" "$ONLY" "$BUDGET" "$RESERVE")"

# In the plan's order. The build runs beside the GPT steps (niced, so that what is measured meanwhile
# keeps its CPU); nothing before cuda-tests waits for it.
[ "$BUILD_AT" = last ] || step build $(( REHEARSE ? 600 : 240 )) --bg nice -n 10 bash -c build  # a CPU's nvcc: minutes
step tokenizer 90 "$PY" tokenizer_train.py --text "$TEXT" --out "$WORK/tokenizer.json" --force \
    --compare "${GPT2TOK:-none}" --cache-dir "$WORK/data-cache-tokenizer" --metrics-out "$RESULTS/tokenizer_$GPU.json" \
    "${SMALL_TOK[@]}"
# the graded run: slurm/gpt.sh with its defaults (compile off), cold, end to end; its clock is the job's
step gpt-own-vocab 120 --smi 'train:' bash -c "$ARRAYS gpt $TOKENS-own-vocab-cold off-1 gpt.sh"
step lenet-torch 60 --smi 'LeNet-5 [(]' bash -c "$ARRAYS lenet torch --act torch"
finish build  # --act cpp needs it
step lenet-cpp 60 --smi 'LeNet-5 [(]' bash -c "$ARRAYS lenet cpp --act cpp"
# does compile pay? off (the graded run) against regional, cold, then warm and repeated
step gpt-own-vocab-regional-compile 150 --smi 'train:' \
    bash -c "$ARRAYS gpt $TOKENS-own-vocab-regional-compile-cold regional-1 gpt_train.py --compile regional"
step compile-ab 400 bash -c "$ARRAYS compile_ab"
# the ladder's key rows first (naive, default, the default without each acceleration; the default's step
# profiled), repeats interleaved; gpt_bench.py rewrites its JSON after every row, so a cut keeps the rows done
step ladder 300 "$PY" benchmarks/gpt_bench.py --order unmeasured --metrics-out "$RESULTS/gpt_bench_$GPU.json" \
    "${SMALL_LADDER[@]}"
step gpt-own-vocab-fp16 120 --smi 'train:' bash -c "$ARRAYS fp16"
step cuda-tests 150 bash -c "$ARRAYS cuda_tests"
step gpt-gpt2-vocab 150 --smi 'train:' bash -c "$ARRAYS gpt $TOKENS-gpt2-vocab-cold gpt2 gpt_train.py --tokenizer '$GPT2TOK'"
step gelu-bench 90 "$PY" benchmarks/gelu_bench.py "${GELU[@]}" --metrics-out "$RESULTS/gelu_bench_$GPU.json"
step lenet-lightning 75 --smi 'LeNet-5 [(]' bash -c "$ARRAYS lenet lightning --engine lightning"
[ "$BUILD_AT" = first ] || step build 600 bash -c build
for n in gpt-own-vocab gpt-own-vocab-regional-compile lenet-torch; do  # the report's figure: one taken during training
    [ ! -f "$LOGS/nvidia-smi-during-$n.txt" ] || { cp "$LOGS/nvidia-smi-during-$n.txt" "$LOGS/nvidia-smi.txt"; break; }
done
step report 60 bash -c report

# the summary, the second call for what was cut or failed; exit 0 when every step asked for is ok
"$PY" "$TOOLS" end "$WORK" "$OUT" "$PLAN" "$(now)" "${PREP:+--from $PREP}" "$REHEARSE"
