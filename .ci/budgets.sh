#!/usr/bin/env bash
# The maintainers' size budgets, outside `pytest tests` (a student's own module must not fail a test):
# the Python outside tests/ within 7,000 lines and no module of it over 400, gpt_train.py within 320 lines with
# no function over 40 (one screen), at most 5 noqa comments (the linter's exceptions live in .ruff.toml).
# Counts the files git tracks or would track (new ones too); exits 1 naming each budget exceeded.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t python < <(git ls-files --cached --others --exclude-standard -- '*.py')
mapfile -t code < <(printf '%s\n' "${python[@]}" | grep -v '^tests/')
status=0
total=$(cat "${code[@]}" | wc -l)
[ "$total" -le 7000 ] || { echo "budget: $total lines of Python outside tests/, over 7,000" >&2; status=1; }
long=$(wc -l "${code[@]}" | awk '$2 != "total" && $1 > 400 {printf "%s (%d) ", $2, $1}')
[ -z "$long" ] || { echo "budget: modules over 400 lines: $long" >&2; status=1; }
noqa=$(cat "${python[@]}" | grep -c '# noqa' || true)
[ "$noqa" -le 5 ] || { echo "budget: $noqa noqa comments, over 5 (a whole file's needs go in .ruff.toml)" >&2; status=1; }
python - <<'PY' || status=1
import ast
import sys

source = open("gpt_train.py").read()
spans = {f.name: f.end_lineno - f.lineno + 1 for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)}
long = {name: n for name, n in spans.items() if n > 40}
if len(source.splitlines()) > 320 or long:
    sys.exit(f"budget: gpt_train.py has {len(source.splitlines())} lines (320 at most); functions over 40: {long}")
PY
[ "$status" -ne 0 ] || echo "budgets: $total lines of Python outside tests/ (7,000), $noqa noqa comments (5)"
exit "$status"
