#!/usr/bin/env bash
# CI, second half: the quick test subset in an environment at exactly requirements.txt's lower bounds
# (.ci/floors.py pins them), so a floor that stops being true fails here. The environment is cached,
# keyed by requirements.txt: a machine that built it once reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."
key=$(cat requirements.txt .ci/floors.py | sha256sum | cut -c1-16)
venv="${LAB5_FLOORS_CACHE:-$HOME/.cache/lab5-floors}/$key"
if [ ! -e "$venv/complete" ]; then  # the marker comes last: a half-built environment is built again
    rm -rf "$venv"
    python -m venv "$venv"
    python .ci/floors.py requirements.txt > "$venv/floors.txt"
    "$venv/bin/pip" install -q -r "$venv/floors.txt"
    touch "$venv/complete"
fi
"$venv/bin/pip" list --format=freeze 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|accelerate|datasets)==' | tr '\n' ' '
echo

# A copy of the source tree: the extension is built there against the floors' torch, leaving the
# checkout's build (against the current torch) in place. CPU-only: the floors' torch is a CUDA 12.1
# build, which this machine's nvcc (another major) cannot build for.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -P -t "$src"
cd "$src"
GELU_EXT_CPU_ONLY=1 "$venv/bin/pip" install -q --no-build-isolation -e ./gelu_ext
GELU_EXT_EXPECT_CUDA=0 "$venv/bin/python" -m pytest -q -m "not slow" tests
