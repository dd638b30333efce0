"""What benchmarks/gpu_check.sh needs Python for: `python benchmarks/gpu_check_tools.py COMMAND ARGS...` calls the
function COMMAND (dashes for underscores; what it returns is the exit status, None for 0). Those before the first
step use the standard library and data/files.py only: the carried packages are not installed yet."""
import functools
import gzip
import hashlib
import importlib
import importlib.metadata as metadata
import json
import math
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
import traceback
import zipfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # appended: cuda_ready's gelu_ext is the first on PYTHONPATH (a fresh build's)
from data.files import write_json


def fail(message):
    print(one_line(message, 400))
    return 1


def one_line(text, limit=300):
    """Tabs, newlines and carriage returns (progress bars) as spaces."""
    return re.sub(r"[\t\r\n]+", " ", text).strip()[:limit]


def from_argv(text):
    """An argument as text whatever its bytes (what is not UTF-8 becomes U+FFFD)."""
    return os.fsencode(text).decode("utf-8", "replace")


def missing_wheels(wheel_dir):
    """The wheels whose distribution is not installed at all: the image's packages are never replaced."""
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        try:
            metadata.version(wheel.name.split("-")[0])  # importlib.metadata normalises the name
        except metadata.PackageNotFoundError:
            print(wheel)


