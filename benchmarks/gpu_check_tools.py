"""What benchmarks/gpu_check.sh needs Python for, one command a function (standard library only, plus
`packaging`, which pip brings: it runs before the carried packages are installed).

    python benchmarks/gpu_check_tools.py check-prep DIR                    one line on what is wrong with DIR
    python benchmarks/gpu_check_tools.py missing-wheels WHEELDIR          wheels whose package is not installed
    python benchmarks/gpu_check_tools.py requirements DIST...             one line per unmet requirement
    python benchmarks/gpu_check_tools.py imports STEP=mod,mod ...         STEP<TAB>ok | STEP<TAB>why, one a line
    python benchmarks/gpu_check_tools.py rehearsal-venv CACHE             the image's python3 shape (--rehearse)
    python benchmarks/gpu_check_tools.py record WORK STEP STATUS SECONDS  one step's entry (any bytes)
    python benchmarks/gpu_check_tools.py results WORK OUT.json            every step's status and results
    python benchmarks/gpu_check_tools.py clock WORK METRICS.json T0 T1    a run's shell wall time beside its clock
    python benchmarks/gpu_check_tools.py compile-ab WORK TOKENS GPU       compile off vs regional, cold and warm
    python benchmarks/gpu_check_tools.py mnist-subset SRC DST N_TRAIN N_TEST   the first N images (rehearsal)
    python benchmarks/gpu_check_tools.py cuda-ready | gpt-verdict | plan | summary | second-call | all-ok
"""
import gzip
import importlib
import importlib.metadata as metadata
import json
import math
import os
import platform
import re
import statistics
import struct
import sys
import traceback
import zipfile
import zlib
from pathlib import Path

COMMANDS = """check_prep missing_wheels requirements imports rehearsal_venv record results clock compile_ab mnist_subset
              cuda_ready gpt_verdict plan summary second_call all_ok"""


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing_wheels(wheel_dir):
    """The wheels whose distribution is not installed at all: the image's packages are never replaced."""
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        if installed(normalise(wheel.name.split("-")[0])) is None:
            print(wheel)


def requirements(*dists):
    """Each dist's unconditional requirements against what is importable now (image + carried folder)."""
    from packaging.requirements import Requirement
    problems = []
    for dist in dists:
        if installed(dist) is None:
            problems.append(f"{dist} not installed")
            continue
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed(req.name)
            if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
                problems.append(f"{dist} needs {req.name}{req.specifier or ''}, found {have or 'none'}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


def imports(*specs):
    """STEP=mod,mod: import each module once (repository and benchmarks/ on the path, as the scripts
    have them); a step is ok when all its modules import, else the first failure's last line."""
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo), str(repo / "benchmarks"), str(repo / "report")]
    failed = {}
    for spec in specs:
        step, _, modules = spec.partition("=")
        why = None
        for module in filter(None, modules.split(",")):
            if module not in failed:
                try:
                    importlib.import_module(module)
                    failed[module] = None
                except BaseException as e:  # SystemExit or an OSError from a broken .so are reasons too
                    failed[module] = one_line(f"import {module}: " + traceback.format_exception_only(e)[-1])
            why = why or failed[module]
        print(f"{step}\t{why or 'ok'}", flush=True)


def one_line(text, limit=300):
    """A message as one line of text: tabs, newlines and carriage returns (progress bars) as spaces."""
    return re.sub(r"[\t\r\n]+", " ", text).strip()[:limit]


def from_argv(text):
    """An argument as text whatever its bytes: what is not UTF-8 becomes U+FFFD, never an error."""
    return os.fsencode(text).decode("utf-8", "replace")


