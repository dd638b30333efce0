"""What benchmarks/gpu_check.sh needs Python for: `python benchmarks/gpu_check_tools.py COMMAND ARGS...` calls the
function COMMAND (dashes for underscores; what it returns is the exit status, None for 0). Those before the first
step use the standard library and data/files.py only: the carried packages are not installed yet."""
import importlib.metadata as metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # appended: cuda_ready's gelu_ext is the first on PYTHONPATH (a fresh build's)
from data.files import write_json


def one_line(text, limit=400):
    """Tabs, newlines and carriage returns (progress bars) as spaces; any byte as text (not UTF-8: U+FFFD)."""
    text = os.fsencode(text).decode("utf-8", "replace")
    return re.sub(r"[\t\r\n]+", " ", text).strip()[:limit]


def missing_wheels(wheel_dir):
    """The wheels whose distribution is not installed at all: the image's packages are never replaced."""
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        try:
            metadata.version(wheel.name.split("-")[0])  # importlib.metadata normalises the name
        except metadata.PackageNotFoundError:
            print(wheel)


def cuda_ready(rehearsal="0"):
    """The first gelu_ext on the path (a fresh build's) has its CUDA kernels compiled in, else every CUDA test
    would skip and pytest pass; on a GPU, torch also sees the device (a rehearsal has none to see)."""
    import torch

    import gelu_ext
    problems = [(rehearsal != "1" and not torch.cuda.is_available(),
                 f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none'})"),
                (not gelu_ext.is_built(), "gelu_ext is not built (the build step failed or did not run)"),
                (not gelu_ext.built_with_cuda(),
                 f"gelu_ext was built without CUDA kernels (no usable nvcc for torch's CUDA {torch.version.cuda})")]
    problem = next((message for bad, message in problems if bad), None)
    print(problem or f"gelu_ext: CPU + CUDA kernels ({Path(gelu_ext.__file__).parent})")
    return 1 if problem else 0


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def append_line(path, entry):
    with open(path, "a") as f:  # one JSON line: no byte of a message breaks the file
        f.write(json.dumps(entry) + "\n")


def record(work, step, status, seconds=""):
    append_line(Path(work) / "steps.jsonl", {"step": step, "status": one_line(status),
                                              "seconds": int(seconds) if seconds else None})


def facts(work, *pairs):
    """WORK/facts.json, results.json's head, from KEY=VALUE pairs (what ran where, as the shell read it); the
    corpus is what it is, not what it is called: a stand-in must never be quoted as WOS."""
    head = {key: one_line(value) or None for key, _, value in (p.partition("=") for p in pairs)}
    head |= {"rehearsal": head["rehearsal"] == "1", "budget_seconds": int(head["budget_seconds"]),
             "corpus": {"source": head.pop("corpus"), "documents": int(head.pop("documents"))},
             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version()}
    write_json(Path(work) / "facts.json", head)


def results(work, out):
    """results.json: the facts, each step's entry in order, an interruption, every JSON result by file name."""
    work = Path(work)
    head = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    if (work / "interrupted").exists():
        head["interrupted"] = (work / "interrupted").read_text().strip()
    found = {path.stem: json.loads(path.read_text()) for path in sorted((work / "results").glob("*.json"))}
    write_json(out, {**head, "steps": read_lines(work / "steps.jsonl"), "clocks": read_lines(work / "clocks.jsonl"),
                     "results": found})


def clocked(work, metrics, *command):
    """COMMAND, and its wall time from here (fork to exit) beside the metrics' own process_seconds and phases,
    into clocks.jsonl. The report quotes process_seconds; a gap over 1 s (CUDA's teardown after os._exit is
    outside it) says that figure is short by it."""
    started = time.perf_counter()
    code = subprocess.run(command).returncode
    wall = time.perf_counter() - started
    if code:  # a failure's last line stays its own
        return code
    m = json.loads(Path(metrics).read_text())
    process = m.get("process_seconds")
    entry = {"run": Path(metrics).stem, "shell_wall_seconds": round(wall, 3), "process_seconds": process,
             **{k: m.get(k) for k in ("process_seconds_total", "train_seconds", "phases")},
             "agree_within_1s": process is not None and abs(wall - process) <= 1.0, "report_quotes": "process_seconds"}
    append_line(Path(work) / "clocks.jsonl", entry)
    print(f"clock: {entry['run']}: {wall:.2f} s from here, process_seconds {process} "
          f"({'within 1 s' if entry['agree_within_1s'] else 'they DISAGREE by over 1 s'})")


def compile_ab(work, tokens, gpu):
    """results/compile_ab_GPU.json: the process seconds of each compile off / regional run so far in its cell,
    cold (fresh compile and micro-batch caches) or warm (a cold run's again), and each cell's median: does
    compile pay? (Each run's metrics and wall time from here are in results.json.)"""
    cells = {}
    for path in sorted((Path(work) / "results").glob(f"gpt_run_{tokens}-own-vocab-*_{gpu}.json")):
        name = path.stem.removeprefix(f"gpt_run_{tokens}-own-vocab-").removesuffix(f"_{gpu}")
        ab = re.fullmatch(r"ab-(off|regional)-(cold|warm)-\d+", name)  # the graded and regional runs: the first cold
        cell = {"cold": "off_cold", "regional-compile-cold": "regional_cold"}.get(name) or ab and f"{ab[1]}_{ab[2]}"
        if cell:  # not fp16 and the like
            cells.setdefault(cell, {})[path.stem] = json.loads(path.read_text())["process_seconds"]
    median = {cell: statistics.median(runs.values()) for cell, runs in sorted(cells.items())}
    write_json(Path(work) / "results" / f"compile_ab_{gpu}.json",
               {"gpu": gpu, "tokens": tokens, "process_seconds": cells, "median_process_seconds": median})
    print(f"compile A/B, median process seconds: {median}")


def gpt_verdict(metrics, rehearsal="0"):
    """The lab's criterion (train loss < 7) and the steps GradScaler skipped, from a run's metrics."""
    m = json.loads(Path(metrics).read_text())
    print(f"{m['precision']}: train loss {m['final_train_loss']:.3f} ({'below' if m['success'] else 'NOT below'} 7), "
          f"{m['skipped_steps']} of {m['steps']} steps skipped by GradScaler")
    return 0 if m["success"] or rehearsal == "1" else 1


if __name__ == "__main__":
    sys.exit(globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:]))
