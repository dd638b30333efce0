"""The inputs of a report, read without trusting them: run folders (metrics.json, args.json, event files) and the
JSON files named. What cannot be used is one line in `problems`, never an exception; a string read, text (escape)."""
import contextlib
import errno
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

from data import files

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "report" / "results"
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)  # a write failed: stop
# what a table or figure raises on a JSON field that is missing or of the wrong type: one problem line
FIELD_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError)
NUMBER = (int, float)
FIELDS = {  # run kind -> what its table and figures read from metrics.json, with the type each must have
    "lenet5": {"test_accuracy": NUMBER, "test_loss": NUMBER, "epochs": int, "train_seconds": NUMBER,
               "device": str, "act": str, "params": int},
    "gpt": {"tokens_seen": int, "steps": int, "final_train_loss": NUMBER, "final_val_loss": NUMBER,
            "val_bits_per_byte": NUMBER, "success": bool, "train_seconds": NUMBER,
            "tokens_per_second": NUMBER, "precision": str, "world_size": int, "device_name": str, "params": int,
            "vocab_size": int},
}
MARKDOWN_ACTIVE = re.compile(r"([\\`*_{}\[\]!|])")  # what Python-Markdown (with tables) reads after a backslash


class Markdown(str):
    """Text this package wrote as Markdown (a table), any string of a run's files in it already escaped."""


def escape(value, code=False):
    """A string of the inputs as literal text in Markdown, on one line, HTML escaped; outside a `code span`
    Markdown's active characters too, inside one (code) a backtick, which would end it."""
    text = html.escape(" ".join(str(value).split()), quote=False)
    return text.replace("`", "'") if code else MARKDOWN_ACTIVE.sub(r"\\\1", text)


@dataclass
class Run:
    """A run a section may show: a run folder named (`events`) or a committed JSON (its `stem`)."""
    alias: str | None
    kind: str
    metrics: dict
    source: str
    stem: str | None = None
    events: Path | None = None
    events_source: str | None = None
    gpu: object = None
    scalars: dict = field(default_factory=dict)  # tag -> [(step, value)]
    args: dict = field(default_factory=dict)  # its args.json: the model's shape (n_layer, n_embd, ...)


def rel(path):
    """Repository-relative where inside it, so results.md reads the same on any machine."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else path)


def number(text):
    """A JSON number a table can print: NaN, Infinity, 1e999 or a 400-digit integer is a ValueError."""
    if not math.isfinite(float(text)):  # (beyond a float's range, an int's `.1f` raises OverflowError)
        shown = text if len(text) < 20 else f"{text[:12]}… ({len(text)} digits)"
        raise ValueError(f"{shown} is not a number a table can print")
    return int(text) if text.lstrip("-").isdigit() else float(text)


def read_json(path):
    """A JSON file of the inputs, bounded and never waited on (a FIFO planted as metrics.json); NaN, integers beyond
    a float and nesting deeper than Python's parser goes are each a ValueError."""
    text = files.read_small(path, 64 << 20, follow=True).decode()
    try:
        return json.loads(text, parse_constant=number, parse_float=number, parse_int=number)
    except RecursionError:
        raise ValueError("nested too deep to read") from None


def run_kind(metrics):
    return "lenet5" if "act" in metrics else "gpt" if "tokens_seen" in metrics else None


def read_metrics(run_dir):
    """(metrics, None) when run_dir/metrics.json can be tabled, else (None, why not, in one line)."""
    if not Path(run_dir).is_dir():
        return None, "no such folder"
    try:
        metrics = read_json(run_dir / "metrics.json")
    except FileNotFoundError:
        return None, "no metrics.json (crashed, stopped or still running)"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"unreadable metrics.json ({e})"
    if not isinstance(metrics, dict):
        return None, f"metrics.json is a JSON {type(metrics).__name__}, not an object"
    if (kind := run_kind(metrics)) is None:
        return None, "metrics.json is neither a LeNet-5 run (no 'act') nor a GPT run (no 'tokens_seen')"
    for key, types in FIELDS[kind].items():
        if key not in metrics:
            return None, f"metrics.json has no '{key}'"
        if not isinstance(metrics[key], types):
            return None, (f"metrics.json has '{key}': {json.dumps(metrics[key])}, not "
                          f"{'a number' if types is NUMBER else types.__name__}")
    return metrics, None


