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


def one_line(text):
    """Tabs, newlines and carriage returns (progress bars) as spaces; any byte as text (not UTF-8: U+FFFD)."""
    text = os.fsencode(text).decode("utf-8", "replace")
    return re.sub(r"[\t\r\n]+", " ", text).strip()[:400]


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

    import gelu_ext  # before gelu_bench, whose path puts the repository's gelu_ext first
    from gelu_bench import ext_missing_reason
    problem = (rehearsal != "1" and not torch.cuda.is_available() and f"torch {torch.__version__} sees no CUDA "
               f"device (built for CUDA {torch.version.cuda or 'none'})") or ext_missing_reason(torch.device("cuda"))
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
    """WORK/facts.json, results.json's head: what ran where (KEY=VALUE, as the shell read it)."""
    head = {key: one_line(value) or None for key, _, value in (p.partition("=") for p in pairs)}
    head |= {"rehearsal": head["rehearsal"] == "1", "budget_seconds": int(head["budget_seconds"]),
             "corpus": {"source": head.pop("corpus"), "documents": int(head.pop("documents"))},
             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version()}
    write_json(Path(work) / "facts.json", head)


def results(work, out):
    """results.json: the facts, the steps in order, an interruption, the clocks, the compile A/B, every result."""
    work = Path(work)
    head = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    if (work / "interrupted").exists():
        head["interrupted"] = (work / "interrupted").read_text().strip()
    found = {path.stem: json.loads(path.read_text()) for path in sorted((work / "results").glob("*.json"))}
    write_json(out, {**head, "steps": read_lines(work / "steps.jsonl"), "clocks": read_lines(work / "clocks.jsonl"),
                     "compile_ab": compile_ab(found), "results": found})


def clocked(work, metrics, *command):
    """COMMAND, and its wall time from here (fork to exit) beside the metrics' own process_seconds (which the
    report quotes; CUDA's teardown after os._exit is outside it), into clocks.jsonl."""
    started = time.perf_counter()
    code = subprocess.run(command).returncode
    wall = time.perf_counter() - started
    if code:  # a failure's last line stays its own
        return code
    process = json.loads(Path(metrics).read_text())["process_seconds"]
    append_line(Path(work) / "clocks.jsonl", {"run": Path(metrics).stem, "shell_wall_seconds": round(wall, 3),
                                              "process_seconds": process})


# the graded run (compile off), the regional-compile step's and compile-ab's runs: the cell of each, e.g. off_cold
AB_RUN = re.compile(r"gpt_run_[^-]+-own-vocab-(?:ab-)?(?P<mode>off|regional|)(?:-compile)?-?(?P<cache>cold|warm)[-_]")


def compile_ab(found):
    """Does compile pay? Each run's process seconds in its cell (cold: fresh caches; warm: a cold run's), medians."""
    cells = {}
    for stem, metrics in found.items():
        if (run := AB_RUN.match(stem)) and "process_seconds" in metrics:
            cells.setdefault(f"{run['mode'] or 'off'}_{run['cache']}", {})[stem] = metrics["process_seconds"]
    return {"process_seconds": cells,
            "median_process_seconds": {cell: statistics.median(runs.values()) for cell, runs in sorted(cells.items())}}


if __name__ == "__main__":
    sys.exit(globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:]))
