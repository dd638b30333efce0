"""Regenerate the report's figures, results tables and numbers from ONE named set of inputs.

    python report/make_report.py --pdf                    # from report/results only, then report/report.pdf
    python report/make_report.py runs/lenet5/A runs/gpt/B --out /tmp/report   # your own runs added
    python report/make_report.py --runs-root runs --out /tmp/report           # the newest of yours
    python report/make_report.py --gpu OUT                # GPU figures from gpu_check.sh's OUT folder

The inputs: every JSON under --results (default report/results, subfolders too), its newest GPU results
folder (or --gpu), and only the runs named on the command line (run folders, or --runs-root for the
newest of each kind there): a run lying under runs/ is never picked up unasked. Writes into --out
(default report/generated/, built in a folder beside it and renamed into place, so it is never left
half-written): results.md (the tables, each figure's source, the problems with the inputs),
placeholders.md (every `{{key}}` report.md may use, with value and source; see report/facts.py) and the
figures report.md links (all of them with --all-figures). With --pdf, report.md's placeholders are
filled from the same inputs (report_filled.md in --out) and printed to --pdf-out; an unfillable
placeholder or a missing or broken image is an error or a problem line, never a blank. Nothing is
written under --results.
"""
import contextlib
import errno
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as python report/make_report.py: the repository, not report/, on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from report import browser, facts  # noqa: E402
from report.clock import phases_figure, profile_figure  # noqa: E402
from report.derived import derived_sources, job_rows, profile_rows, shown_runs  # noqa: E402
from report.figures import (
    gpt_curves,
    gpu_figure,
    ladder_figure,
    lenet_curves,
    lenet_images,
    scalars_from_metrics,  # noqa: E402
)
from report.gpu import gpu_inputs, gpu_slot_lines  # noqa: E402
from report.inputs import (  # noqa: E402
    REPO,
    figure_name,
    load_events,
    load_results,
    load_run,
    newest_run,
    rel,
    result_name,
)
from report.screenshots import kept_screenshots, tensorboard_screenshots  # noqa: E402
from report.tables import (
    gelu_table,
    gpt_table,
    ladder_table,
    lenet_bench_table,
    lenet_table,
    tokenizer_table,  # noqa: E402
)
from training import UserError, runfiles  # noqa: E402
from training.flags import Parser, path_flag  # noqa: E402

IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
MIN_FREE = 64 << 20  # bytes: the figures and screenshots of a report take ~10 MB, a PDF ~5 MB
BUILT = ".built-by-make_report"  # in --out: the files a build wrote (any other file there is someone else's)


# ----------------------------------------------------------------------------- sections

def run_section(run, table, curves, path):
    """The table and curves of one run (a named run's events, else its committed JSON's curves)."""
    m = run["metrics"]
    scalars = run.get("scalars") or scalars_from_metrics(m)
    lines = table(m) + [""]
    return lines + (curves(scalars, m, path) if path and any(scalars.values()) else [])


def alias_section(kind, inputs, table, curves, ctx):
    """The run the report's `lenet`/`gpt` placeholders and its lenet_curves/gpt_curves figure follow: the
    one its section shows (derived.shown_runs: the named run, else, in the team's report, the committed one)."""
    file = {"lenet5": "lenet_curves.png", "gpt": "gpt_curves.png"}[kind]
    shown = inputs["shown"].get(kind)
    if shown is None:
        return [f"- {ctx['no_run'][kind]}"]
    alias = shown["alias"]
    run = inputs["by_kind"].get(kind) or {"dir": shown["path"], "metrics": shown["metrics"]}
    try:
        section = run_section(run, table, curves, ctx["out"] / file if ctx["wanted"](file) else None)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        ctx["problems"].append(f"left out {run['dir']}: a field is missing or of the wrong type ({e})")
        return [f"- {ctx['no_run'][kind]}"]
    return [f"The run `{alias}` (placeholders `{{{{{alias}.…}}}}`, `{file}`): `{rel(run['dir'])}`", ""] + section


def curves_from_json(curves):
    """A result_sections figure: a run's curves redrawn from its metrics JSON, where it keeps them."""
    def figure(name, metrics, out):
        scalars = scalars_from_metrics(metrics)
        return curves(scalars, metrics, out / f"{name}.png") if any(scalars.values()) else []
    return figure


