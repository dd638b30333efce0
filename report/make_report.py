"""Regenerate a report's figures, tables and numbers from ONE named set of inputs.

    python report/make_report.py --pdf                    # report.md from report/results only: report/report.pdf
    python report/make_report.py runs/lenet5/A runs/gpt/B runs/ladder.json --out runs/myreport   # yours
    python report/make_report.py runs/gpt/base runs/gpt/bf16 runs/gpt/compiled --out runs/cmp   # each vs the first
    python report/make_report.py --runs-root runs --out runs/myreport        # the newest runs of yours
    python report/make_report.py --gpu OUT --pdf          # after a GPU call: the committed report from its OUT

Naming runs or result files (a gpt_bench.py or gelu_bench.py JSON) builds report/student.md from them alone (never
report/results, never a run unasked); what they do not answer is a visible gap naming the command that fills it.
A placeholder that cannot be filled or a broken image is an error or a problem line, never a blank. One build at a
time writes an --out (a second waits); it replaces only what a build wrote there, and names its inputs in
sources.json."""
import contextlib
import fcntl
import html
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as python report/make_report.py: the repository, not report/, on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from training import lifecycle  # first, before the slow imports (matplotlib): the standard library only

lifecycle.start(__name__)  # a Ctrl-C while starting is one line, not a traceback

from data.files import UMASK, make_folder, refuse_shared
from report import browser, facts, gpu
from report.figures import compare_figure, gpt_curves, gpu_figure
from report.inputs import DISK_ERRORS, FIELD_ERRORS, RESULTS, escape, figure_name, find_runs, load_results, rel
from training.errors import UserError
from training.flags import Parser, path_flag
from training.rundir import check_output, output_problem

REPORT = RESULTS.parent / "report.md"
STUDENT = RESULTS.parent / "student.md"  # the report of a student's own runs
GPU_NAME, DATE = re.compile(r"[A-Za-z0-9_-]+"), re.compile(r"\d{4}-\d{2}-\d{2}")  # --gpu OUT's folder: <GPU>-<date>
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
BUILT = ".built-by-make_report"  # in --out: the files a build wrote
TMP = ".make_report-"  # the temporaries' prefix: short, whatever the output's name
LOCK = ".make_report.lock"  # in --out: held while a build writes it, linked into each new --out (one inode)


@dataclass
class Report:
    problems: list
    results: dict  # results key -> (its JSON, where from)
    args: object  # the command line: what was named
    runs: list = field(default_factory=list)  # inputs.Run named on the command line, in order
    by_kind: dict = field(default_factory=dict)  # kind -> its first run named: the baseline
    folders: list = field(default_factory=list)  # gpu.GpuFolder, first answering first
    shown: dict = field(default_factory=dict)  # kind -> inputs.Run its section shows
    sources: dict = field(default_factory=dict)  # placeholder source -> (facts, where from)
    out: Path | None = None  # the folder being built
    linked: set = field(default_factory=set)  # the figures the report links: the only ones drawn
    todo: list = field(default_factory=list)  # the GPU figures missing, and the command that fills each


# ----------------------------------------------------------------------------- the sections of results.md

def alias_section(r, kind):
    """The run a section shows (its numbers: the placeholders below) and, where linked, its curves."""
    if (shown := r.shown.get(kind)) is not None:
        named = r.by_kind.get(kind)
        where = rel(named.events if named else shown.source)
        lines = [f"The run `{shown.alias}` (placeholders `{{{{{shown.alias}.…}}}}`): `{escape(where, code=True)}`", ""]
        try:
            if kind == "gpt" and "gpt_curves.png" in r.linked:
                lines += gpt_curves(shown.metrics, r.out / "gpt_curves.png", named and named.scalars)
            return lines
        except FIELD_ERRORS as e:
            r.problems.append(f"left out {where}: a field is missing or of the wrong type ({type(e).__name__}: {e})")
    where = f"under {rel(r.args.runs_root / kind)}" if r.args.runs_root else "among the runs named" if r.args.runs \
        else "in the results"
    return [f"- no {'LeNet-5' if kind == 'lenet5' else 'GPT'} run found {where}"]


def compare_lines(r):
    """Every GPT run named, against the first: the figure the report links."""
    gpts = [run for run in r.runs if run.kind == "gpt"]
    if len(gpts) < 2 or "gpt_compare.png" not in r.linked:
        return []
    try:
        return ["", "## GPT runs compared", ""] + compare_figure(gpts, r.out / "gpt_compare.png")
    except FIELD_ERRORS as e:
        r.problems.append(f"left out the comparison of the GPT runs: {type(e).__name__}: {e}")
        return []


