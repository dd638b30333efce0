"""A GPU results folder (report/results/h200-2026-11-30's loose files, or gpu_check.sh's OUT with its
results.json, logs.tar.gz and runs.tar.gz): its files, the figures the report links from it (GPU_SLOTS)
and its committed TensorBoard events. A damaged folder is named once and its slots reported missing;
nothing here raises on what a folder holds.

    read_gpu_folder(folder)          {"folder", "files", "started", "damage"}
    gpu_inputs(args, problems)       --gpu, else the newest GPU folder under --results, read once
    gpu_slot_lines(gpu, ...)         each slot drawn, or the command that fills it
    event_runs(gpu, unpack_to, ...)  {kind: run folder} of the folder's events
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
from report.inputs import load_events, load_json, rel

GPU_SLOTS = {  # figure the report links -> (what it shows, the files it is drawn from, gpu_check.sh steps
    # that write them); the names match both the first H200 folder's files and gpu_check.sh's logs
    "gpu_utilization.png": ("GPU utilisation and power during the 12M-token GPT run",
                            r"(nvidia-)?smi-gpt.*\.csv", "tokenizer,gpt-own-vocab"),
    # the warm run's snapshot first: the first H200 folder's cold snapshot is the ramp's first second (311 W)
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


def packed_logs(path):
    """{file name: its text} of gpu_check.sh's logs.tar.gz, read whole now: a cut archive fails here."""
    files = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.isfile():
                files.setdefault(Path(member.name).name, tar.extractfile(member).read().decode(errors="replace"))
    return files


def packed_results(path):
    """(results by file stem, started_utc) of gpu_check.sh's results.json; ValueError names what is wrong."""
    data = load_json(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"is a JSON {type(data).__name__}, not an object")
    if not isinstance(data.get("results", {}), dict):
        raise ValueError(f"has 'results': {json.dumps(data['results'])[:40]}, not an object")
    return data.get("results", {}), data.get("started_utc")


def read_gpu_folder(folder):
    """The folder's files as {name: a function returning its text} (loose .csv/.txt/.json, logs.tar.gz's
    members, results.json's entries as their own files), when it was measured, and what is damaged."""
    files = {p.name: p.read_text for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix in (".csv", ".txt")}
    files.update({p.name: p.read_text for p in sorted(folder.rglob("*.json")) if p.name != "results.json"})
    found = {"folder": folder, "files": files, "started": None, "damage": None}
    try:
        if (folder / "logs.tar.gz").is_file():
            for name, text in packed_logs(folder / "logs.tar.gz").items():
                files.setdefault(name, lambda text=text: text)
    except ARCHIVE_ERRORS as e:
        found["damage"] = f"logs.tar.gz is not a whole tarball ({type(e).__name__}: {e})"
    try:
        if (folder / "results.json").is_file():
            results, found["started"] = packed_results(folder / "results.json")
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
    if slot == "gpu_utilization.png":
        utilization_figure(files, name, out / slot)
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


def unpack_runs(folder, unpack_to, problems):
    """gpu_check.sh's runs.tar.gz unpacked into unpack_to; a damaged one is a problem line."""
    if not (folder / "runs.tar.gz").is_file():
        return
    try:
        with tarfile.open(folder / "runs.tar.gz") as tar:
            tar.extractall(unpack_to, filter="data")
    except (*ARCHIVE_ERRORS, tarfile.FilterError) as e:
        problems.append(f"GPU results folder {rel(folder)}: runs.tar.gz is not a whole tarball "
                        f"({type(e).__name__}: {e}); its TensorBoard events are left out")


def event_runs(gpu, unpack_to, problems):
    """{kind: {"dir", "kind", "source"}}: the TensorBoard event folders of a GPU results folder (tb-lenet
    and tb-gpt-12M-cold as in h200-2026-11-30, or gpu_check.sh's runs.tar.gz unpacked into unpack_to),
    the cold-cache GPT run and LeNet with --act torch first: committed events, unlike runs/."""
    if not gpu or gpu["damage"]:
        return {}
    folder = gpu["folder"]
    unpack_runs(folder, unpack_to, problems)
    dirs = {p.parent.relative_to(root).as_posix(): p.parent  # named inside their folder: its own path may say "gpt"
            for root in (folder, unpack_to) for p in root.rglob("events.out.tfevents.*")}
    found = {}
    for kind, word in (("lenet5", "lenet"), ("gpt", "gpt")):
        named = {name: d for name, d in dirs.items() if word in name}
        best = pick(named, ".*")
        if best:
            packed = not named[best].is_relative_to(folder)
            found[kind] = {"dir": named[best], "kind": kind,
                           "source": f"{rel(folder)}/runs.tar.gz: {best}" if packed else rel(named[best])}
    return found


def committed_run(kind, gpu, unpack_to, problems):
    """{"dir", "kind", "images", "scalars", "source"} of the GPU results folder's events of this kind, or None."""
    run = event_runs(gpu, unpack_to, problems).get(kind)
    if run:
        run["scalars"], run["images"] = load_events(run["dir"], problems)
    return run
