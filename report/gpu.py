"""GPU results folders: loose files (<stem>.json, logs, nvidia-smi CSVs and snapshots).
A gpu_check.sh OUT is unpacked so by `make_report.py --gpu OUT` (unpack), its results.json's facts kept.
Each question the report asks of a GPU (ROLES, SLOTS) is answered by the first folder that can:
--gpu's, then the newest under --results. A damaged folder is named once and answers nothing;
nothing here raises on what a folder holds."""
import contextlib
import json
import re
import tarfile
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from report.figures import gpu_name, terminal_figure, utilization_figure
from report.inputs import DISK_ERRORS, FIELD_ERRORS, Markdown, escape, read_json, rel

ROLES = {"gpu_gpt": r"gpt_run_\d+[KM]-(own-vocab-)?cold_.+",  # role -> its results stem
         "gpu_lenet": r"lenet_run_torch_.+",
         "gpu_ladder": r"gpt_bench_.+",
         "gpu_gelu": r"gelu_bench_.+"}
SLOTS = {  # figure -> (what it shows, the files it is drawn from, gpu_check.sh steps that write them)
    "gpu_utilization.png": ("GPU utilisation and power during GPT and LeNet-5 training",
                            r"(nvidia-)?smi-gpt.*\.csv", "tokenizer,gpt-own-vocab,lenet-torch"),
    "nvidia_smi_gpt.png": ("nvidia-smi during GPT training", r"nvidia-smi-during-gpt.*\.txt",
                           "tokenizer,gpt-own-vocab"),
    # gpu_check.sh's snapshot, taken during training (the first folder's nvidia-smi-during-lenet.txt was before it)
    "nvidia_smi_lenet.png": ("nvidia-smi during LeNet-5 training", r"nvidia-smi-during-lenet-torch.*\.txt",
                             "lenet-torch"),
}
LENET_CSV = r"(nvidia-)?smi-lenet.*\.csv"
PREFERRED = ("own-vocab", "cold", "torch")  # of several matching files: the graded run, LeNet with --act torch
# what unpacking an OUT raises: not a tarball, cut, unreadable, no object of results
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, *FIELD_ERRORS)


@dataclass
class GpuFolder:
    folder: Path
    files: dict = field(default_factory=dict)  # name -> a function returning its text
    results: dict = field(default_factory=dict)  # results file stem -> its JSON
    facts: dict = field(default_factory=dict)  # results.json's own fields (gpu, started_utc, steps, ...)
    damage: str | None = None

    @cached_property
    def label(self):  # where a caption says a number was measured: the device and the day
        when = escape(str(self.facts.get("started_utc"))[:10])
        return Markdown(f"{gpu_name(self.files)}，{when}")  # (gpu_name: letters, digits, spaces and dashes)


def read_gpu_folder(folder):
    """The folder's nvidia-smi files (.csv/.txt), results (<stem>.json), results.json's facts."""
    found = GpuFolder(folder)
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.suffix in (".csv", ".txt"):
            found.files[p.name] = lambda p=p: p.read_text(errors="replace")  # a log cut inside a character reads
        elif p.suffix == ".json" and p.name != "results.json":
            with contextlib.suppress(OSError, ValueError):  # inputs.load_results names it
                found.results[p.stem] = read_json(p)
    try:
        if (folder / "results.json").is_file():
            facts = read_json(folder / "results.json")  # bounded, never waited on
            if not isinstance(facts, dict):
                raise TypeError(f"a JSON {type(facts).__name__}, not an object")
            found.facts = facts
    except (OSError, *FIELD_ERRORS) as e:  # cut, not JSON, or not gpu_check.sh's object
        found.damage = f"results.json is not gpu_check.sh's ({type(e).__name__}: {e})"
    return found