def run_lines(r):
    files = [f"- `{escape(rel(path), code=True)}`: placeholders `{{{{{figure_name(key, r.results)}.…}}}}`"
             for key, (_, path) in sorted(r.results.items())]
    return (["## LeNet-5", ""] + alias_section(r, "lenet5") + ["", "## GPT-2", ""]
            + alias_section(r, "gpt") + compare_lines(r) + ["", "## Results files", ""]
            + (files or [f"- no results files found in {r.args.results or 'the files named'}"]))


def gpu_lines(r, screenshots):
    lines = ["", "## GPU utilisation", ""] + gpu_figure(r.runs, r.out) + [
        "", "## GPU figures the report links", ""] + gpu.slot_lines(r.folders, r.out, r.linked, r.todo, r.problems)
    if not screenshots:
        return lines
    lines += ["", "## TensorBoard, as a browser shows it", ""]
    lines += [f"- no TensorBoard events kept for `{run.source}`: no screenshot of it"
              for run in r.shown.values() if not run.events]
    return lines + browser.tensorboard_screenshots([run for run in r.shown.values() if run.events], r.out, r.problems)


# ----------------------------------------------------------------------------- --out and --pdf-out, written whole

def built_lines(out):
    marker = out / BUILT
    return marker.read_text().splitlines() if marker.is_file() and not marker.is_symlink() else []


