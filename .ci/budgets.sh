#!/usr/bin/env bash
# The maintainers' size budgets, outside `pytest tests` (a student's own module must not fail a test):
# the Python outside tests/ within 50,000 tokens (Python's tokenize; docstrings, comments and layout not
# counted, so folding lines cannot change it) with a mean non-blank line of at most 64 characters, no module
# over 400 lines, at most 14 of the project's modules loaded by `import gpt_train`, gpt_train.py within 320
# lines with no function over 40 (one screen), at most 5 noqa comments (the linter's exceptions live in
# .ruff.toml). Counts the files git tracks or would track; exits 1 naming each budget exceeded.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t python < <(git ls-files --cached --others --exclude-standard -- '*.py')
mapfile -t code < <(printf '%s\n' "${python[@]}" | grep -v '^tests/')
status=0
long=$(wc -l "${code[@]}" | awk '$2 != "total" && $1 > 400 {printf "%s (%d) ", $2, $1}')
[ -z "$long" ] || { echo "budget: modules over 400 lines: $long" >&2; status=1; }
# what `import gpt_train` loads of the project's own modules (packages' __init__ not counted): 14 at most
loaded=$(python -c "import sys, gpt_train; print(sum(m.count('.') == 1 and m.split('.')[0] in {'data', 'training'}
    for m in sys.modules))" 2>/dev/null) || { echo "budget: import gpt_train failed" >&2; status=1; }
[ "${loaded:-99}" -le 14 ] || { echo "budget: import gpt_train loads $loaded project modules, over 14" >&2; status=1; }
noqa=$(cat "${python[@]}" | grep -c '# noqa' || true)
[ "$noqa" -le 5 ] || { echo "budget: $noqa noqa comments, over 5 (a whole file's needs go in .ruff.toml)" >&2; status=1; }
python - "${code[@]}" <<'PY' || status=1
import ast
import io
import sys
import tokenize

LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
STATEMENT_START = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}


def tokens(source):
    """Python tokens that are code: no comment, no layout, no string standing alone as a statement (docstrings)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT]
    count = 0
    for i, t in enumerate(toks):
        alone = (t.type == tokenize.STRING and (i == 0 or toks[i - 1].type in STATEMENT_START)
                 and toks[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        count += t.type not in LAYOUT and not alone
    return count


sources = {path: open(path, encoding="utf-8").read() for path in sys.argv[1:]}
total = sum(map(tokens, sources.values()))
lines = [line.rstrip() for source in sources.values() for line in source.splitlines() if line.strip()]
mean = sum(map(len, lines)) / len(lines)
problems = [f"{total:,} Python tokens outside tests/, over 50,000"] if total > 50_000 else []
problems += [f"a mean non-blank line of {mean:.1f} characters, over 64"] if mean > 64 else []
spans = {f.name: f.end_lineno - f.lineno + 1 for f in ast.walk(ast.parse(sources["gpt_train.py"]))
         if isinstance(f, ast.FunctionDef)}
long = {name: n for name, n in spans.items() if n > 40}
if len(sources["gpt_train.py"].splitlines()) > 320 or long:
    problems.append(f"gpt_train.py has {len(sources['gpt_train.py'].splitlines())} lines (320 at most); "
                    f"functions over 40: {long}")
for problem in problems:
    print("budget:", problem, file=sys.stderr)
print(f"budgets: {total:,} Python tokens outside tests/ (50,000), mean non-blank line {mean:.1f} characters (64)")
sys.exit(1 if problems else 0)
PY
exit "$status"
