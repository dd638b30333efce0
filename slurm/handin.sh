#!/bin/bash
# Pack the hand-in (README step 8) into lab5-handin-<user>.tar.gz in the repository root:
#   bash slurm/handin.sh REPORT.pdf RUN... [FILE...]
#   bash slurm/handin.sh runs/myreport/lab5-report-$(id -un).pdf runs/lenet5/<run> runs/gpt/gpt-<id>
# In it: the code (git's files and your new ones, without this repository's own report/report.pdf,
# report/generated/ and the team's measurements report/results/); your report; each RUN (the runs your
# report reports, each a finished run folder: metrics, arguments, TensorBoard events, without checkpoints
# or final/ weights); the Slurm log of each job that wrote one of them, unless its last start ended in an
# error; and any other FILE named (a screenshot, runs/slurm/tokenizer-<id>.out). Not a Slurm job.
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash, not sh" >&2; exit 2; }
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHO=${USER:-$(id -un 2>/dev/null || echo student)}  # an empty $USER named the pack lab5-handin-.tar.gz
OUT="$REPO/lab5-handin-$WHO.tar.gz"
die() { echo "error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "give your report's PDF and the run folders it reports (README step 8)"
[[ $1 == *.pdf && -f $1 ]] || die "$1: not your report's PDF (README step 7 writes runs/myreport/lab5-report-$WHO.pdf)"

# in_repo PATH: PATH (as typed here) relative to the repository, where tar runs; a pack holds its files only.
in_repo() {
    local rel
    rel=$(cd "$HERE" && realpath -m --relative-to="$REPO" "$1")
    [[ $rel != ../* && $rel != .. ]] || die "$1 is outside the repository ($REPO)"
    echo "$rel"
}

# ends_well LOG: whether the log's last start (common.sh's header line opens each) has no error in it:
# a user error (`error: ...`), a traceback, or Slurm's own (a time limit, a cancel).
ends_well() {
    awk '/^\[[0-9-]+ [0-9:]+\] host .*, job .* \(restart [0-9]+\)/ { bad = 0 }
         /^error: |Traceback \(most recent call last\)|slurmstepd: error: / { bad = 1 }
         END { exit bad }' "$1"
}

HERE=$PWD LIST=$(mktemp)
trap 'rm -f "$LIST"' EXIT
cd "$REPO"
git ls-files -z --cached --others --exclude-standard \
    | grep -zv -e '^report/report\.pdf$' -e '^report/generated/' -e '^report/results/' \
    | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done > "$LIST"  # not deleted
for item in "$@"; do
    rel=$(in_repo "$item")
    if [ -f "$rel" ]; then  # the report, or a file named
        printf '%s\0' "$rel" >> "$LIST"
        continue
    fi
    [ -f "$rel/metrics.json" ] || die "$item: not a finished run folder (no metrics.json) nor a file"
    find "$rel" \( -name final -o -name 'ckpt-*' \) -prune -o -type f -print0 >> "$LIST"
    name=$(basename "$rel")
    for log in runs/slurm/*.out; do  # the jobs that wrote it name its folder: gpt.sh's `out`, lenet5.py's `logs in`
        if [ -f "$log" ] && grep -qE "/${name//./\\.}([^A-Za-z0-9._-]|$)" "$log" && ends_well "$log"; then
            printf '%s\0' "$log" >> "$LIST"
        fi
    done
done
sort -zu "$LIST" | tar -czf "$OUT" --null -T -
echo "$(tar -tzf "$OUT" | grep -vc '/$') files in $OUT; runs and logs in it:"
tar -tzf "$OUT" | grep -E '^runs/[^/]+/[^/]+(/metrics\.json|\.out|\.pdf)$' | sed 's/^/  /'
