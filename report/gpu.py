"""A GPU results folder (report/results/h200-2026-11-30's loose files, or gpu_check.sh's OUT with its
results.json and logs.tar.gz): its files, its step times, the figures the report links from it
(GPU_SLOTS). A damaged folder is named once and its slots reported missing; nothing here raises on what
a folder holds. A run's TensorBoard events are found beside its JSON (inputs.events_beside).

    read_gpu_folder(folder)          {"folder", "files", "started", "damage", "steps"}
    gpu_inputs(args, problems)       --gpu, else the newest GPU folder under --results, read once
    gpu_slot_lines(gpu, ...)         each slot drawn, or the command that fills it
"""
import json
import re
import tarfile
import zlib
from datetime import datetime, timezone
from pathlib import Path

from report.figures import (
    gpt_curves,
    gpu_name,
    ladder_figure,
    scalars_from_metrics,
    terminal_figure,
    utilization_figure,
)
from report.inputs import load_json, rel

GPU_SLOTS = {  # figure the report links -> (what it shows, the files it is drawn from, gpu_check.sh steps
    # that write them); the names match both the first H200 folder's files and gpu_check.sh's logs
    "gpu_utilization.png": ("GPU utilisation and power during the 12M-token GPT run",
                            r"(nvidia-)?smi-gpt.*\.csv", "tokenizer,gpt-own-vocab"),
    # the warm run's snapshot first: the first H200 folder's cold snapshot is the ramp's first second (311 W)
    "gpu_utilization_lenet.png": ("GPU utilisation and power during the LeNet-5 run", r"(nvidia-)?smi-lenet.*\.csv",
                                  "lenet-torch"),
    "nvidia_smi_gpt.png": ("nvidia-smi during GPT training", r"nvidia-smi-during-gpt.*warm.*\.txt|"
                           r"nvidia-smi-during-gpt.*\.txt", "tokenizer,gpt-own-vocab"),
    "nvidia_smi_lenet.png": ("nvidia-smi during LeNet-5 training", r"nvidia-smi-during-lenet.*\.txt",
                             "lenet-torch"),
    "gpu_gpt_run.png": ("the 12M-token GPT run's curves", r"gpt_run_12M(-own-vocab)?-cold.*\.json",
                        "tokenizer,gpt-own-vocab"),
    "gpu_ladder.png": ("the acceleration ladder on the GPU", r"gpt_bench.*\.json", "ladder"),
}
PREFERRED = ("cold", "torch")  # of several matching files: the cold-cache GPT run, LeNet with --act torch
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)  # not a tarball, cut, unreadable
# gpu_check.sh's logs: its biggest, the 250 ms nvidia-smi CSV of a 20-minute run, is ~2 MB
MAX_LOG_BYTES, MAX_LOGS_BYTES = 64 << 20, 256 << 20


def packed_logs(path):
    """{file name: its text} of gpu_check.sh's logs.tar.gz, read whole now: a cut archive fails here.
    What is decompressed is bounded: a member (or all of them) larger than a log can be is refused from
    its header, before its bytes are inflated (a 1 GiB member would otherwise be read into memory twice)."""
    files, total = {}, 0
    with tarfile.open(path) as tar:
        while (member := tar.next()) is not None:  # one header at a time: never a skip over a huge member
            if not member.isfile():
                continue
            total += member.size
            if member.size > MAX_LOG_BYTES or total > MAX_LOGS_BYTES:
                raise ValueError(f"member {member.name} is {member.size:,} bytes uncompressed ({total:,} so far), "
                                 f"over the {MAX_LOG_BYTES >> 20} MiB a log may be ({MAX_LOGS_BYTES >> 20} MiB in all)")
            files.setdefault(Path(member.name).name, tar.extractfile(member).read().decode(errors="replace"))
    return files


def packed_results(path):
    """(results by file stem, started_utc, steps) of gpu_check.sh's results.json; ValueError names what is wrong."""
    data = load_json(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"is a JSON {type(data).__name__}, not an object")
    if not isinstance(data.get("results", {}), dict):
        raise ValueError(f"has 'results': {json.dumps(data['results'])[:40]}, not an object")
    steps = data.get("steps")
    return data.get("results", {}), data.get("started_utc"), steps if isinstance(steps, list) else []


def read_gpu_folder(folder):
    """The folder's files as {name: a function returning its text} (loose .csv/.txt/.json, logs.tar.gz's
    members, results.json's entries as their own files), when it was measured, and what is damaged."""
    files = {p.name: (lambda p=p: p.read_text(errors="replace"))  # a log cut inside a character still reads
             for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix in (".csv", ".txt", ".log")}
    files.update({p.name: p.read_text for p in sorted(folder.rglob("*.json")) if p.name != "results.json"})
    found = {"folder": folder, "files": files, "started": None, "damage": None, "steps": []}
    try:
        if (folder / "logs.tar.gz").is_file():
            for name, text in packed_logs(folder / "logs.tar.gz").items():
                files.setdefault(name, lambda text=text: text)
    except ARCHIVE_ERRORS as e:
        found["damage"] = f"logs.tar.gz is not a whole tarball ({type(e).__name__}: {e})"
    except ValueError as e:  # packed_logs's bound
        found["damage"] = f"logs.tar.gz {e}"
    try:
        if (folder / "results.json").is_file():
            results, found["started"], found["steps"] = packed_results(folder / "results.json")
            files.update({f"{stem}.json": (lambda d=d: json.dumps(d)) for stem, d in results.items()})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        found["damage"] = f"results.json is cut or not JSON ({e})"
    except ValueError as e:  # packed_results's own reasons, NaN
        found["damage"] = f"results.json {e}"
    return found