def result_sections(results, prefix, table, what, ctx, figure=None):
    """One table per results/<prefix>*.json (and its figure, where the report links it), or the line
    saying there is none; a file whose fields do not fit is named in `problems` and left out."""
    lines = []
    for key in sorted(k for k in results if result_name(k).startswith(prefix)):
        data, path = results[key]
        name = figure_name(key, results)
        try:
            drawn = figure(name, data, ctx["out"]) if figure and ctx["wanted"](f"{name}.png") else []
            section = table(data) + [""] + drawn
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            ctx["problems"].append(f"left out {path}: a field is missing or of the wrong type "
                                   f"({type(e).__name__}: {e})")
            continue
        lines += [f"`{rel(path)}` (placeholders `{{{{{name}.…}}}}`):", ""] + section + [""]
    return lines or [f"- no {what} found in {ctx['results']}"]


def lenet_lines(inputs, ctx):
    results, by_kind = inputs["results"], inputs["by_kind"]
    lines = ["## LeNet-5", ""] + alias_section("lenet5", inputs, lenet_table, lenet_curves, ctx)
    shown = inputs["shown"].get("lenet5")
    if shown and shown["events"]:  # the layers of the very run the section shows, never another's
        images = by_kind.get("lenet5") or {"dir": shown["events"], "images": load_events(shown["events"],
                                                                                          ctx["problems"])[1]}
        lines += ["", f"Intermediate layers of `{rel(shown['events'])}`:", ""]
        lines += lenet_images(images, ctx["out"], ctx["problems"])
    elif shown:
        lines += ["", f"- no TensorBoard events kept for `{shown['source']}`: no layer images (name a run folder "
                      "of `python lenet5.py`, or keep its events beside its JSON, in a folder of the same name)"]
    lines += ["", "Runs whose metrics were kept in the results:", ""]
    lines += result_sections(results, "lenet_run", lenet_table, "LeNet-5 run metrics", ctx,
                             curves_from_json(lenet_curves))
    lines += ["", "Speed against the lab's original recipe:", ""]
    return lines + result_sections(results, "lenet_bench", lenet_bench_table, "LeNet-5 benchmark", ctx)


def gpt_lines(inputs, ctx):
    """GELU, tokenizer, GPT and the ladder."""
    results = inputs["results"]
    lines = ["", "## GELU operator", ""] + result_sections(results, "gelu_bench", gelu_table, "GELU benchmark", ctx)
    lines += ["", "## Tokenizer", ""] + result_sections(results, "tokenizer", tokenizer_table, "tokenizer metrics", ctx)
    lines += ["", "## GPT-2", ""] + alias_section("gpt", inputs, gpt_table, gpt_curves, ctx)
    lines += ["", "Runs whose metrics were kept in the results:", ""]
    lines += result_sections(results, "gpt_run", gpt_table, "GPT run metrics", ctx, curves_from_json(gpt_curves))
    lines += ["", "## Acceleration ladder", ""]
    return lines + result_sections(results, "gpt_bench", ladder_table, "acceleration ladder", ctx, ladder_figure)


def clock_lines(inputs, ctx):
    """Where the job's seconds go (job_seconds.png) and the grouped one-step profile (step_profile.png),
    or the line saying which input is missing and the command that fills it."""
    lines = ["", "## The job's clock", ""]
    if inputs["job_rows"]:
        phases_figure(inputs["job_rows"], ctx["out"] / "job_seconds.png")
        lines += ["![where the job's seconds go](job_seconds.png) (runs with `phases`, else the loop and the rest of "
                  "the process time from a GPU folder's step log)"]
    else:
        lines += ["- no run with `phases` or a recorded process time: run the current `gpt_train.py` / `lenet5.py` "
                  "(their metrics.json records `process_seconds` and `phases`), or `bash benchmarks/gpu_check.sh`"]
    lines += ["", "## One training step, profiled", ""]
    if inputs["profile_rows"]:
        profile_figure(inputs["profile_rows"], ctx["out"] / "step_profile.png")
        return lines + ["![one step, grouped](step_profile.png)"]
    return lines + ["- no `profile` in the ladder's rows or the GPT run: `python benchmarks/gpt_bench.py --metrics-out "
                    "report/results/gpt_bench_cpu_2x1024.json` (its naive and default rows are profiled), or "
                    "`python gpt_train.py --profile`"]