def record(work, step, status, seconds):
    """Append one step's entry to WORK/steps.jsonl: JSON per line, so no byte of a message breaks it."""
    entry = {"step": step, "status": one_line(from_argv(status), 400), "seconds": int(seconds) if seconds else None}
    with open(Path(work) / "steps.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def steps_of(work):
    """The entries recorded so far; a line that does not parse (a write cut by a kill) is said, not fatal."""
    path = Path(work) / "steps.jsonl"
    out = []
    for line in path.read_bytes().decode("utf-8", "replace").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({"step": None, "status": "unreadable entry: " + one_line(line, 100), "seconds": None})
    return out


def results(work, out):
    """results.json: the run's facts, an entry per step in order (status, seconds), an interruption if
    there was one, and every JSON result the steps wrote, by file name."""
    work = Path(work)
    facts = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    if (work / "interrupted").exists():
        facts["interrupted"] = (work / "interrupted").read_text().strip()
    found = {}
    for path in sorted((work / "results").glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a step cut while writing: say so, keep the rest
            found[path.stem] = {"unreadable": str(e)}
    clocks = [json.loads(line) for line in (work / "clocks.jsonl").read_text().splitlines()
              if line.strip()] if (work / "clocks.jsonl").exists() else []
    write(out, {**facts, "steps": steps_of(work), "clocks": clocks, "results": found})


def mnist_subset(src, dst, n_train, n_test):
    """The first N images and labels of each MNIST IDX file (lenet5.py has no flag for a fraction of the
    data): the first dimension in the header rewritten, the rest cut. Looked up where lenet5.py looks."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", int(n_train)), ("t10k", int(n_test))):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte"
            path = next(p for d in (src / "MNIST" / "raw", src) for p in (d / name, d / f"{name}.gz") if p.exists())
            data = (gzip.decompress if path.suffix == ".gz" else bytes)(path.read_bytes())
            ndim = data[3]
            dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
            keep = min(n, dims[0])
            header = data[:4] + struct.pack(f">{ndim}I", keep, *dims[1:])
            body = data[4 + 4 * ndim:][:keep * math.prod(dims[1:])]
            (dst / name).write_bytes(header + body)


# ----------------------------------------------------------------------------- before the first step

PREP_FILES = ["wheels", "MNIST/raw", "X.txt.gz", "corpus_source.tsv", "gpt2-tokenizer/tokenizer.json", "prep.txt"]
MNIST_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def check_prep(prep):
    """A --prepare folder, whole and made for this interpreter: the first problem as one line, exit 1."""
    problem = next(prep_problems(Path(prep)), None)
    return fail(problem) if problem else 0


def prep_problems(prep):
    """What is wrong with DIR, in the order it is checked: its files there; the wheels made for this Python
    and platform (pip would refuse them late, at install); every .gz read to its end and every wheel's zip
    tested (not gzip or cut short is named here, not in a step's traceback); the corpus source line."""
    again = "make DIR again with --prepare"
    yield from (f"{prep / name} not found: make DIR with --prepare"
                for name in PREP_FILES if not (prep / name).exists())
    made = dict(line.split(" ", 1) for line in (prep / "prep.txt").read_text().splitlines() if " " in line)
    here_py, here = f"{sys.version_info[0]}.{sys.version_info[1]}", f"{sys.platform}-{platform.machine()}"
    if made.get("python") != here_py:
        yield (f"{prep} was prepared for Python {made.get('python', '?')}, {sys.executable} is {here_py}: "
               f"prepare again with --python {here_py}")
    if made.get("platform") != here:
        yield f"{prep} was prepared for {made.get('platform', '?')}, this machine is {here}"
    for path in [prep / "X.txt.gz", *sorted((prep / "MNIST" / "raw").glob("*.gz"))]:
        try:
            with gzip.open(path) as f:
                while f.read(1 << 22):
                    pass
        except (OSError, EOFError, zlib.error) as e:
            yield f"{path} is damaged ({type(e).__name__}: {e}): {again}"
    names = {p.name for p in (prep / "MNIST" / "raw").glob("*.gz")}
    yield from (f"{prep / 'MNIST/raw'} lacks {n}.gz: {again}" for n in MNIST_FILES if f"{n}.gz" not in names)
    lines = (prep / "corpus_source.tsv").read_bytes().decode("utf-8", "replace").splitlines()
    fields = lines[0].split("\t") if len(lines) == 1 else []
    if len(fields) != 2 or not fields[0].startswith("/") or not fields[1].isdigit() or int(fields[1]) == 0:
        yield f"{prep / 'corpus_source.tsv'} is malformed (want one line: /source/path<TAB>documents): {again}"
    for wheel in sorted((prep / "wheels").glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            bad = str(e)
        if bad:
            yield f"wheel {wheel} is damaged ({bad}): {again}"
    try:
        json.loads((prep / "gpt2-tokenizer" / "tokenizer.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        yield f"{prep / 'gpt2-tokenizer/tokenizer.json'} is not JSON ({e})"


def fail(message):
    print(one_line(message, 400))
    return 1


def rehearsal_venv(cache):
    """The lent image's interpreter shape for a rehearsal: a venv (no system site packages) whose python3
    imports torch only through its own pyvenv.cfg: a .pth in its site-packages names this interpreter's.
    Its base is a python of this version that lacks torch (/usr/bin's, say), so that a link to its python3
    from another folder, which Python starts as that base, fails as on the image; made once under CACHE.
    Prints its bin folder, then what it is (nothing to make where this interpreter is a venv's, as the image's)."""
    import hashlib
    import shutil
    import subprocess
    if sys.prefix != sys.base_prefix:
        print(f"{Path(sys.executable).parent}\nrehearsal: python3 is a venv's already ({sys.prefix}), as on the image")
        return 0
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    bases = [b for b in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                         shutil.which(f"python{version}")) if b and Path(b).is_file()]
    base = next((b for b in bases if subprocess.run([b, "-I", "-c", "import torch"], capture_output=True).returncode),
                sys.executable)
    key = hashlib.sha256("\n".join([sys.executable, base, *sites]).encode()).hexdigest()[:12]
    venv = Path(cache) / f"rehearsal-venv-{version}-{key}"
    if not (venv / "verdict.txt").exists():
        tmp = Path(f"{venv}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        (tmp / "lib" / f"python{version}" / "site-packages" / "lab5-image.pth").write_text("\n".join(sites) + "\n")
        link = Path(f"{tmp}-link") / "python"  # as the old gpu_check.sh linked it: no pyvenv.cfg one folder up
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(tmp / "bin" / "python3")
        venv_ok, link_ok = (not subprocess.run([str(p), "-c", "import torch"], capture_output=True).returncode
                            for p in (tmp / "bin" / "python3", link))
        shutil.rmtree(link.parent)
        if not venv_ok:
            return fail(f"the rehearsal's venv {tmp} does not import torch")
        (tmp / "verdict.txt").write_text(
            f"python3 of a venv shaped like the lent image's ({venv}, base {base}); a link to it from another "
            f"folder {'imports torch too (its base has it): the image fails there' if link_ok else 'fails'} "
            f"'import torch', as on the image\n")
        shutil.rmtree(venv, ignore_errors=True)
        os.replace(tmp, venv)
    print(f"{venv / 'bin'}\nrehearsal: " + (venv / "verdict.txt").read_text().strip())
    return 0


def cuda_ready(rehearsal="0"):
    """The extension (the first gelu_ext on the path: a fresh build's) has its CUDA kernels compiled in, else
    every CUDA test would skip and pytest pass; on a GPU, torch also sees the device. A rehearsal has none
    to see: the compiled kernels are what it checks."""
    import torch
    if rehearsal != "1" and not torch.cuda.is_available():
        return fail(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none'})")
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH's build
    import gelu_ext
    if not gelu_ext.is_built():
        return fail("gelu_ext is not built (the build step failed or did not run)")
    if not gelu_ext.built_with_cuda():
        return fail(f"gelu_ext was built without CUDA kernels (no usable nvcc for torch's CUDA {torch.version.cuda})")
    print(f"gelu_ext: CPU + CUDA kernels ({Path(gelu_ext.__file__).parent})")
    return 0


def clock(work, metrics, started, ended):
    """A run's wall time as the shell measured it (fork to exit) beside its metrics' own process_seconds and
    phases, into WORK/clocks.jsonl (results.json's `clocks`): a grader's clock and the run's should agree
    within a second (the interpreter's exit is the difference)."""
    wall = float(ended) - float(started)
    try:
        m = json.loads(Path(metrics).read_text())
    except (OSError, ValueError):
        m = {}
    process = m.get("process_seconds")
    entry = {"run": Path(metrics).stem, "shell_wall_seconds": round(wall, 3), "process_seconds": process,
             "process_seconds_total": m.get("process_seconds_total"), "train_seconds": m.get("train_seconds"),
             "phases": m.get("phases"), "agree_within_1s": process is not None and abs(wall - process) <= 1.0,
             # the report quotes process_seconds (report/facts.py); the shell's is the job's, CUDA's teardown
             # after os._exit included: a gap over 1 s here says the report's figure is short by it
             "report_quotes": "process_seconds"}
    with open(Path(work) / "clocks.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"clock: {entry['run']}: {wall:.2f} s from the shell, process_seconds {process} (quoted by the report; "
          f"{'they agree within 1 s' if entry['agree_within_1s'] else 'they DISAGREE by over 1 s'})")
    return 0


AB_KEYS = ("process_seconds", "compile_seconds", "train_seconds", "tokens_per_second")


def compile_ab(work, tokens, gpu):
    """results/compile_ab_GPU.json: every compile off / regional run so far, cold (fresh compile and
    micro-batch caches) and warm (a cold run's caches again), its seconds, and per cell the medians:
    does compile pay for the graded run, first and later?"""
    work = Path(work)
    clocks = {c["run"]: c["shell_wall_seconds"] for c in map(json.loads, (work / "clocks.jsonl").read_text()
                                                             .splitlines() if (work / "clocks.jsonl").exists() else [])}
    names = {f"{tokens}-own-vocab-cold": "off-cold-1", f"{tokens}-own-vocab-regional-compile-cold": "regional-cold-1"}
    cells = {}
    for path in sorted((work / "results").glob(f"gpt_run_{tokens}-own-vocab-*_{gpu}.json")):
        name = path.stem.removeprefix("gpt_run_").removesuffix(f"_{gpu}")
        run = names.get(name) or name.removeprefix(f"{tokens}-own-vocab-ab-")
        if run.count("-") != 2 or not run.startswith(("off-", "regional-")):
            continue
        m = json.loads(path.read_text())
        mode, state, _ = run.split("-")
        cells.setdefault(f"{mode}_{state}", []).append({"run": path.stem, **{k: m.get(k) for k in AB_KEYS},
                                                         "shell_wall_seconds": clocks.get(path.stem)})
    def med(runs, key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None
    median = {cell: {k: med(runs, k) for k in ("process_seconds", "shell_wall_seconds", "compile_seconds")}
              for cell, runs in cells.items()}
    out = {"gpu": gpu, "tokens": tokens, "runs": cells, "median": median, "report_quotes": "process_seconds"}
    write(work / "results" / f"compile_ab_{gpu}.json", out)
    print("compile A/B, median process seconds: " + ", ".join(f"{c} {v['process_seconds']} ({len(cells[c])} runs)"
                                                             for c, v in sorted(median.items())))
    return 0


def gpt_verdict(metrics, rehearsal="0"):
    """The lab's criterion (train loss < 7) and the steps GradScaler skipped, from a run's metrics."""
    m = json.loads(Path(metrics).read_text())
    skipped = m.get("skipped_steps")
    said = (f"{skipped} of {m['steps']} steps skipped by GradScaler" if skipped is not None
            else "skipped steps not in gpt_train's metrics")
    print(f"{m.get('precision', '?')}: train loss {m['final_train_loss']:.3f} "
          f"({'below' if m['success'] else 'NOT below'} 7), {said}")
    return 0 if m["success"] or rehearsal == "1" else 1


# ----------------------------------------------------------------------------- the plan

NEEDS = {"cuda-tests": "build", "gelu-bench": "build", "lenet-cpp": "build", "gpt-own-vocab": "tokenizer",
         "gpt-own-vocab-regional-compile": "tokenizer", "gpt-own-vocab-fp16": "tokenizer",
         "compile-ab": "tokenizer gpt-own-vocab gpt-own-vocab-regional-compile"}  # warm: their caches again
LEASE_SECONDS = 15 * 60  # a lent machine's time, all calls together
START_SECONDS = 120  # what starting it took of that (one to two minutes)
MARGIN_SECONDS = 30  # the transfers and the warm wait between calls


def parse_plan(text):
    """'step expected cap|...' -> [(step, expected seconds or None for 'beside', estimated?)]."""
    out = []
    for item in text.split("|"):
        step, expected, _ = item.split()
        out.append((step, int(expected.lstrip("~")), expected.startswith("~")))
    return out


def plan(text, only, budget, reserve=30):
    """The plan line: in order, what fits the budget (less the report's reserve) at the H200's expected
    seconds, the step the budget runs out in (cut there, or the ladder as far as it goes), and what is left
    for the second call that the last line gives."""
    fits, cut, used, room = [], [], 0, int(budget) - int(reserve)
    for step, expected, estimated in parse_plan(text):
        if step not in only.split() or step == "report":
            continue
        said = f"{step} {'beside' if expected == 0 else ('~' if estimated else '') + str(expected)}"
        if used + expected <= room and not cut:
            fits.append(said)
        elif not cut and room - used >= 30:
            fits.append(f"{step} (cut after ~{room - used} of ~{expected} s)")
            cut.append(f"{step}'s rest")
        else:
            cut.append(step)
        used += expected
    print(f"plan for a budget of {budget} s (one call on the lent H200: its 15 device-minutes less 1-2 to start; "
          f"seconds each as measured there on 2026-11-30, ~ estimated): {', '.join(fits)}, report; "
          + (f"cut, for a second call: {', '.join(cut)}" if cut else "nothing cut"))


def summary(work, out):
    steps = steps_of(work)
    ok = sum(s["status"] == "ok" for s in steps)
    print(f"done: {ok} steps ok, {len(steps) - ok} not; OUT: {' '.join(sorted(p.name for p in Path(out).iterdir()))}")


def settled(entry):
    """ok, not asked, or a ladder cut by the budget (its design: the rows done are its result)."""
    status = entry["status"]
    return status == "ok" or status.startswith("skipped: not asked") or (
        entry["step"] == "ladder" and status.startswith("cut at"))


def second_call(work, text, elapsed, from_arg, rehearsal, out=None):
    """The exact command for what was cut or failed, in the plan's order, sized to the warm machine's
    remaining minutes (the lease less its start, this call and a margin); the ladder takes the rest."""
    steps = steps_of(work)
    status = {s["step"]: s["status"] for s in steps}
    again = [s["step"] for s in steps if not settled(s) or (s["step"] == "ladder" and s["status"].startswith("cut"))]
    for step in list(again):  # what a step needs comes along (the build: unless this call made it)
        again += [s for s in NEEDS.get(step, "").split() if s not in again and (s, status.get(s)) != ("build", "ok")]
    again = [s for s in again if (s, status.get(s)) != ("build", "ok")]
    if not [s for s in again if s != "report"]:
        print("second call: none needed (every step asked for is done)")
        return 0
    left = LEASE_SECONDS - START_SECONDS - int(elapsed) - MARGIN_SECONDS
    budget = min(540, left)
    chosen, need = [], 30  # the report's
    for step, expected, _ in parse_plan(text):  # the ladder last: it takes what the others leave
        if step in again and step not in ("report", "ladder") and need + expected <= budget:
            chosen.append(step)
            need += expected
    if "ladder" in again and budget - need >= 60:
        chosen.append("ladder")
    chosen.append("report")
    base = "bash benchmarks/gpu_check.sh " + ("--rehearse " if rehearsal == "1" else "")
    base += (from_arg + " " if from_arg else "") + f"--out {out or 'OUT-2'}"
    if budget < 90:
        print(f"second call: no room on this machine (about {max(left, 0)} s of its lease left); on the next: "
              f"{base} --budget 520 --only " + ",".join(s for s, _, _ in parse_plan(text)
                                                         if s in again or s == "report"))
    else:
        print(f"second call (about {left} s of this machine's lease left): {base} --budget {budget} "
              f"--only {','.join(chosen)}")
    return 0


def all_ok(work):
    return 0 if all(settled(s) for s in steps_of(work)) else 1


def write(path, obj):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":  # gpu_check_tools.py COMMAND ARGS: the function of that name, dashes for underscores
    command = sys.argv[1].replace("-", "_")
    sys.exit(globals()[command](*sys.argv[2:]) if command in COMMANDS.split() else f"unknown command {sys.argv[1]}")