@contextlib.contextmanager
def locked(out):
    """--out written by one build at a time: a second waits. The lock file keeps its inode across `building`'s
    swap (linked into the new folder), so a build that locked the old one is checked against the one in place."""
    out.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # --out is between another build's two renames, for microseconds
            time.sleep(0.01)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another make_report.py is writing {out}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(out / LOCK).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # locked a folder since replaced: lock the one in place
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def building(out, keep):
    """A fresh folder beside `out`, renamed into place once built; a file no build wrote (a student's) is kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP, dir=out.parent))
    tmp.chmod(0o777 & ~UMASK)  # mkdtemp's 0700 would become --out's: as mkdir makes it
    os.link(out / LOCK, tmp / LOCK)
    old, moved = None, []
    try:
        for name in keep:
            if (out / name).is_file():
                shutil.copy2(out / name, tmp / name)
        yield tmp
        built = built_lines(out)
        (tmp / BUILT).write_text("".join(f"{p.name}\n" for p in sorted(tmp.iterdir()) if p.name != LOCK))
        for path in sorted(out.iterdir()) if out.is_dir() else []:
            if path.name not in built and not (tmp / path.name).exists():
                path.rename(tmp / path.name)  # someone else's: kept
                moved.append(path.name)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{TMP}old-", dir=out.parent))
            out.rename(old)  # onto the empty folder mkdtemp made
        tmp.rename(out)
    finally:
        if old and not out.exists():  # stopped between the two renames: the old --out back in place
            old.rename(out)
        for name in moved if tmp.exists() else []:  # not renamed into place: someone else's files go back
            (tmp / name).rename(out / name)
        for folder in filter(None, (old, tmp)):
            shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- arguments

def parse_args(argv):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", type=path_flag, help="your run folders and result JSON files (a gpt_bench.py "
                   "ladder, a gelu_bench.py table) to report, alone (default: none)")
    p.add_argument("--runs-root", type=path_flag, default=None,
                   help="report the newest LeNet-5 and GPT runs under this folder (default: none)")
    p.add_argument("--results", type=path_flag, default=None, help="a folder of benchmark/tokenizer/run JSON files "
                   f"(default: {rel(RESULTS)}; none where runs or files are named)")
    p.add_argument("--out", type=path_flag, default=RESULTS.parent / "generated", help="(default: %(default)s)")
    p.add_argument("--report", type=path_flag, default=None, help="the report whose links and placeholders are "
                   f"filled (default: {rel(REPORT)}; {rel(STUDENT)} where runs or files are named)")
    p.add_argument("--no-screenshots", action="store_true", help="skip the TensorBoard screenshots (Chromium); "
                   "those already in --out are kept")
    p.add_argument("--gpu", "--gpu-logs", type=path_flag, default=None, dest="gpu",
                   help="a GPU results folder answering before those under --results: gpu_check.sh's OUT or its "
                        "logs/ (default: the folders under --results, newest first)")
    p.add_argument("--pdf", action="store_true", help="also render the filled report to --pdf-out")
    p.add_argument("--pdf-out", type=path_flag, default=REPORT.with_suffix(".pdf"), help="(default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing --pdf-out if it is a PDF (never a link or "
                   "another file); without it, only the repository's report.pdf (in git) is replaced")
    args = p.parse_intermixed_args(argv)  # runs before and after the flags: make_report.py A --pdf B
    args.files = [path for path in args.runs if path.suffix == ".json" and not path.is_dir()]  # result files
    args.runs = [path for path in args.runs if path not in args.files]
    named = bool(args.runs or args.files or args.runs_root)  # a student's: their files alone, their template
    args.results = args.results or (None if named else RESULTS)
    args.report = args.report or (STUDENT if named else REPORT)
    args.out_dir = args.out.resolve() if args.out.is_symlink() else args.out  # a link: built where it points, kept
    return args


def check_args(args):
    """The user's mistakes, before any work, one line each (no output over an input or in a run); report.md's text."""
    out, pdf = args.out_dir, args.pdf_out
    inputs = {"--report": args.report, "--results": args.results, "--gpu": args.gpu,
              **{f"--runs-root's {k}": args.runs_root / k for k in ("lenet5", "gpt") if args.runs_root},
              **{f"the run {d}": d for d in args.runs + args.files}}
    for flag, path in {"--out": out, **({"--pdf-out": pdf} if args.pdf else {})}.items():
        for name, given in inputs.items():
            there, mine = Path(given or "").resolve(), path.resolve()
            if given and (there.is_relative_to(mine) or mine.is_relative_to(there)):
                name = name if str(given) in name else f"{name} {given}"  # a run's name is its path
                raise UserError(f"{flag} {path} and {name} overlap: the report never writes its inputs")
    if problem := output_problem(out, "--out"):  # a run's files are that run's only record
        raise UserError(problem)
    make_folder(out.parent, "--out")  # writable, before any work (--out itself made only to write)
    if args.pdf:  # the repository's report.pdf (in git) is rebuilt without --force
        check_output(pdf, "--pdf-out", args.force or pdf.resolve() == REPORT.with_suffix(".pdf").resolve(), kind="PDF")
    refuse_shared(out, "--out")  # checked, not made: a build refused later leaves no folder behind
    if out.exists() and (not out.is_dir() or ({p.name for p in out.iterdir()} - {LOCK}
                                              and not (out / BUILT).is_file())):
        raise UserError(f"--out {args.out} is not a folder this program wrote (no {BUILT}); give a new or empty one "
                        "(nothing written)")
    if args.gpu and not args.gpu.is_dir():
        raise UserError(f"--gpu {args.gpu} is not a folder")
    if not args.report.is_file():
        raise UserError(f"--report {args.report} is not a file")
    try:
        return args.report.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--report {args.report} is not UTF-8 text (a PDF?); give the Markdown it is built "
                        "from, e.g. report/report.md") from None


def imported_gpu(args):
    """--gpu; for the committed report, a gpu_check.sh OUT first copied and unpacked
    into report/results/<GPU>-<date>/."""
    committed = args.results and args.results.resolve() == RESULTS.resolve()  # report.md's own inputs
    if not (args.gpu and committed and (args.gpu / "results.json").is_file()) \
            or args.gpu.resolve().is_relative_to(RESULTS.resolve()):
        return args.gpu
    facts = gpu.read_gpu_folder(args.gpu).facts  # ({} where results.json is damaged)
    name, date = str(facts.get("gpu", "")), str(facts.get("started_utc", ""))[:10]
    if not GPU_NAME.fullmatch(name) or not DATE.fullmatch(date):  # never a folder a JSON field chose
        raise UserError(f"--gpu {args.gpu}: results.json's gpu {name[:40]!r} or started_utc {date!r} is not a GPU "
                        "name ([A-Za-z0-9_-]) and a YYYY-MM-DD date; nothing copied")
    target, tmp = RESULTS / f"{name}-{date}", Path(tempfile.mkdtemp(prefix=TMP, dir=RESULTS))
    try:
        shutil.copytree(args.gpu, tmp, dirs_exist_ok=True)
        gpu.unpack(tmp, name)  # the one layout the report reads
        shutil.copytree(tmp, target, dirs_exist_ok=True)
    except gpu.ARCHIVE_ERRORS as e:
        raise UserError(f"--gpu {args.gpu}: cannot unpack it ({type(e).__name__}: {e}); nothing copied") from None
    finally:
        shutil.rmtree(tmp)
    print(f"copied and unpacked {args.gpu} into {rel(target)}")
    return target


# ----------------------------------------------------------------------------- inputs and output

def gather(args, gpu_folder=None):
    """Every input, read once: --results (a folder), the files and runs named, --gpu; nothing else."""
    r = Report([], {}, args)
    r.runs = find_runs(args.runs, args.runs_root, r.problems)
    r.by_kind = {run.kind: run for run in reversed(r.runs)}
    for results in filter(None, [args.results, *args.files]):
        r.results |= load_results(results, r.problems)
    r.folders = gpu.gpu_folders(gpu_folder, args.results, r.problems)
    roles = facts.role_runs(r.folders)
    r.shown = facts.shown_runs(r.by_kind, r.results, roles)
    r.sources = facts.derived_sources(r, roles)
    if args.no_screenshots:  # a screenshot's caption only where one is kept: taken before, or put there by hand
        built = built_lines(args.out_dir)
        kept = [*browser.kept_screenshots(args.out_dir, r.shown),
                *(p.name for p in args.out_dir.glob("*.png") if p.name not in built)]
        for alias, (kind, _) in facts.ALIASES.items():
            if not any(file in kept for file, _, _ in browser.SHOTS[kind]):
                r.sources.pop(f"{alias}_tb", None)
    return r


def images(text, built=None, problems=None):
    """The image links as names (beside report_filled.md in --out); with `built`, each a PNG there or a note."""
    def one(match):
        link = Path(match.group(1))
        if built and not browser.is_png(built / link.name):
            problems.append(f"report image {link} is missing, empty or not a PNG; left out of the PDF")
            return f"**[figure missing: `{escape(link, code=True)}`]**"
        return match.group(0).replace(match.group(1), link.name)
    return IMAGE_LINK.sub(one, text)


def build(args, r, text, used):
    r.linked = {Path(link).name for link in IMAGE_LINK.findall(text)}
    keep = browser.kept_screenshots(args.out_dir, r.shown) if args.no_screenshots else []
    with building(args.out_dir, keep) as r.out:
        inputs = filter(None, [args.results, *args.files, *(run.events for run in r.runs)])
        lines = ["# Generated results", "", "Written by `python report/make_report.py`; every number is read from "
                 "the files named. Inputs: `" + "`, `".join(escape(rel(p), code=True) for p in inputs) + "`.", ""]
        lines += run_lines(r) + gpu_lines(r, not args.no_screenshots)
        lines += ["", "## Placeholders", "", f"Those {rel(args.report)} uses:", ""] + (
            [f"- `{p}` -> {v} -> `{escape(s, code=True)}`" for p, v, s in used] or ["- none"])
        if used:
            (r.out / "report_filled.md").write_text(images(text))
        named = [args.report, args.results, args.gpu, args.runs_root, *args.runs, *args.files]
        (r.out / "sources.json").write_text(json.dumps({  # what slurm/handin.sh packs beside the PDF
            "inputs": [os.path.abspath(path) for path in named if path],
            "markdown": os.path.abspath(args.out_dir / "report_filled.md") if used else None,
            "pdf": os.path.abspath(args.pdf_out) if args.pdf else None}, indent=1))
        text = images(text, r.out, r.problems) if args.pdf else text
        r.problems[:] = list(dict.fromkeys(r.problems))  # a damaged folder read twice is one problem
        if r.problems:
            lines += ["", "## Problems with the inputs", ""] + [f"- {html.escape(p, False)}" for p in r.problems]
        (r.out / "results.md").write_text("\n".join(lines) + "\n")
    return text


def main(argv=None):
    args = parse_args(argv)
    written = []  # --out once renamed into place: what a Ctrl-C says is kept
    with lifecycle.one_line_errors(lambda: kept(args, written)):
        try:
            report_text = check_args(args)
            r = gather(args, imported_gpu(args))
            text, unfilled, used = facts.fill(report_text, r.sources)
            if unfilled and args.pdf:  # before the figures: a PDF with a blank is never made
                raise UserError(unfilled[0] + (f" (and {len(unfilled) - 1} more)" if len(unfilled) > 1 else ""))
            r.problems += unfilled  # a placeholder its inputs cannot fill: a mistake in the report or the inputs
            with locked(args.out_dir):
                write(args, r, text, used, written)
        except OSError as e:  # a disk that filled or turned read-only mid-build: the old --out is left whole
            if e.errno not in DISK_ERRORS:
                raise
            sys.exit(f"error: {e.strerror}: {e.filename or args.out}; {kept(args, written)}")


def write(args, r, text, used, written):
    """--out (and --pdf-out) written, by this build alone; `written` says when --out is in place."""
    text = build(args, r, text, used)
    written.append(args.out_dir)
    print(f"wrote {args.out_dir / 'results.md'} and {len(list(args.out_dir.glob('*.png')))} figures"
          + (f"; {len(r.problems)} problem(s) with the inputs" if r.problems else ""))
    for line in r.todo:
        print(f"GPU figure missing: {line}")
    for problem in r.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.pdf:
        browser.write_pdf(args.out_dir / "report_filled.md", args.pdf_out, text)  # (its images beside it)
        print(f"wrote {args.pdf_out}")


def kept(args, written):
    if written:
        return f"--out {args.out} was written" + (f"; --pdf-out {args.pdf_out} was left as it was" if args.pdf else "")
    return f"--out {args.out}" + (f" and --pdf-out {args.pdf_out} were left as they were" if args.pdf else
                                  " was left as it was")


if __name__ == "__main__":
    lifecycle.run(main)
