#!/bin/bash
# Pack the hand-in (README step 8) into lab5-handin-<user>.tar.gz in the repository root:
#   bash slurm/handin.sh [--force] REPORT.pdf RUN... [FILE...]
#   bash slurm/handin.sh runs/myreport/lab5-report-$(id -un).pdf runs/lenet5/<run> runs/gpt/gpt-<id>
# In it: the code (git's tracked files, `git add`ed ones too, without this repository's own report/report.pdf,
# report/generated/ and the team's measurements report/results/); your report (a PDF, not ours); each RUN (the
# runs your report reports, each a finished run folder: metrics, arguments, TensorBoard events); the Slurm log
# of each job that wrote one of them, unless its last start ended in an error; and any other FILE named (a
# screenshot, runs/slurm/tokenizer-<id>.out). Untracked files (.env, venv/) are listed, not packed, unless
# named; weights and checkpoints (final/, ckpt-*, *.safetensors, *.bin, *.pt, *.pkl) never are, named or not.
# The tarball is written to a temporary file beside it and renamed into place (an interrupted pack leaves the
# old one whole); an existing one is replaced only with --force, a link never. Not a Slurm job.
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash, not sh" >&2; exit 2; }
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHO=${USER:-$(id -un 2>/dev/null || echo student)}  # an empty $USER named the pack lab5-handin-.tar.gz
OUT="$REPO/lab5-handin-$WHO.tar.gz"
WEIGHTS='(^|/)(final|final\.tmp|ckpt-[^/]*)/|\.(safetensors|bin|pt|pth|ckpt|pkl)$'  # a path, as grep -E sees it
die() { echo "error: $*" >&2; exit 2; }
FORCE=
if [ "${1:-}" = --force ]; then FORCE=1; shift; fi
[ $# -ge 2 ] || die "give your report's PDF and the run folders it reports (README step 8)"
[[ $1 == *.pdf && -f $1 && $(head -c 5 -- "$1" | tr -d '\0') == %PDF- ]] \
    || die "$1: not your report's PDF (README step 7 writes runs/myreport/lab5-report-$WHO.pdf)"
[ "$(git -C "$REPO" hash-object -- "$(realpath -- "$1")")" != "$(git -C "$REPO" rev-parse -q --verify \
    :report/report.pdf)" ] || die "$1 is this repository's own report/report.pdf: give the one you built"

# in_repo PATH: PATH (as typed here) relative to the repository, where tar runs; a pack holds its files only.
in_repo() {
    local rel
    rel=$(cd "$HERE" && realpath -m --relative-to="$REPO" -- "$1")
    [[ $rel != ../* && $rel != .. ]] || die "$1 is outside the repository ($REPO)"
    echo "$rel"
}

# wrote LOG NAME: whether the job log names run folder NAME (gpt.sh's `out DIR`, lenet5.py's `logs in DIR`;
# compared as a string, not a pattern: `base(1`) and its last start (common.sh's header line opens each) ended
# without an error: a user error (`error: ...`), a traceback, or Slurm's own (a time limit, a cancel).
wrote() {
    NAME="/$2" awk '
        /^\[[0-9-]+ [0-9:]+\] host .*, job .* \(restart [0-9]+\)/ { bad = 0 }
        /^error: |Traceback \(most recent call last\)|slurmstepd: error: / { bad = 1 }
        {   n = ENVIRON["NAME"]  # followed by no name character: gpt-7 is not gpt-70
            for (s = $0; i = index(s, n); s = substr(s, i + 1))
                if (substr(s, i + length(n), 1) !~ /[A-Za-z0-9._-]/) named = 1 }
        END { exit !(named && !bad) }' "$1"
}

HERE=$PWD LIST= TMP=
cd "$REPO"
# One pack at a time (a flock on the repository folder): the rename alone never leaves half a tarball, the lock
# makes the checks of $OUT below and the rename at the end one step (a second pack cannot slip past --force).
exec 9<"$REPO"
flock -n 9 || die "another hand-in is being packed in $REPO; wait for it"
[ ! -L "$OUT" ] || die "$OUT is a symbolic link: remove it (nothing was written)"
[ ! -e "$OUT" ] || [ -n "$FORCE" ] || die "$OUT exists: pass --force to replace it (nothing was written)"
trap 'rm -f -- "$LIST" "$TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
LIST=$(mktemp)
TMP=$(mktemp --suffix=.tar.gz "$OUT.tmp-XXXXXX" 2>/dev/null) || die "cannot write in $REPO (read-only?): the \
tarball is written there"
git ls-files -z \
    | grep -zv -e '^report/report\.pdf$' -e '^report/generated/' -e '^report/results/' \
    | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done > "$LIST"  # not deleted
for item in "$@"; do
    rel=$(in_repo "$item")
    if [ -f "$rel" ]; then  # the report, or a file named
        printf '%s\0' "$rel" >> "$LIST"
        continue
    fi
    [ -f "$rel/metrics.json" ] || die "$item: not a finished run folder (no metrics.json) nor a file"
    find "./$rel" -type f -print0 | sed -z 's|^\./||' >> "$LIST"  # ./: a name may start with a dash
    for log in runs/slurm/*.out; do  # the jobs that wrote it name its folder
        if [ -f "$log" ] && wrote "$log" "${rel##*/}"; then
            printf '%s\0' "$log" >> "$LIST"
        fi
    done
done
sort -zu -o "$LIST" "$LIST"
weights=$(grep -zcE "$WEIGHTS" "$LIST" || true)
untracked=$(git ls-files -z --others --exclude-standard | { grep -zvE "$WEIGHTS" || true; } | sort -z \
    | comm -z -23 - "$LIST" | sed -z 's|/.*|/|' | sort -zu | tr '\0' ' ')  # (grep: none is no error)
if ! err=$(grep -zvE "$WEIGHTS" "$LIST" | tar -czf "$TMP" --null -T - 2>&1); then
    die "packing failed: ${err%%$'\n'*}"
fi
chmod "$(printf %o $((0666 & ~$(umask))))" "$TMP"  # as tar would make it, not mktemp's 0600
mv -fT "$TMP" "$OUT"  # a rename: the old tarball stays whole until this instant
[ -z "$untracked" ] || echo "not packed (untracked): ${untracked% } — name them to add them"
[ "$weights" = 0 ] || echo "not packed: $weights weight and checkpoint files (final/, ckpt-*, *.bin, ...)"
echo "$(tar -tzf "$OUT" | grep -vc '/$') files in $OUT; runs and logs in it:"
tar -tzf "$OUT" | grep -E '^runs/[^/]+/[^/]+(/metrics\.json|\.out|\.pdf)$' | sed 's/^/  /'