def load_events(run_dir, problems):
    """{tag: [(step, value)]} of a run's scalars; a corrupt file becomes a problem line."""
    scalars = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        if not path.is_file():  # a FIFO or a device named as one would be waited on forever
            problems.append(f"left out {path}: not a regular file")
            continue
        try:  # every record read first, CRCs checked: tensorboard's loader stops silently at corruption
            reader = PyRecordReader_New(str(path))
            with contextlib.suppress(errors.OutOfRangeError):  # the end of the file
                while True:
                    reader.GetNext()
            events = EventAccumulator(str(path), size_guidance={"scalars": 0})
            events.Reload()
            for tag in events.Tags()["scalars"]:
                points = events.Scalars(tag)
                scalars.setdefault(tag, []).extend((e.step, e.value) for e in points)
                if tag == "loss/train":  # when each step ended: the loss against the job's clock
                    scalars.setdefault("time/loss/train", []).extend((e.step, e.wall_time) for e in points)
        except Exception as e:  # truncated or foreign file: say so, keep going
            problems.append(f"corrupt event file {path}: {type(e).__name__}: {e}")
    return {tag: sorted(points) for tag, points in scalars.items()}


def find_runs(runs, runs_root, problems):
    """[Run]: every run named, in order, then the newest readable one of each kind under runs_root."""
    dirs = list(runs)
    for root in [runs_root / k for k in ("lenet5", "gpt")] if runs_root else []:
        for run_dir in sorted((d for d in root.glob("*") if d.is_dir() and (d / "args.json").exists()),
                              key=lambda d: (d / "args.json").stat().st_mtime, reverse=True):
            if (problem := read_metrics(run_dir)[1]) is None:
                dirs.append(run_dir)
                break
            problems.append(f"skipped the newer run {run_dir}: {problem}")
    runs = []
    for run_dir in dirs:
        metrics, problem = read_metrics(run_dir)
        if metrics is None:
            problems.append(f"left out {run_dir}: {problem}")
        else:
            args = {}  # its model's shape; none where an older run wrote no args.json
            with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
                args = read_json(run_dir / "args.json")
            run = Run(None, run_kind(metrics), metrics, f"{rel(run_dir)}/metrics.json", events=run_dir,
                      events_source=rel(run_dir), scalars=load_events(run_dir, problems),
                      args=args if isinstance(args, dict) else {})
            runs.append(run)
    return runs


def load_results(results, problems):
    """{path: (its JSON, where from)} of each JSON file in `results` or named
    (a GPU folder's results.json: its facts, read by gpu.read_gpu_folder, not a result)."""
    out = {}
    for path in sorted(results.rglob("*.json")) if results.is_dir() else [results] if results.suffix == ".json" else []:
        key = path.relative_to(results).as_posix() if results.is_dir() else path.name
        try:
            if path.name != "results.json":
                out[key] = read_json(path), path
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"unreadable {path}: {e}")
    return out


def result_name(key):
    """A results key's file name without .json: its prefix (lenet_run, gpt_bench...) says what it is."""
    return key.rpartition("/")[2].removesuffix(".json")


def figure_name(key, results):
    """A results file's figure and placeholder source: its file name, or where two share it, its path with '_'."""
    name = result_name(key)
    return key.removesuffix(".json").replace("/", "_") if sum(result_name(k) == name for k in results) > 1 else name


def events_beside(json_path):
    """A committed run's events: the folder named as its JSON beside it, or None."""
    folder = json_path.parent / json_path.stem
    return folder if folder.is_dir() and any(folder.glob("events.out.tfevents.*")) else None