def gpu_lines(inputs, ctx, args):
    """GPU use, the GPU slots the report links and the TensorBoard screenshots."""
    lines = ["", "## GPU utilisation", ""] + gpu_figure(list(inputs["by_kind"].values()), ctx["out"])
    lines += ["", "## GPU figures the report links", ""]
    if inputs["gpu"] is None and inputs["named"] and args.results.resolve() == (REPO / "report" / "results").resolve():
        lines += ["- runs were named and no `--gpu`: the committed GPU folder is not one of these inputs"]
    else:
        lines += gpu_slot_lines(inputs["gpu"], args.results, ctx["out"], ctx["todo"], ctx["problems"],
                                ctx["linked"])
    if args.no_screenshots:
        return lines
    lines += ["", "## TensorBoard, as a browser shows it", ""]
    runs = [{"dir": run["events"], "kind": kind} for kind, run in inputs["shown"].items() if run["events"]]
    lines += [f"- no TensorBoard events kept for `{run['source']}`: no screenshot of it"
              for run in inputs["shown"].values() if not run["events"]]
    return lines + tensorboard_screenshots(runs, ctx["out"], ctx["problems"])


# ----------------------------------------------------------------------------- inputs and output

def parse_args(argv):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", type=path_flag, help="your own run directories to report (default: none)")
    p.add_argument("--runs-root", type=path_flag, default=None,
                   help="report the newest LeNet-5 and GPT runs under this folder (default: none)")
    p.add_argument("--results", type=path_flag, default=REPO / "report" / "results",
                   help="benchmark/tokenizer/run JSON files (default: %(default)s)")
    p.add_argument("--out", type=path_flag, default=REPO / "report" / "generated", help="(default: %(default)s)")
    p.add_argument("--report", type=path_flag, default=REPO / "report" / "report.md",
                   help="the report whose links and placeholders are filled (default: %(default)s)")
    p.add_argument("--all-figures", action="store_true", help="draw every figure, not only those the report links")
    p.add_argument("--no-screenshots", action="store_true", help="skip the TensorBoard screenshots (Chromium); "
                   "those already in --out are kept")
    p.add_argument("--gpu", "--gpu-logs", type=path_flag, default=None, dest="gpu",
                   help="the GPU results folder whose nvidia-smi files and runs fill the GPU figures: "
                        "gpu_check.sh's OUT or its logs/, or a folder like report/results/h200-2026-11-30 "
                        "(default: the newest such folder under --results)")
    p.add_argument("--pdf", action="store_true", help="also render the filled report to --pdf-out")
    p.add_argument("--pdf-out", type=path_flag, default=REPO / "report" / "report.pdf", help="(default: %(default)s)")
    return p.parse_intermixed_args(argv)  # runs before and after the flags: make_report.py A --pdf B


def check_args(args):
    """The user's mistakes, before any work: one line each. No output overlaps an input (the report never
    writes what it reads: --pdf-out onto report.md, --out over a run it reports), and --pdf-out replaces a
    PDF only; neither lands inside a run's folder."""
    if args.out.is_symlink():  # a link to the student's folder: built there, the link left as it is
        args.out = args.out.resolve()
    out = args.out.resolve()
    inputs = {"--report": args.report, "--results": args.results, "--gpu": args.gpu,
              **{f"--runs-root's {k}": args.runs_root / k for k in ("lenet5", "gpt") if args.runs_root},
              **{f"the run {d}": d for d in args.runs}}
    for flag, path in {"--out": args.out, **({"--pdf-out": args.pdf_out} if args.pdf else {})}.items():
        if problem := runfiles.inside_another_run(path, flag):  # a run's files are that run's only record
            raise UserError(problem)
        for name, given in inputs.items():
            there, mine = Path(given or "").resolve(), path.resolve()
            if given and (there == mine or there.is_relative_to(mine) or mine.is_relative_to(there)):
                name = name if str(given) in name else f"{name} {given}"  # a run's name is its path
                raise UserError(f"{flag} {path} and {name} overlap: the report never writes its inputs")
    if args.pdf and args.pdf_out.exists() and (not args.pdf_out.is_file() or not is_pdf(args.pdf_out)):
        raise UserError(f"--pdf-out {args.pdf_out} exists and is not a PDF: give a new file name (nothing written)")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "results.md").is_file())):
        raise UserError(f"--out {args.out} is not a folder this program wrote (no results.md); give a new or empty one")
    if args.gpu and not args.gpu.is_dir():
        raise UserError(f"--gpu {args.gpu} is not a folder")
    if not args.report.is_file():
        raise UserError(f"--report {args.report} is not a file")
    try:
        args.report_text = args.report.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--report {args.report} is not UTF-8 text (a PDF?); give the Markdown it is built "
                        "from, e.g. report/report.md") from None
    writable(args.out, "--out")
    if args.pdf:
        writable(args.pdf_out, "--pdf-out")