PREP_FILES = ["wheels", "MNIST/raw", "X.txt.gz", "corpus_source.tsv", "gpt2-tokenizer/tokenizer.json", "prep.txt"]
MNIST_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def mnist_subset(src, dst, n_train, n_test):
    """The first N images and labels of each MNIST IDX file, where lenet5.py looks (it has no flag for a part)."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    for name, n in zip(MNIST_FILES, map(int, (n_train, n_train, n_test, n_test))):
        path = next(p for d in (Path(src) / "MNIST" / "raw", Path(src)) for p in (d / name, d / f"{name}.gz")
                    if p.exists())
        data = (gzip.decompress if path.suffix == ".gz" else bytes)(path.read_bytes())
        ndim = data[3]
        dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
        keep = min(n, dims[0])
        header = data[:4] + struct.pack(f">{ndim}I", keep, *dims[1:])
        (Path(dst) / name).write_bytes(header + data[4 + 4 * ndim:][:keep * math.prod(dims[1:])])


def imports(*specs):
    """STEP=mod,mod...: STEP<TAB>ok, or the first failed import's last line (the scripts' path)."""
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "report")]

    @functools.cache
    def why(module):
        try:
            importlib.import_module(module)
        except BaseException as e:  # SystemExit or an OSError from a broken .so are reasons too
            return one_line(f"import {module}: " + traceback.format_exception_only(e)[-1])
    for step, _, modules in (spec.partition("=") for spec in specs):
        failures = (why(m) for m in modules.split(",") if m)  # the first one stops the step's imports
        print(f"{step}\t{next(filter(None, failures), 'ok')}", flush=True)


def check_prep(prep):
    """A --prepare folder, whole and made for this interpreter: else its first problem in one line, exit 1."""
    problem = next(prep_problems(Path(prep)), None)
    return fail(problem) if problem else 0


def prep_problems(prep):
    """In order: DIR's files; wheels made for this Python and platform (pip would refuse them late); every .gz
    read to its end and every wheel's zip tested (named here, not in a step's traceback); the corpus line."""
    again = "make DIR again with --prepare"
    yield from (f"{prep / name} not found: make DIR with --prepare" for name in
                [*PREP_FILES, *(f"MNIST/raw/{n}.gz" for n in MNIST_FILES)] if not (prep / name).exists())
    made = dict(line.split(" ", 1) for line in (prep / "prep.txt").read_text().splitlines() if " " in line)
    here_py, here = f"{sys.version_info[0]}.{sys.version_info[1]}", f"{sys.platform}-{platform.machine()}"
    if made.get("python") != here_py:
        yield (f"{prep} was prepared for Python {made.get('python', '?')}, {sys.executable} is {here_py}: "
               f"prepare again with --python {here_py}")
    if made.get("platform") != here:
        yield f"{prep} was prepared for {made.get('platform', '?')}, this machine is {here}"
    for path in [prep / "X.txt.gz", *sorted((prep / "MNIST" / "raw").glob("*.gz"))]:
        try:
            with gzip.open(path) as f, open(os.devnull, "wb") as null:
                shutil.copyfileobj(f, null)
        except (OSError, EOFError, zlib.error) as e:
            yield f"{path} is damaged ({type(e).__name__}: {e}): {again}"
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


def rehearsal_venv(cache):
    """Prints the bin folder of the lent image's python3 for a rehearsal, then what it is: a venv (made once under
    CACHE) whose .pth names this interpreter's site-packages, its base a python without torch (a link fails)."""
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
    if not venv.exists():  # made beside, then renamed: a venv there is whole
        tmp = Path(f"{venv}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        (tmp / "lib" / f"python{version}" / "site-packages" / "lab5-image.pth").write_text("\n".join(sites) + "\n")
        if subprocess.run([tmp / "bin" / "python3", "-c", "import torch"], capture_output=True).returncode:
            return fail(f"the rehearsal's venv {tmp} does not import torch")
        os.replace(tmp, venv)
    link = ("fails 'import torch', as on the image" if base != sys.executable
            else "imports torch too (its base has it): the image fails there")
    print(f"{venv / 'bin'}\nrehearsal: python3 of a venv shaped like the lent image's ({venv}, base {base}); "
          f"a link to it from another folder {link}")


def cuda_ready(rehearsal="0"):
    """The first gelu_ext on the path (a fresh build's) has its CUDA kernels compiled in, else every CUDA test
    would skip and pytest pass; on a GPU, torch also sees the device (a rehearsal has none to see)."""
    import torch
    if rehearsal != "1" and not torch.cuda.is_available():
        return fail(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none'})")
    import gelu_ext
    if not gelu_ext.is_built():
        return fail("gelu_ext is not built (the build step failed or did not run)")
    if not gelu_ext.built_with_cuda():
        return fail(f"gelu_ext was built without CUDA kernels (no usable nvcc for torch's CUDA {torch.version.cuda})")
    print(f"gelu_ext: CPU + CUDA kernels ({Path(gelu_ext.__file__).parent})")
    return 0


def read_lines(path, name):
    """The entries of a JSON-lines file; a line cut by a kill is said, not fatal."""
    out = []
    for line in path.read_bytes().decode("utf-8", "replace").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({name: None, "status": "unreadable entry: " + one_line(line, 100), "seconds": None})
    return out


def record(work, step, status, seconds):
    with open(Path(work) / "steps.jsonl", "a") as f:  # one JSON line: no byte of a message breaks the file
        f.write(json.dumps({"step": step, "status": one_line(from_argv(status), 400),
                            "seconds": int(seconds) if seconds else None}) + "\n")


def facts(work, gpu, nvcc, source, docs, budget, rehearse, argv, python, torch, torch_cuda):
    """WORK/facts.json, results.json's head: what ran where (torch's versions as the shell read them)."""
    write_json(Path(work) / "facts.json", {
        "gpu": gpu, "rehearsal": rehearse == "1", "budget_seconds": int(budget),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
        "interpreter": python, "command": "bash benchmarks/gpu_check.sh " + from_argv(argv), "torch": torch,
        "torch_cuda": torch_cuda or None, "nvcc": nvcc or None,
        # what the corpus is, not what it is called: a stand-in must never be quoted as WOS
        "corpus": {"source": from_argv(source), "documents": int(docs)}})


def results(work, out):
    """results.json: the facts, each step's entry in order, an interruption, every JSON result by file name."""
    work = Path(work)
    head = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    if (work / "interrupted").exists():
        head["interrupted"] = (work / "interrupted").read_text().strip()
    found = {}
    for path in sorted((work / "results").glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a step cut while writing: say so, keep the rest
            found[path.stem] = {"unreadable": str(e)}
    write_json(out, {**head, "steps": read_lines(work / "steps.jsonl", "step"),
                     "clocks": read_lines(work / "clocks.jsonl", "run"), "results": found})


def clock(work, metrics, started, ended):
    """A run's wall time from the shell (fork to exit) beside its own process_seconds and phases, into clocks.jsonl."""
    wall = float(ended) - float(started)
    try:
        m = json.loads(Path(metrics).read_text())
    except (OSError, ValueError):
        m = {}
    process = m.get("process_seconds")
    entry = {"run": Path(metrics).stem, "shell_wall_seconds": round(wall, 3), "process_seconds": process,
             **{k: m.get(k) for k in ("process_seconds_total", "train_seconds", "phases")},
             # the report quotes process_seconds (report/facts.py); the shell's wall time includes CUDA's
             # teardown after os._exit: a gap over 1 s says the report's figure is short by it
             "agree_within_1s": process is not None and abs(wall - process) <= 1.0, "report_quotes": "process_seconds"}
    with open(Path(work) / "clocks.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(f"clock: {entry['run']}: {wall:.2f} s from the shell, process_seconds {process} (quoted by the report; "
          f"{'they agree within 1 s' if entry['agree_within_1s'] else 'they DISAGREE by over 1 s'})")


AB_KEYS = ("process_seconds", "compile_seconds", "train_seconds", "tokens_per_second")


def compile_ab(work, tokens, gpu):
    """results/compile_ab_GPU.json: each compile off / regional run so far in its cell, cold (fresh compile and
    micro-batch caches) or warm (a cold run's again), and the cells' medians: does compile pay?"""
    work = Path(work)
    clocks = {c["run"]: c.get("shell_wall_seconds") for c in read_lines(work / "clocks.jsonl", "run")}
    cells = {}
    for path in sorted((work / "results").glob(f"gpt_run_{tokens}-own-vocab-*_{gpu}.json")):
        name = path.stem.removeprefix(f"gpt_run_{tokens}-own-vocab-").removesuffix(f"_{gpu}")
        ab = re.fullmatch(r"ab-(off|regional)-(cold|warm)-\d+", name)  # the graded and regional runs: the first cold
        cell = {"cold": "off_cold", "regional-compile-cold": "regional_cold"}.get(name) or ab and f"{ab[1]}_{ab[2]}"
        if cell:  # not fp16 and the like
            m = json.loads(path.read_text())
            cells.setdefault(cell, []).append({"run": path.stem, **{k: m.get(k) for k in AB_KEYS},
                                               "shell_wall_seconds": clocks.get(path.stem)})
    median = {cell: {k: statistics.median([r[k] for r in runs if r[k] is not None] or [None])  # none: None
                     for k in ("process_seconds", "shell_wall_seconds", "compile_seconds")}
              for cell, runs in cells.items()}
    write_json(work / "results" / f"compile_ab_{gpu}.json",
               {"gpu": gpu, "tokens": tokens, "runs": cells, "median": median, "report_quotes": "process_seconds"})
    print("compile A/B, median process seconds: " + ", ".join(f"{c} {v['process_seconds']} ({len(cells[c])} runs)"
                                                             for c, v in sorted(median.items())))


def gpt_verdict(metrics, rehearsal="0"):
    """The lab's criterion (train loss < 7) and the steps GradScaler skipped, from a run's metrics."""
    m = json.loads(Path(metrics).read_text())
    print(f"{m['precision']}: train loss {m['final_train_loss']:.3f} ({'below' if m['success'] else 'NOT below'} 7), "
          f"{m['skipped_steps']} of {m['steps']} steps skipped by GradScaler")
    return 0 if m["success"] or rehearsal == "1" else 1


# What a step needs in a fresh OUT comes with it (compile-ab warms its cold runs' caches); the build not,
# once made: it is installed into gelu_ext/.
NEEDS = {"cuda-tests": ["build"], "gelu-bench": ["build"], "lenet-cpp": ["build"], "gpt-own-vocab": ["tokenizer"],
         "gpt-own-vocab-regional-compile": ["tokenizer"], "gpt-own-vocab-fp16": ["tokenizer"],
         "compile-ab": ["tokenizer", "gpt-own-vocab", "gpt-own-vocab-regional-compile"]}
# a lent machine's 15 minutes, less its start (1-2 minutes) and the transfers and warm wait between calls
LEASE_LEFT_SECONDS = 15 * 60 - 120 - 30


def plan(text, only, budget, reserve=30):
    """The plan line: the steps asked for ('step expected cap|...' in order; ~: estimated; 0: beside the
    others) at the H200's seconds, what fits the budget less the report's reserve, what is cut."""
    fits, cut, used, room = [], [], 0, int(budget) - int(reserve)
    for step, expected, _ in (item.split() for item in text.split("|")):
        if step in only.split() and step != "report":
            used += int(expected.lstrip("~"))
            (fits if used <= room and not cut else cut).append(f"{step} {'beside' if expected == '0' else expected}")
    print(f"plan for a budget of {budget} s (one call on the lent H200: its 15 device-minutes less 1-2 to start; "
          f"seconds each as measured there on 2026-11-30, ~ estimated): {', '.join(fits)}, report; "
          + (f"cut, for a second call: {', '.join(cut)}" if cut else "nothing cut"))


def end(work, out, text, elapsed, from_arg, rehearsal):
    """The summary; the last line: the exact call for what was cut or failed (and what it needs) at the budget
    a warm machine has left; exit 0 when every step asked for is ok (or the ladder, cut at its cap by design)."""
    steps = read_lines(Path(work) / "steps.jsonl", "step")
    status = {s["step"]: s["status"] for s in steps}
    ok = sum(s == "ok" for s in status.values())
    print(f"[{elapsed} s] done: {ok} steps ok, {len(steps) - ok} not; OUT: "
          + " ".join(sorted(p.name for p in Path(out).iterdir())))
    again = [step for step, s in status.items() if s != "ok" and not s.startswith("skipped: not asked")]
    for step in again:  # grows as it goes: what a needed step needs comes along too
        again += [n for n in NEEDS.get(step, []) if n not in again and not (n == "build" and status.get(n) == "ok")]
    order = [item.split()[0] for item in text.split("|")]
    only = ",".join(sorted(set(again) | {"report"}, key=order.index))
    left = LEASE_LEFT_SECONDS - int(elapsed)
    where = f"about {left} s of this machine's lease left" if left >= 90 else "no room on this machine: on the next"
    print("second call: none needed (every step asked for is done)" if only == "report" else
          f"second call ({where}): bash benchmarks/gpu_check.sh {'--rehearse ' if rehearsal == '1' else ''}"
          f"{from_arg + ' ' if from_arg else ''}--out {out}-2 --budget {min(540, left) if left >= 90 else 540} "
          f"--only {only}")
    return 0 if all(s["status"] == "ok" or s["status"].startswith("skipped: not asked")
                    or (s["step"] == "ladder" and s["status"].startswith("cut at")) for s in steps) else 1


if __name__ == "__main__":
    sys.exit(globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:]))
