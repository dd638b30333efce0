#!/bin/bash
# Pack the hand-in (README step 8) into lab5-handin-<user>.tar.gz in the repository root:
#   bash slurm/handin.sh [--force] REPORT.pdf [RUN...] [FILE...]
# In it, of the repository's files only: the code (git's tracked and added files, without our report.pdf,
# report/generated/ and report/results/); your PDF and what the sources.json beside it (make_report.py's) lists,
# its Markdown and inputs; each RUN (a finished run folder) and FILE named; the log of each job that wrote a
# folder packed, unless its last start failed. Untracked files are listed, not packed, unless named; weights,
# checkpoints (final/, ckpt-*, *.safetensors, *.bin, *.pt, *.pkl) and *.lock never are. Written to a
# .lab5-handin-*.part (a killed pack's goes at the next start), then renamed; an existing tarball is replaced
# only with --force, a link never. Not a Slurm job.
[ -n "${BASH_VERSION:-}" ] || { echo "error: $0 needs bash: run it with bash, not sh" >&2; exit 2; }
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WHO=${USER:-$(id -un 2>/dev/null || echo student)}  # an empty $USER named the pack lab5-handin-.tar.gz
OUT="$REPO/lab5-handin-$WHO.tar.gz"
WEIGHTS='(^|/)(final|final\.tmp|ckpt-[^/]*)/|\.(safetensors|bin|pt|pth|ckpt|pkl)$'  # a path, as grep -E sees it
SKIP="$WEIGHTS"'|\.lock$'  # never packed, named or not
die() { echo "error: $*" >&2; exit 2; }
FORCE=
if [ "${1:-}" = --force ]; then FORCE=1; shift; fi
[ $# -ge 1 ] || die "give your report's PDF (README step 8)"
[[ $1 == *.pdf && -f $1 && $(head -c 5 -- "$1" | tr -d '\0') == %PDF- ]] \
    || die "$1: not your report's PDF (README step 7 writes runs/myreport/lab5-report-$WHO.pdf)"
[ "$(git -C "$REPO" hash-object -- "$(realpath -- "$1")")" != "$(git -C "$REPO" rev-parse -q --verify \
    :report/report.pdf)" ] || die "$1 is this repository's own report/report.pdf: give the one you built"

# what the build of this PDF read (make_report.py's sources.json beside it): itself, the Markdown, the inputs
mapfile -d '' LISTED < <(python3 -c 'import json, os, sys; b = json.load(open(sys.argv[1]))
if os.path.samefile(b["pdf"], sys.argv[2]): print(sys.argv[1], b["markdown"], *b["inputs"], sep="\0", end="\0")' \
    "$(dirname -- "$1")/sources.json" "$1" 2>/dev/null)
[ $# -ge 2 ] || [ ${#LISTED[@]} -gt 0 ] || die "no sources.json beside $1 names it: name the runs it reports"

# add ITEM [named]: a file, or a folder's files and its jobs' logs (named: a finished run), into FILES relative
# to the repository (where tar runs); 1: outside it, or gone.
add() {
    local rel
    rel=$(cd "$HERE" && realpath -m --relative-to="$REPO" -- "$1")
    [[ $rel != ../* && $rel != .. ]] || return 1
    if [ -f "$rel" ]; then
        FILES+=("$rel")
        return
    fi
    [ -z "${2:-}" ] || [ -f "$rel/metrics.json" ] || die "$1: not a finished run folder (no metrics.json) nor a file"
    [ -d "$rel" ] || return 1
    mapfile -d '' -O ${#FILES[@]} FILES < <(find "./$rel" -type f -print0 | sed -z 's|^\./||')  # ./: a leading dash
    for log in runs/slurm/*.out; do  # the jobs that wrote it name its folder
        if [ -f "$log" ] && wrote "$log" "${rel##*/}"; then
            FILES+=("$log")
        fi
    done
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

HERE=$PWD TMP=
cd "$REPO"
# One pack at a time (a flock on the repository folder): the rename alone never leaves half a tarball, the lock
# makes the checks of $OUT below and the rename at the end one step (a second pack cannot slip past --force).
exec 9<"$REPO"
flock -n 9 || die "another hand-in is being packed in $REPO; wait for it"
[ ! -L "$OUT" ] || die "$OUT is a symbolic link: remove it (nothing was written)"
[ ! -e "$OUT" ] || [ -n "$FORCE" ] || die "$OUT exists: pass --force to replace it (nothing was written)"
rm -f -- .lab5-handin-*.part  # a killed pack's (none is running: the lock)
trap 'rm -f -- "$TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
TMP=$(mktemp .lab5-handin-XXXXXX.part 2>/dev/null) || die "cannot write in $REPO (read-only?): the \
tarball is written there"
mapfile -d '' FILES < <(git ls-files -z \
    | grep -zv -e '^report/report\.pdf$' -e '^report/generated/' -e '^report/results/' \
    | while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done)  # not deleted
for item in "$@"; do  # the report, runs and files named
    add "$item" named || die "$item is outside the repository ($REPO)"
done
for item in "${LISTED[@]}"; do
    add "$item" || echo "not packed (outside the repository, or gone): $item"
done
mapfile -d '' FILES < <(printf '%s\0' "${FILES[@]}" | sort -zu)
weights=$(printf '%s\0' "${FILES[@]}" | grep -zcE "$WEIGHTS" || true)
untracked=$(git ls-files -z --others --exclude-standard | { grep -zvE "$SKIP|^\.lab5-handin-" || true; } \
    | sort -z | comm -z -23 - <(printf '%s\0' "${FILES[@]}") | sed -z 's|/.*|/|' | sort -zu | tr '\0' ' ')
if ! err=$(printf '%s\0' "${FILES[@]}" | grep -zvE "$SKIP" | tar -czf "$TMP" --null -T - 2>&1); then
    die "packing failed: $(grep -m1 . <<< "$err")"  # the line that says why (a full disk: gzip's, first)
fi
chmod "$(printf %o $((0666 & ~$(umask))))" "$TMP"  # as tar would make it, not mktemp's 0600
mv -fT "$TMP" "$OUT"  # a rename: the old tarball stays whole until this instant
[ -z "$untracked" ] || echo "not packed (untracked): ${untracked% } — name them to add them"
[ "$weights" = 0 ] || echo "not packed: $weights weight and checkpoint files (final/, ckpt-*, *.bin, ...)"
echo "$(tar -tzf "$OUT" | grep -vc '/$') files in $OUT; runs and logs in it:"
tar -tzf "$OUT" | grep -E '^runs/[^/]+/[^/]+(/metrics\.json|\.out|\.pdf)$' | sed 's/^/  /'