def folder_time(found):
    """When a GPU folder was measured, as a sortable string: gpu_check.sh's started_utc, else the first
    nvidia-smi CSV row, else the folder's mtime (a git checkout gives every file the same one)."""
    if isinstance(found["started"], str):
        return found["started"].rstrip("Z")
    for name in sorted(n for n in found["files"] if n.endswith(".csv")):
        first = next((line for line in found["files"][name]().splitlines()[1:] if line[:1].isdigit()), None)
        if first:
            return first.split(",")[0].strip().replace("/", "-").replace(" ", "T").split(".")[0]
    return datetime.fromtimestamp(found["folder"].stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def newest_gpu_folder(results_dir):
    """The GPU results folder under results_dir measured last (nvidia-smi files, or gpu_check.sh's
    logs.tar.gz or results.json), read; or None."""
    folders = [read_gpu_folder(d) for d in sorted(results_dir.rglob("*")) if d.is_dir() and (
        any(d.glob("nvidia-smi*")) or any(d.glob("*smi-*.csv")) or (d / "logs.tar.gz").is_file()
        or (d / "results.json").is_file())]
    return max(folders, key=folder_time, default=None)


def gpu_inputs(args, problems):
    """--gpu, else the newest GPU results folder under --results, read once (None without one); a
    damaged folder is one problem line (it stays the folder: an older one would mix two machines)."""
    found = read_gpu_folder(args.gpu) if args.gpu and args.gpu.is_dir() else \
        newest_gpu_folder(args.results) if not args.gpu and args.results.is_dir() else None
    if found and found["damage"]:
        problems.append(f"GPU results folder {rel(found['folder'])}: {found['damage']}; its figures are left out")
    return found


def pick(files, pattern):
    """The file name matching pattern (alternatives joined by | are tried in order), the PREFERRED kind
    first, then the shortest name."""
    for alternative in pattern.split("|"):
        names = [n for n in files if re.fullmatch(alternative, n)]
        if names:
            return min(names, key=lambda n: (not any(p in n for p in PREFERRED), len(n), n))
    return None


def draw_slot(slot, files, name, out):
    """Draw one GPU slot from the file `name` of the folder."""
    if slot.startswith("gpu_utilization"):
        utilization_figure(files, name, out / slot, "LeNet-5" if "lenet" in slot else "GPT")
    elif slot.startswith("nvidia_smi_"):
        terminal_figure(files[name](), f"{name}, {gpu_name(files)}", out / slot)
    elif slot == "gpu_gpt_run.png":
        metrics = load_json(files[name]())
        gpt_curves(scalars_from_metrics(metrics), metrics, out / slot)
    else:
        ladder_figure(slot.removesuffix(".png"), load_json(files[name]()), out)


def fill_command(steps):
    return (f"`bash benchmarks/gpu_check.sh --only {steps} --out report/results/gpu-$(date +%F)` on a GPU node, "
            "then `python report/make_report.py`")


def slot_files(gpu, results_dir):
    """The files the slots are drawn from: none from a damaged folder; with a folder outside
    results_dir (gpu_check.sh's own report: logs and results apart), results_dir's JSON too."""
    if not gpu or gpu["damage"]:
        return {}
    files = dict(gpu["files"])
    if not gpu["folder"].resolve().is_relative_to(results_dir.resolve()):
        for path in sorted(results_dir.glob("*.json")):
            files.setdefault(path.name, path.read_text)
    return files


def gpu_slot_lines(gpu, results_dir, out, todo, problems, wanted=None):
    """Each GPU slot the report links (`wanted`: None for all) drawn from the folder (one line with its
    image and source), or one line saying what is missing and the command that fills it (also in
    `todo`, which main prints)."""
    folder, files = gpu and gpu["folder"], slot_files(gpu, results_dir)
    lines = [f"From `{rel(folder)}`:" if folder else f"No GPU results folder under `{rel(results_dir)}`.", ""]
    for slot, (what, pattern, steps) in GPU_SLOTS.items():
        if wanted is not None and slot not in wanted:
            continue
        name = pick(files, pattern)
        try:
            if name:
                draw_slot(slot, files, name, out)
                lines.append(f"![{what}]({slot}) from `{name}`")
                continue
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OSError) as e:
            problems.append(f"GPU slot {slot}: {name} does not fit ({type(e).__name__}: {e})")
        why = (f"{name} unusable" if name else f"the folder {rel(folder)} is damaged" if gpu and gpu["damage"]
               else f"no file like {pattern} in {rel(folder)}" if folder else "no GPU results")
        todo.append(f"`{slot}` ({what}): {why}; fill it with {fill_command(steps)}")
        lines.append(f"- {todo[-1]}")
    return lines