def unpack(folder, gpu):
    """gpu_check.sh's OUT (a copy: `folder`) as the layout the report reads:
    each results.json entry as <stem>.json, logs.tar.gz's files beside them,
    runs.tar.gz's events of <kind>_run_<name>_<gpu> in a folder named as that JSON."""
    results = read_json(folder / "results.json")["results"]
    for stem, entry in results.items():
        (folder / f"{Path(stem).name}.json").write_text(json.dumps(entry, indent=1))
    if (folder / "logs.tar.gz").is_file():
        with tarfile.open(folder / "logs.tar.gz") as tar:
            for member in filter(tarfile.TarInfo.isfile, tar):
                (folder / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    if (folder / "runs.tar.gz").is_file():
        with tarfile.open(folder / "runs.tar.gz") as tar:  # the events only: the runs' JSON are results.json's
            tar.extractall(folder, [m for m in tar if "events.out.tfevents." in m.name], filter="data")
    for run in folder.glob(f"runs/*/{gpu}-*"):  # runs/<kind>/<gpu>-<name>: beside <kind>_run_<name>_<gpu>.json
        stem = f"{run.parent.name.removesuffix('5')}_run_{run.name.removeprefix(gpu + '-')}_{gpu}"
        if stem in results:
            run.rename(folder / stem)


def gpu_folders(gpu, results_dir, problems):
    """The folders that may answer: --gpu, then those under results_dir (None: none), newest first."""
    found = [read_gpu_folder(gpu)] if gpu else []
    folders = [d for d in sorted(results_dir.rglob("*")) if d.is_dir() and (not gpu or d.resolve() != gpu.resolve())
               and (any(d.glob("nvidia-smi*")) or any(d.glob("*smi-*.csv")) or (d / "results.json").is_file())
               ] if results_dir and results_dir.is_dir() else []
    found += sorted(map(read_gpu_folder, folders), reverse=True, key=lambda f: str(f.facts.get("started_utc", "")))
    problems += [f"GPU results folder {rel(f.folder)}: {f.damage}; its figures are left out" for f in found if f.damage]
    return found


def pick(names, pattern):
    """The name matching pattern, PREFERRED first, then the shortest."""
    matching = [n for n in names if re.fullmatch(pattern, n)]
    return min(matching, key=lambda n: (-sum(p in n for p in PREFERRED), len(n), n), default=None)


def answer(folders, pattern, results=False):
    """(folder, name) of the first usable folder with a file (`results`: a results stem) matching pattern."""
    for f in folders:
        name = None if f.damage else pick(list(f.results if results else f.files), pattern)
        if name:
            return f, name
    return None, None


def draw_slot(slot, folders, name, found, out):
    """One slot from the file `name` of `found` (utilisation: beside the first LeNet-5 CSV of any folder)."""
    if slot == "gpu_utilization.png":
        lenet, csv = answer(folders, LENET_CSV)
        utilization_figure([(found.files, name, "GPT")] + ([(lenet.files, csv, "LeNet-5")] if lenet else []),
                           out / slot)
    else:
        terminal_figure(found.files[name](), f"{name}, {gpu_name(found.files)}", out / slot)


def slot_lines(folders, out, wanted, todo, problems):
    """Each slot wanted drawn from the first folder answering it, or (also in `todo`) what fills it."""
    lines = [f"GPU folders, first answering first: {', '.join(f'`{rel(f.folder)}`' for f in folders)}."
             if folders else "No GPU results folder among these inputs.", ""]
    for slot, (what, pattern, steps) in SLOTS.items():
        if slot not in wanted:
            continue
        found, name = answer(folders, pattern)
        try:
            if found:
                draw_slot(slot, folders, name, found, out)
                lines.append(f"![{what}]({slot}) from `{name}` in `{rel(found.folder)}`")
                continue
        except (*FIELD_ERRORS, OSError) as e:
            if isinstance(e, OSError) and e.errno in DISK_ERRORS:
                raise  # a full disk: make_report leaves --out as it was, not a slot that "does not fit"
            problems.append(f"GPU slot {slot}: {name} does not fit ({type(e).__name__}: {e})")
        damaged = next((f for f in folders if f.damage), None)
        why = (f"{name} unusable" if found else f"the folder {rel(damaged.folder)} is damaged" if damaged
               else f"no file like {pattern} in {', '.join(rel(f.folder) for f in folders)}" if folders
               else "no GPU results")
        todo.append(f"`{slot}` ({what}): {why}; fill it with `bash benchmarks/gpu_check.sh --only {steps} --out OUT` "
                    "on a GPU node, then `python report/make_report.py --gpu OUT --pdf`")
        lines.append(f"- {todo[-1]}")
    return lines
