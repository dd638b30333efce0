"""What every benchmark does alike: --metrics-out checked before the long part (replaced only with --force) and
rewritten atomically, the facts a result is read with (command, commit, torch), the median and range of repeats."""
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from data.files import write_json
from training import rundir
from training.errors import OutputError
from training.flags import Parser, add_output_flags


def parser(doc, metrics_help="write the results here as JSON", **kw):
    p = Parser(description=doc.split("\n")[0], **kw)
    add_output_flags(p, metrics_help)
    return p


def parse(p, argv):
    """p's arguments; a --metrics-out that may not be written: one line and exit 1, before any measuring."""
    args = p.parse_args(argv)
    if args.metrics_out:
        try:
            rundir.check_output(args.metrics_out, "--metrics-out", args.force)
        except OutputError as e:
            sys.exit(f"error: {e}")
    return args


def write(args, result):
    """`result` into --metrics-out, if given (whole, atomically: a cut run leaves the last version)."""
    if args.metrics_out:
        try:
            write_json(args.metrics_out, result)
        except OutputError as e:  # a full disk
            sys.exit(f"error: {e}")
    return result


def git(*cmd):
    return subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True).stdout.strip() or None


def run_facts(script, argv):
    """The command as typed, the commit measured (+ uncommitted changes outside the results) and torch's version."""
    import torch
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!report/results")
    commit = git("rev-parse", "HEAD")
    return {"command": " ".join(["python", f"benchmarks/{Path(script).name}", *args]),
            "commit": commit and commit + (" + uncommitted changes" if changed else ""), "torch": torch.__version__}


def median_range(key, values):
    return {key: statistics.median(values), f"{key}_range": [min(values), max(values)]}