def is_pdf(path):
    with open(path, "rb") as f:
        return f.read(5) == b"%PDF-"


def writable(path, flag):
    """A path this program may create or replace: its nearest existing folder is a folder, writable, on a
    disk with room; said in one line before any work (a read-only or full disk found later is one line too)."""
    parent = path.resolve()
    while not parent.exists():
        parent = parent.parent
    if parent == path.resolve():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK) or os.statvfs(parent).f_flag & os.ST_RDONLY:
        raise UserError(f"{flag} {path}: {parent} is read-only")
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE:
        raise UserError(f"{flag} {path}: {free >> 20} MiB free on {parent}'s disk, under the {MIN_FREE >> 20} MiB "
                        "a report needs")


def find_runs(args, problems):
    """{kind: run}: the first run of each kind named, or the newest of each under --runs-root; none unasked."""
    dirs = list(args.runs)
    if args.runs_root:
        dirs += [d for d in (newest_run(args.runs_root / k, problems) for k in ("lenet5", "gpt")) if d]
    by_kind = {}
    for run in (load_run(d, problems) for d in dirs):
        if run:
            by_kind.setdefault(run["kind"], run)
    return by_kind


def missing_run_lines(args):
    where = {k: f"under {rel(args.runs_root / k)}" for k in ("lenet5", "gpt")} if args.runs_root else \
        {k: "among the runs named" if args.runs else "in the results" for k in ("lenet5", "gpt")}
    return {"lenet5": f"no LeNet-5 run found {where['lenet5']}", "gpt": f"no GPT run found {where['gpt']}"}


@contextlib.contextmanager
def building(out, keep):
    """A fresh folder beside `out` to build in, renamed into place when the build succeeded (never a
    half-written --out); `keep`: file names carried over from the old --out (screenshots not retaken). Every
    file of the old --out that no build wrote (BUILT lists what one did: a student's own screenshots, notes)
    is moved into the new one, never deleted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become --out's: a folder as mkdir makes it
    try:
        for name in keep:
            if (out / name).is_file():
                shutil.copy2(out / name, tmp / name)
        yield tmp
        (tmp / BUILT).write_text("".join(f"{p.name}\n" for p in sorted(tmp.iterdir())))
        built = set((out / BUILT).read_text().split("\n")) if (out / BUILT).is_file() else set()
        for path in sorted(out.iterdir()) if out.is_dir() else []:
            if path.name not in built and not (tmp / path.name).exists():
                path.rename(tmp / path.name)  # someone else's: kept
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checked_images(text, args, built, problems):
    """The filled report with its images as absolute links (generated/X from --out, wherever that is),
    each checked in `built` (the folder being built); one that is missing, empty or not a PNG is
    replaced by a note and a problem line: a broken file never goes into the PDF."""
    base, out = args.report.parent.resolve(), args.out.resolve()

    def one(match):
        link = Path(match.group(1))
        ours = link.parts[:1] == ("generated",)
        if not browser.is_png(built / link.name if ours else base / link):
            problems.append(f"report image {link} is missing, empty or not a PNG; left out of the PDF")
            return f"**[figure missing: `{link}`]**"
        return match.group(0).replace(match.group(1), ((out / link.name) if ours else base / link).as_uri())
    return IMAGE_LINK.sub(one, text)


def build(args, inputs, filled):
    """Every section and file into a fresh --out; returns (lines, todo)."""
    linked = {Path(link).name for link in IMAGE_LINK.findall(args.report_text)}
    problems, todo = inputs["problems"], []
    with building(args.out, kept_screenshots(args.out, inputs["shown"]) if args.no_screenshots else []) as out:
        ctx = {"out": out, "problems": problems, "todo": todo, "results": args.results,
               "no_run": missing_run_lines(args),
               "linked": None if args.all_figures else linked,
               "wanted": lambda name: args.all_figures or name in linked}
        lines = ["# Generated results", "", "Written by `python report/make_report.py`; every number is read from "
                 "the files named. Inputs: `" + "`, `".join(map(rel, [args.results, *inputs["named_dirs"]])) + "`.", ""]
        lines += lenet_lines(inputs, ctx) + gpt_lines(inputs, ctx) + clock_lines(inputs, ctx)
        lines += gpu_lines(inputs, ctx, args)
        lines += ["", "## Placeholders", "",
                  f"Those {rel(args.report)} uses (every key there is: placeholders.md):", ""]
        lines += facts.used_lines(filled["used"])
        if filled["unfilled"]:  # other --results: the report's numbers come from inputs these do not have
            lines += ["", f"Not filled from these inputs ({len(filled['unfilled'])}):", ""]
            lines += [f"- {u}" for u in filled["unfilled"]]
        if filled["used"]:
            (out / "report_filled.md").write_text(filled["text"])
        if args.pdf:
            filled["text"] = checked_images(filled["text"], args, out, problems)
        problems[:] = list(dict.fromkeys(problems))  # a damaged folder read twice is one problem
        if problems:
            lines += ["", "## Problems with the inputs", ""] + [f"- {p}" for p in problems]
        (out / "results.md").write_text("\n".join(lines) + "\n")
        (out / "placeholders.md").write_text("\n".join(facts.available_lines(inputs["sources"])) + "\n")
    return lines, todo


def gather(args, problems):
    """Every input, read once: the runs named, the results, the GPU folder, what each section shows and
    the facts derived from them; args.report_text becomes the blocks of report.md these inputs can fill."""
    by_kind = find_runs(args, problems)
    results = load_results(args.results, problems)
    named = bool(args.runs or args.runs_root)
    # a student's runs named: none of the team's runs or GPU folder stands in for one missing (a named
    # run that could not be read is a "no run found" line, never the team's) unless asked for (--gpu)
    committed = not (named and args.results.resolve() == (REPO / "report" / "results").resolve())
    inputs = {"problems": problems, "by_kind": by_kind, "results": results, "named": named,
              "gpu": gpu_inputs(args, problems) if args.gpu or committed else None,
              "named_dirs": [r["dir"] for r in by_kind.values()], "shown": shown_runs(by_kind, results, committed)}
    inputs["job_rows"], inputs["profile_rows"] = job_rows(inputs), profile_rows(inputs)
    inputs["sources"] = facts.fact_sources(results, inputs["shown"]) | derived_sources(inputs)
    # the blocks of report.md its inputs can fill: a student's report drops the team's
    args.report_text = facts.select_blocks(args.report_text, {*inputs["sources"], "own" if named else "team"})
    return inputs


def main(argv=None):
    args = parse_args(argv)
    try:
        check_args(args)
        problems = []
        inputs = gather(args, problems)
        text, unfilled, used = facts.fill(args.report_text, inputs["sources"])
        if unfilled and args.pdf:  # before the figures: a PDF with a blank is never made
            raise UserError(f"{unfilled[0]} (and {len(unfilled) - 1} more)" if len(unfilled) > 1 else unfilled[0])
        own_inputs = (args.results.resolve() == (REPO / "report" / "results").resolve()
                      or args.report.resolve() != (REPO / "report" / "report.md").resolve())
        if own_inputs:  # report.md with its own inputs: a placeholder they cannot fill is a mistake in it
            problems += unfilled
        filled = {"text": text, "used": used, "unfilled": [] if own_inputs else unfilled}
        lines, todo = build(args, inputs, filled)
        summary = f"wrote {args.out / 'results.md'} and {len(list(args.out.glob('*.png')))} figures"
        print(summary + (f"; {len(problems)} problem(s) with the inputs" if problems else ""))
        for line in todo:
            print(f"GPU figure missing: {line}")
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        if args.pdf:
            write_pdf(args, filled["text"])
    except UserError as e:  # BrowserError too
        sys.exit(f"error: {e}")
    except OSError as e:  # a disk that filled or turned read-only mid-build: the old --out is left whole
        if e.errno not in DISK_ERRORS:
            raise
        sys.exit(f"error: {e.strerror}: {e.filename or args.out}; --out {args.out} was left as it was")
    return lines


def write_pdf(args, text):
    print(f"wrote {browser.write_pdf(args.report, args.pdf_out, text)}")


if __name__ == "__main__":
    main()
