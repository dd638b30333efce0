"""Regenerate the report's figures and results tables from run directories and benchmark JSON.

    python report/make_report.py --pdf                    # everything, then report/report.pdf
    python report/make_report.py runs/lenet5/A runs/gpt/B --out /tmp/report
    python report/make_report.py --gpu OUT                # GPU figures from gpu_check.sh's OUT folder

Reads TensorBoard event files (tensorboard's EventAccumulator), the metrics.json every run writes and
every JSON under report/results (subfolders too); writes PNG figures and results.md into --out
(default report/generated/). The GPU figures the report links (GPU_SLOTS) come from the newest GPU
results folder under report/results (report/results/h200-2026-11-30's layout, or gpu_check.sh's OUT
copied there), and so do the TensorBoard screenshots and layer images unless runs are named. Whatever
is missing is named in results.md ("no GPT run found under runs/gpt", a GPU figure's filling
command), never filled in.
"""
import argparse
import json
import struct
import sys
import tempfile
import urllib.parse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # noqa: E402

import browser  # noqa: E402  report/browser.py: TensorBoard server, Chromium screenshots, the PDF

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's packages, when run as python report/make_report.py
from training.metrics import SUCCESS_LOSS  # noqa: E402

NUMBER = (int, float)
FIELDS = {  # run kind -> what its table and figures read from metrics.json, with the type each must have
    "lenet5": {"test_accuracy": NUMBER, "test_loss": NUMBER, "epochs": int, "train_seconds": NUMBER,
               "device": str, "act": str, "params": int},
    "gpt": {"tokens_seen": int, "steps": int, "final_train_loss": NUMBER, "final_val_loss": NUMBER,
            "val_bits_per_byte": NUMBER, "success": bool, "train_seconds": NUMBER, "total_seconds": NUMBER,
            "tokens_per_second": NUMBER, "precision": str, "world_size": int, "device_name": str, "params": int,
            "vocab_size": int},
}


# ----------------------------------------------------------------------------- inputs

def run_kind(metrics):
    if "act" in metrics:
        return "lenet5"
    if "tokens_seen" in metrics:
        return "gpt"
    return None


def metrics_problem(metrics):
    """Why a run's metrics cannot be tabled (None when they can): `[1,2]`, `{}` or a string where a
    number belongs is named in one line and the run passed over, never a traceback."""
    if not isinstance(metrics, dict):
        return f"is a JSON {type(metrics).__name__}, not an object"
    kind = run_kind(metrics)
    if kind is None:
        return "is neither a LeNet-5 run (no 'act') nor a GPT run (no 'tokens_seen')"
    for key, types in FIELDS[kind].items():
        if key not in metrics:
            return f"has no '{key}'"
        if not isinstance(metrics[key], types):
            return f"has '{key}': {json.dumps(metrics[key])}, not {'a number' if types is NUMBER else types.__name__}"
    return None


def read_metrics(run_dir):
    """(metrics, None) when run_dir/metrics.json can be tabled, else (None, why not)."""
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
    except FileNotFoundError:
        return None, "no metrics.json (crashed, stopped or still running)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"unreadable metrics.json ({e})"
    problem = metrics_problem(metrics)
    return (None, f"metrics.json {problem}") if problem else (metrics, None)


def newest_run(root, problems):
    """The most recent run under root whose metrics.json can be tabled; each newer run that was passed
    over (crashed, still running, metrics broken) is named in `problems`, never skipped silently."""
    runs = sorted((d for d in root.glob("*") if d.is_dir() and (d / "args.json").exists()),
                  key=lambda d: (d / "args.json").stat().st_mtime, reverse=True)
    for run_dir in runs:
        metrics, problem = read_metrics(run_dir)
        if metrics is not None:
            return run_dir
        problems.append(f"skipped the newer run {run_dir}: {problem}")
    return None


def check_event_file(path):
    """Walk the TFRecord framing (length, CRC, payload, CRC): tensorboard's reader stops silently at
    corruption, which would make a broken file look like a short run."""
    data, pos = path.read_bytes(), 0
    while pos < len(data):
        header, crc = data[pos:pos + 8], data[pos + 8:pos + 12]
        if len(crc) < 4 or struct.pack("<I", masked_crc32c(header)) != crc:
            raise ValueError(f"bad record header at byte {pos}")
        end = pos + 12 + struct.unpack("<Q", header)[0]
        payload, crc = data[pos + 12:end], data[end:end + 4]
        if len(crc) < 4 or struct.pack("<I", masked_crc32c(payload)) != crc:
            raise ValueError(f"bad or truncated record at byte {pos}")
        pos = end + 4


def load_events(run_dir, problems):
    """{tag: [(step, value)]} and {image tag: last PNG bytes}; a corrupt file becomes a problem line."""
    scalars, images = {}, {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        try:
            check_event_file(path)
            acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 0})
            acc.Reload()
            tags = acc.Tags()
            for tag in tags["scalars"]:
                scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
            for tag in tags["images"]:
                images[tag] = acc.Images(tag)[-1].encoded_image_string
        except Exception as e:  # truncated or foreign file: say so, keep going
            problems.append(f"corrupt event file {path}: {type(e).__name__}: {e}")
    return {tag: sorted(points) for tag, points in scalars.items()}, images


def load_run(run_dir, problems):
    metrics, problem = read_metrics(run_dir)
    if metrics is None:
        problems.append(f"left out {run_dir}: {problem}")
        return None
    scalars, images = load_events(run_dir, problems)
    return {"dir": run_dir, "metrics": metrics, "scalars": scalars, "images": images, "kind": run_kind(metrics)}


def load_results(results_dir, problems):
    """{path relative to results_dir: (its JSON, its path)} for every JSON under report/results that
    parses (subfolders too: a GPU machine's results arrive as a folder of their own, where a file may
    have the same name as one outside it). gpu_check.sh's results.json holds its results by file stem:
    each becomes an entry of its own, as if the file lay beside it."""
    out = {}
    for path in sorted(results_dir.rglob("*.json")) if results_dir.is_dir() else []:
        key = path.relative_to(results_dir).as_posix()
        try:
            data = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"unreadable {path}: {e}")
            continue
        if path.name == "results.json" and isinstance(data, dict) and isinstance(data.get("results"), dict):
            out.update(embedded_results(path, key, data["results"], problems))
        else:
            out[key] = data, path
    return out


def embedded_results(path, key, results, problems):
    """The results gpu_check.sh packed into one results.json, keyed as the files they were."""
    folder = key.rpartition("/")[0]
    out = {}
    for stem, data in results.items():
        if isinstance(data, dict) and "unreadable" in data:
            problems.append(f"unreadable {stem}.json in {path}: {data['unreadable']}")
            continue
        out[f"{folder}/{stem}.json".lstrip("/")] = data, f"{path}: results.{stem}"
    return out


def result_name(key):
    """The file name of a results key without .json: what its prefix (lenet_run, gpt_bench...) is read from."""
    return key.rpartition("/")[2].removesuffix(".json")


def figure_name(key, results):
    """A results file's figure: its file name, or, where two files share the name, its relative path
    with '/' as '_' (report/results/x.json and report/results/h200/x.json draw two figures)."""
    name = result_name(key)
    if sum(result_name(k) == name for k in results) > 1:
        return key.removesuffix(".json").replace("/", "_")
    return name


# ----------------------------------------------------------------------------- figures

def plot_lines(path, panels, title, hline=None, ymin0=None):
    """panels: [(ylabel, {label: [(x, y)]}, xlabel)] side by side; hline = (panel, y, label) draws a
    dashed reference line; ymin0 = a panel whose y axis starts at zero."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for i, (ax, (ylabel, series, xlabel)) in enumerate(zip(axes[0], panels)):
        if hline and hline[0] == i:
            ax.axhline(hline[1], color="gray", linestyle="--", linewidth=1, label=hline[2])
        if ymin0 == i:
            ax.set_ylim(bottom=0, top=max((y for pts in series.values() for _, y in pts), default=1) * 1.1)
        for label, points in series.items():
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(points) < 20 else None, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scalars_from_metrics(m):
    """The curves a metrics JSON keeps, in the {tag: [(step, value)]} form of the event files: so a
    figure can be redrawn from committed data alone."""
    if "tokens_seen" in m:  # GPT
        return {"train/loss": m.get("loss_curve", []), "val/loss": m.get("val_curve", []),
                "perf/tokens_per_second": m.get("throughput_curve", [])}
    per_epoch = m.get("steps", 0) / m["epochs"]
    return {"train/loss": m.get("train_loss_curve", []),
            "test/loss": [(h["epoch"] * per_epoch, h["test_loss"]) for h in m["history"]],
            "test/accuracy": [(h["epoch"] * per_epoch, h["test_accuracy"]) for h in m["history"]]}


def lenet_curves(s, m, path):
    name = (f"LeNet-5 ({m.get('device_name', m['device'])}, act={m['act']}, engine={m.get('engine', 'plain')}, "
            f"final test accuracy {m['test_accuracy']:.2%})")
    plot_lines(path, [("loss", {"train": s.get("train/loss", []), "test": s.get("test/loss", [])}, "step"),
                      ("test accuracy", {"test": s.get("test/accuracy", [])}, "step")], name)
    return [f"![LeNet-5 curves]({path.name})"]


def lenet_images(run, out):
    """The intermediate-layer images of one LeNet-5 run, enlarged and titled; the lines that show them."""
    lines = []
    for tag, file, title in (
            ("layers/conv1_filters", "lenet_conv1_filters.png", "conv1: the 6 learned 5x5 filters"),
            ("layers/conv1_feature_maps", "lenet_conv1_feature_maps.png",
             "conv1 feature maps: one row per test digit, one column per channel (6, 24x24)"),
            ("layers/conv2_feature_maps", "lenet_conv2_feature_maps.png",
             "conv2 feature maps: one row per test digit, one column per channel (16, 8x8)")):
        if tag in run["images"]:
            labelled_image(run["images"][tag], f"{title}, after the last epoch", out / file)
            lines.append(f"![{tag}]({file})")
        else:
            lines.append(f"- no `{tag}` image in {run['dir']}")
    return lines


def labelled_image(png, title, path):
    """A TensorBoard image (PNG bytes) enlarged without smoothing, with a title saying what it shows."""
    from io import BytesIO
    from PIL import Image
    image = Image.open(BytesIO(png))
    scale = max(1.0, 900 / image.width)
    fig = plt.figure(figsize=(image.width * scale / 100, image.height * scale / 100 + 0.5), dpi=100)
    ax = fig.add_axes([0, 0, 1, image.height * scale / (image.height * scale + 50)])
    ax.imshow(image, interpolation="nearest", cmap="gray")
    ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path)
    plt.close(fig)


def gpt_curves(s, m, path):
    """Loss (train, validation, the lab's goal) and throughput against tokens, for one GPT run."""
    per_step = m["tokens_seen"] / max(1, m["steps"])
    tokens = {tag: [(step * per_step, value) for step, value in s.get(tag, [])]
              for tag in ("train/loss", "val/loss", "perf/tokens_per_second")}
    size = f"{m['params'] / 1e6:.2f}M parameters" + (", tiny preset" if m.get("preset") == "tiny" else "")
    corpus = {"stand-in": "stand-in corpus, not WOS", "WOS46985": "WOS"}.get(corpus_name(m), "other corpus, not WOS")
    title = (f"GPT-2 structure, {size}, {corpus} ({m['device_name']} x {m['world_size']}, {m['precision']}, "
             f"{m['tokens_seen']:,} tokens)")
    plot_lines(path, [("loss (nats/token)", {"train": tokens["train/loss"], "validation": tokens["val/loss"]}, "tokens"),
                      ("tokens / s", {"throughput": tokens["perf/tokens_per_second"]}, "tokens")], title,
               hline=(0, SUCCESS_LOSS, f"goal: loss < {SUCCESS_LOSS:g}"), ymin0=1)
    return [f"![GPT-2 loss and throughput]({path.name})"]


# ----------------------------------------------------------------------------- GPU slots

GPU_SLOTS = {  # figure the report links -> (what it shows, the files it is drawn from, gpu_check.sh steps
    # that write them); the names match both the first H200 folder's files and gpu_check.sh's logs
    "gpu_utilization.png": ("GPU utilisation and power during the 12M-token GPT run",
                            r"(nvidia-)?smi-gpt.*\.csv", "tokenizer,gpt-cold"),
    # the warm run's snapshot first: the first H200 folder's cold snapshot is the ramp's first second (311 W)
    "nvidia_smi_gpt.png": ("nvidia-smi during GPT training", r"nvidia-smi-during-gpt.*warm.*\.txt|"
                           r"nvidia-smi-during-gpt.*\.txt", "tokenizer,gpt-cold"),
    "nvidia_smi_lenet.png": ("nvidia-smi during LeNet-5 training", r"nvidia-smi-during-lenet.*\.txt",
                             "lenet-torch"),
    "gpu_gpt_run.png": ("the 12M-token GPT run's curves", r"gpt_run_12M-cold.*\.json", "tokenizer,gpt-cold"),
    "gpu_ladder.png": ("the acceleration ladder on the GPU", r"gpt_bench.*\.json", "ladder"),
}
PREFERRED = ("cold", "torch")  # of several matching files: the cold-cache GPT run, LeNet with --act torch


def gpu_folder_files(folder):
    """{file name: a function returning its text} for the files of a GPU results folder: those lying in
    it (the layout of report/results/h200-2026-11-30, or gpu_check.sh's logs/) and those packed in
    gpu_check.sh's logs.tar.gz; results.json's entries as their own files."""
    import tarfile
    files = {p.name: p.read_text for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix in (".csv", ".txt")}
    files.update({p.name: p.read_text for p in sorted(folder.rglob("*.json")) if p.name != "results.json"})
    packed = folder / "logs.tar.gz"
    if packed.is_file():
        with tarfile.open(packed) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    text = tar.extractfile(member).read().decode(errors="replace")
                    files.setdefault(Path(member.name).name, lambda text=text: text)
    if (folder / "results.json").is_file():
        packed = json.loads((folder / "results.json").read_text()).get("results", {})
        files.update({f"{stem}.json": (lambda d=d: json.dumps(d)) for stem, d in packed.items()})
    return files


def pick(files, pattern):
    """The file name matching pattern (alternatives joined by | are tried in order), the PREFERRED kind
    first, then the shortest name."""
    import re
    for alternative in pattern.split("|"):
        names = [n for n in files if re.fullmatch(alternative, n)]
        if names:
            return min(names, key=lambda n: (not any(p in n for p in PREFERRED), len(n), n))
    return None


def smi_series(text):
    """nvidia-smi --query-gpu CSV -> {column: [(seconds since the first row, value)]}; N/A cells skipped."""
    from datetime import datetime
    lines = [line.split(",") for line in text.splitlines() if line.strip()]
    header = [h.strip().split(" [")[0] for h in lines[0]]
    series, start = {h: [] for h in header[1:]}, None
    for row in lines[1:]:
        try:
            when = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            continue  # a warning line nvidia-smi wrote into the log
        start = start or when
        for name, cell in zip(header[1:], row[1:]):
            value = cell.strip().split(" ")[0]
            if value.replace(".", "", 1).isdigit():
                series[name].append(((when - start).total_seconds(), float(value)))
    return series


def gpu_name(files):
    """The GPU's name, from any nvidia-smi snapshot in the folder ('the GPU' when there is none)."""
    import re
    for name in sorted(n for n in files if n.startswith("nvidia-smi") and n.endswith(".txt")):
        found = re.search(r"\|\s+\d+\s+(NVIDIA [A-Za-z0-9 -]+?)\s{2,}", files[name]())
        if found:
            return found.group(1)
    return "the GPU"


def utilization_figure(files, csv_name, path):
    series = smi_series(files[csv_name]())
    steps = [b[0] - a[0] for a, b in zip(series["utilization.gpu"], series["utilization.gpu"][1:])]
    every = f"every {sorted(steps)[len(steps) // 2] * 1000:.0f} ms, " if steps else ""
    plot_lines(path, [("GPU utilisation (%)", {"utilization.gpu": series["utilization.gpu"]}, "seconds"),
                      ("power (W)", {"power.draw": series.get("power.draw", [])}, "seconds")],
               f"nvidia-smi on {gpu_name(files)}, {every}during the GPT run ({csv_name})", ymin0=0)


def terminal_figure(text, title, path):
    """An nvidia-smi snapshot as the terminal showed it: its text, monospaced, light on dark."""
    lines = text.rstrip("\n").splitlines()
    width = max(len(line) for line in lines)
    fig = plt.figure(figsize=(0.085 * width + 0.3, 0.17 * len(lines) + 0.6), facecolor="#1e1e1e")
    fig.text(0.5, 0.995, title, color="#dddddd", fontsize=8, ha="center", va="top")
    fig.text(0.01, 1 - 0.35 / (0.17 * len(lines) + 0.6), "\n".join(lines), family="DejaVu Sans Mono",
             fontsize=8.5, color="#e8e8e8", va="top", linespacing=1.2)
    fig.savefig(path, dpi=150, facecolor=fig.get_facecolor(), bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)


def draw_slot(slot, files, name, out):
    """Draw one GPU slot from the file `name` of the folder."""
    if slot == "gpu_utilization.png":
        utilization_figure(files, name, out / slot)
    elif slot.startswith("nvidia_smi_"):
        terminal_figure(files[name](), f"{name}, {gpu_name(files)}", out / slot)
    elif slot == "gpu_gpt_run.png":
        gpt_curves(scalars_from_metrics(json.loads(files[name]())), json.loads(files[name]()), out / slot)
    else:
        ladder_figure(slot.removesuffix(".png"), json.loads(files[name]()), out)


def folder_time(folder, files):
    """When a GPU folder was measured, as a sortable string: gpu_check.sh's started_utc, else the first
    nvidia-smi CSV row, else the folder's mtime (a git checkout gives every file the same one)."""
    from datetime import datetime, timezone
    if (folder / "results.json").is_file():
        started = json.loads((folder / "results.json").read_text()).get("started_utc")
        if started:
            return started.rstrip("Z")
    for name in sorted(n for n in files if n.endswith(".csv")):
        first = next((line for line in files[name]().splitlines()[1:] if line[:1].isdigit()), None)
        if first:
            return first.split(",")[0].strip().replace("/", "-").replace(" ", "T").split(".")[0]
    return datetime.fromtimestamp(folder.stat().st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def newest_gpu_folder(results_dir):
    """The GPU results folder under results_dir measured last (nvidia-smi files, or gpu_check.sh's
    logs.tar.gz), or None."""
    folders = [d for d in sorted(results_dir.rglob("*")) if d.is_dir() and (
        any(d.glob("nvidia-smi*")) or any(d.glob("*smi-*.csv")) or (d / "logs.tar.gz").is_file())]
    return max(folders, key=lambda d: folder_time(d, gpu_folder_files(d)), default=None)


def gpu_results_folder(args):
    """--gpu, else the newest GPU results folder under --results, else None."""
    return args.gpu or (newest_gpu_folder(args.results) if args.results.is_dir() else None)


def fill_command(steps):
    return (f"`bash benchmarks/gpu_check.sh --only {steps} --out report/results/gpu-$(date +%F)` on a GPU node, "
            "then `python report/make_report.py`")


def gpu_slot_lines(folder, results_dir, out, todo, problems):
    """Each GPU slot drawn from folder (one line with its image and source), or one line saying what
    is missing and the command that fills it (also in `todo`, which main prints)."""
    files = gpu_folder_files(folder) if folder else {}
    for path in sorted(results_dir.glob("*.json")) if folder and not folder.is_relative_to(results_dir) else []:
        files.setdefault(path.name, path.read_text)  # gpu_check.sh's own report: logs and results apart
    lines = [f"From `{rel(folder)}`:" if folder else f"No GPU results folder under `{rel(results_dir)}`.", ""]
    for slot, (what, pattern, steps) in GPU_SLOTS.items():
        name = pick(files, pattern)
        try:
            if name:
                draw_slot(slot, files, name, out)
                lines.append(f"![{what}]({slot}) from `{name}`")
                continue
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            problems.append(f"GPU slot {slot}: {name} does not fit ({type(e).__name__}: {e})")
        why = (f"{name} unusable" if name else f"no file like {pattern} in {rel(folder)}" if folder
               else "no GPU results")
        todo.append(f"`{slot}` ({what}): {why}; fill it with {fill_command(steps)}")
        lines.append(f"- {todo[-1]}")
    return lines


def gpu_figure(runs, out):
    series = {}
    for run in runs:
        for tag in ("gpu/utilization_percent", "gpu/memory_used_GiB"):
            if run["scalars"].get(tag):
                series.setdefault(tag, {})[f"{run['kind']} ({run['dir'].name})"] = run["scalars"][tag]
    if not series:
        return ["- no GPU utilisation recorded: the runs above ran on the CPU (NVML curves appear only for GPU runs)"]
    plot_lines(out / "gpu_nvml.png", [(tag, pts, "step") for tag, pts in series.items()],
               "GPU utilisation and memory (NVML)")
    return ["![GPU utilisation (NVML)](gpu_nvml.png)"]


def ladder_figure(name, bench, out):
    """Bars with each row's range over its repeats (the ladder's argument rests on them); the rungs in
    blue, the alternatives (leave-one-out, candidates) in grey below a line; a failed row is left out."""
    rungs = [r for r in bench["rungs"] if r.get("tokens_per_second")]
    speeds = [r["tokens_per_second"] for r in rungs]
    spans = [r.get("tokens_per_second_range") or [v, v] for r, v in zip(rungs, speeds)]
    errors = [[v - lo for v, (lo, _) in zip(speeds, spans)], [hi - v for v, (_, hi) in zip(speeds, spans)]]
    alternative = [r["name"].startswith(" ") for r in rungs]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rungs) + 1.2))
    ax.barh(range(len(rungs)), speeds, xerr=errors, capsize=2, error_kw={"elinewidth": 0.8},
            color=["tab:gray" if a else "tab:blue" for a in alternative])
    ax.set_yticks(range(len(rungs)), [r["name"].split(" (")[0].split(":")[0].strip() for r in rungs], fontsize=8)
    ax.invert_yaxis()
    if any(alternative):
        ax.axhline(alternative.index(True) - 0.5, color="black", linewidth=0.6, linestyle="--")
    for i, (r, (_, hi)) in enumerate(zip(rungs, spans)):
        ax.text(hi, i, f" x{r['speedup']:.2f}" if r.get("speedup") else "", va="center", fontsize=7)
    ax.set_xlabel("tokens / s (bar: median; whisker: range over the repeats)")
    ax.set_title(f"Acceleration ladder, {bench['device_name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return [f"![{name}]({name}.png)"]


# ----------------------------------------------------------------------------- TensorBoard in a real browser

SHOTS = {  # run kind -> [(file, TensorBoard page: dashboard & its tag filter, window height in CSS px)]: the
    # cards that matter, two a row in a 1,400 px window; the crop keeps the first section's cards only
    "lenet5": [("lenet_tensorboard_scalars.png", "scalars&tagFilter=loss%7Caccuracy&_smoothingWeight=0", 900),
               ("lenet_tensorboard_layers.png", "images&tagFilter=layers", 1100)],
    "gpt": [("gpt_tensorboard_scalars.png", "scalars&tagFilter=train%2Floss%7Cval%2Floss%7Ctokens_per_second"
                                            "&_smoothingWeight=0", 900)],
}
SHOT_WIDTH, SHOT_SCALE = 1400, 2  # CSS px, device pixels per CSS px: tick labels legible at print size
TENSORBOARD_SETTINGS = {"_ignoreYOutliers": "false"}  # localStorage: every point inside the y range


def card_box(pixels):
    """(left, top, right, bottom) of the cards in the first section of a TensorBoard page: the white
    box right of the grey sidebar, below the "Tags matching" header's divider, down to the box's end."""
    import numpy as np
    white = (pixels == 255).all(axis=2)
    row = int(pixels.shape[0] * 0.6)
    xs = np.flatnonzero(white[row])
    if len(xs) == 0 or white[row, :xs[0]].any():
        raise ValueError("no white card box right of the sidebar")
    left, right = xs[0] + 1, xs[-1]
    across = white[:, left:right].mean(axis=1)  # rows of the box: white; its borders and divider: not
    top = np.argmax(across > 0.9)
    divider = top + np.argmax(across[top:] < 0.5)
    cards = divider + np.argmax(across[divider:] > 0.9)
    margin = white[cards:, left + 4]  # the box's left margin, white down to its bottom border
    bottom = cards + (np.argmax(~margin) if not margin.all() else len(margin))
    return left, cards, right, bottom


def crop_to_cards(path):
    """Crop a TensorBoard screenshot to its cards (no toolbar, sidebar, header or repeated sections),
    white margins trimmed to 12 px; None, or why the page did not look like TensorBoard's."""
    import numpy as np
    from PIL import Image
    image = Image.open(path).convert("RGB")
    try:
        left, top, right, bottom = card_box(np.asarray(image))
    except ValueError as e:
        return f"{path.name} left uncropped: {e}"
    cards = image.crop((left, top, right, bottom))
    dark = (np.asarray(cards) < 235).any(axis=2)  # text, lines, images: not the page's grey (245)
    ink, rows = np.flatnonzero(dark.any(axis=0)), np.flatnonzero(dark.any(axis=1))
    if len(ink) == 0:
        return f"{path.name} left uncropped: its card box is empty"
    pad = 12
    cards.crop((max(0, ink[0] - pad), max(0, rows[0] - pad), min(cards.width, ink[-1] + pad),
                min(cards.height, rows[-1] + pad))).save(path)
    return None


def tensorboard_screenshots(runs, out, problems):
    """Start a real TensorBoard server on each run and let Chromium photograph its pages, as a student
    sees them; the lines that show them. Only files Chromium really wrote are linked; after its first
    failure (an error exit, or a hang cut off at browser.BROWSER_TIMEOUT) no more are tried."""
    if not browser.find_browser():
        return ["- no TensorBoard screenshots: Chromium not found (`apt-get install chromium`)"]
    lines = []
    for run in runs:
        with browser.serve_tensorboard(run["dir"]) as base:
            if base is None:
                problems.append(f"TensorBoard on {run['dir']} did not answer; no screenshots of it")
                continue
            if not run_screenshots(run, base, out, lines, problems):
                return lines
    return lines


def event_runs(folder, unpack_to):
    """{kind: {"dir", "kind"}}: the TensorBoard event folders of a GPU results folder (tb-lenet and
    tb-gpt-12M-cold as in h200-2026-11-30, or gpu_check.sh's runs.tar.gz unpacked into unpack_to),
    the cold-cache GPT run and LeNet with --act torch first: committed events, unlike runs/."""
    import tarfile
    if (folder / "runs.tar.gz").is_file():
        with tarfile.open(folder / "runs.tar.gz") as tar:
            tar.extractall(unpack_to, filter="data")
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


def committed_run(kind, args, problems):
    """{"dir", "kind", "images", "scalars"} of the GPU results folder's events of this kind, or None."""
    folder = gpu_results_folder(args)
    with tempfile.TemporaryDirectory() as unpacked:
        run = event_runs(folder, Path(unpacked)).get(kind) if folder else None
        if run:
            run["scalars"], run["images"] = load_events(run["dir"], problems)
    return run


def screenshot_sources(by_kind, args, unpack_to):
    """The runs whose TensorBoard is photographed: the runs given on the command line; else the GPU
    results folder's events where it has them; else the newest runs under --runs-root."""
    if args.runs:
        return [by_kind[k] for k in ("lenet5", "gpt") if k in by_kind]
    folder = gpu_results_folder(args)
    committed = event_runs(folder, unpack_to) if folder else {}
    return [committed.get(k) or by_kind[k] for k in ("lenet5", "gpt") if k in committed or k in by_kind]


def run_screenshots(run, base, out, lines, problems):
    """The SHOTS of one run, through a front that turns outlier-ignoring off (the full range of every
    curve is shown); False after Chromium failed."""
    with browser.storage_front(base, TENSORBOARD_SETTINGS) as front:
        for file, page, height in SHOTS.get(run["kind"], []):
            target = urllib.parse.quote(f"/?darkMode=false#{page}", safe="")
            failure = browser.screenshot(f"{front}/lab5-storage?next={target}", out / file, SHOT_WIDTH, height,
                                         scale=SHOT_SCALE)
            if failure:
                problems.append(f"{failure}; no further screenshots tried")
                return False
            problems.extend(filter(None, [crop_to_cards(out / file)]))
            lines.append(f"![TensorBoard: {page.split('&')[0]} of {run['dir'].name}]({file})")
    return True


# ----------------------------------------------------------------------------- tables

def rel(path):
    """Paths inside the repository as repository-relative, so results.md reads the same on any machine."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def corpus_name(m):
    """What corpus a run or tokenizer read: the `corpus.name` its JSON records from the text's content
    ("stand-in", "WOS46985" or "other"); JSON older than that field is judged by the old rule, the
    stand-in's folder name in its `text` path."""
    corpus = m.get("corpus")
    if isinstance(corpus, dict) and corpus.get("name"):
        return corpus["name"]
    return "stand-in" if "standin" in str(m.get("text") or "") else "WOS46985"


def corpus_label(m):
    """The warning a table carries when its numbers are not WOS's."""
    name = corpus_name(m)
    if name == "WOS46985":
        return ""
    return " — **stand-in corpus, not WOS**" if name == "stand-in" else f" — **corpus '{name}', not WOS**"


def fmt(value, spec=".4g"):
    """A number as `spec`, a missing one as a dash, anything else as it is."""
    if value is None:
        return "—"
    if isinstance(value, NUMBER):
        return format(value, spec)
    return str(value)


def lenet_table(m):
    return ["| test accuracy | test loss | epochs | training s | device | act | parameters |",
            "|---|---|---|---|---|---|---|",
            f"| {m['test_accuracy']:.2%} | {m['test_loss']:.4f} | {m['epochs']} | {m['train_seconds']:.1f} | "
            f"{m.get('device_name', m['device'])} | {m['act']} | {m['params']:,} |"]


def gpt_table(m):
    return ["| tokens | steps | final train loss | val loss | val bits/byte | < 7 | training s | total s | "
            "tokens/s | MFU | precision | processes | device |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {m['tokens_seen']:,} | {m['steps']} | {m['final_train_loss']:.3f} | {m['final_val_loss']:.3f} | "
            f"{m['val_bits_per_byte']:.3f} | {'yes' if m['success'] else 'no'} | {m['train_seconds']:.1f} | "
            f"{m['total_seconds']:.1f} | {m['tokens_per_second']:,.0f} | {fmt(m['mfu'], '.1%')} | {m['precision']} | "
            f"{m['world_size']} | {m['device_name']} |",
            "", f"Text: `{rel(m.get('text'))}`{corpus_label(m)}; tokenizer: `{rel(m.get('tokenizer'))}`, "
                f"vocabulary {m['vocab_size']:,}, {m['params']:,} parameters, preset `{m.get('preset')}`."]


def ladder_table(bench):
    repeats = bench.get("repeats", 1)
    rows = [f"{bench['device_name']}, batch {bench['micro_batch']} x {bench['seq_len']}, vocabulary "
            f"{bench['vocab_size']:,}, " + (f"median of {repeats} interleaved repeats (range in brackets):"
                                             if repeats > 1 else "one measurement per rung:"), "",
            "| # | rung | tokens/s | ms/step | MFU | speed-up |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(bench["rungs"], 1):
        spread = " [{:,.0f}–{:,.0f}]".format(*r["tokens_per_second_range"]) if "tokens_per_second_range" in r else ""
        noise = " (within noise of the rung above)" if r.get("within_noise_of_previous") else ""
        rows.append(f"| {i} | {r['name'].strip()} | {r['tokens_per_second']:,.0f}{spread} | {r['ms_per_step']:,.1f} | "
                    f"{fmt(r['mfu'], '.1%')} | {r['speedup']:.2f}×{noise} |")
    return rows


def gelu_table(bench):
    """gelu_bench.py's rows; a build without the op's kernels for the device (`ext_measured` false)
    has no ext times: its columns say "not measured" and the JSON's reason follows the table."""
    measured = bench.get("ext_measured", True)
    rows = [f"{bench['device_name']}, {bench['dtype']}, forward + backward (ms, median):", "",
            "| n | ATen | lab's composite | Python Function | ext | ext vs ATen |", "|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        ext = f"{r['ext_ms']:.3f} | {r['ext_vs_aten']:.2f}×" if measured else "not measured | not measured"
        rows.append(f"| 2^{r['n'].bit_length() - 1} | {r['aten_ms']:.3f} | {fmt(r.get('seed_ms'), '.3f')} | "
                    f"{fmt(r.get('python_ms'), '.3f')} | {ext} |")
    if not measured:
        rows += ["", f"ext not measured: {bench.get('ext_missing_reason') or 'no reason recorded'}."]
    return rows


def lenet_bench_table(b):
    """benchmarks/lenet_bench.py's JSON: the recipes side by side (one row per seed where it has them),
    or, with mode act_pair, --act torch against --act cpp."""
    if b.get("mode") == "act_pair":
        return lenet_act_table(b)
    rows = [f"{b['device_name']}:", "", "| run | training s | test accuracy |", "|---|---|---|"]
    for i, (s, a) in enumerate(zip(b["baseline_epoch_seconds"], b["baseline_accuracy"]), 1):
        rows.append(f"| original recipe (batch 64, Adam 1e-3, ToTensor), epoch {i} | {s:.2f} | {a:.2%} |")
    for r in b.get("per_seed", []):
        rows.append(f"| default `lenet5.py`, {b['default_epochs']} epochs, seed {r['seed']} | "
                    f"{r['default_train_seconds']:.2f} | {r['default_accuracy']:.2%} |")
    if "per_seed" not in b:
        rows.append(f"| default `lenet5.py`, {b['default_epochs']} epochs | {b['default_train_seconds']:.2f} | "
                    f"{b['default_accuracy']:.2%} |")
    if "lightning_train_seconds" in b:
        rows.append(f"| `lenet5.py --engine lightning`, {b['default_epochs']} epochs | {b['lightning_train_seconds']:.2f} | "
                    f"{b['lightning_accuracy']:.2%} |")
    rows += ["", f"Default training time = **{b['ratio_to_one_baseline_epoch']:.2f}×** one original epoch"
                 + (" (medians of {} interleaved repeats; paired ratios {:.2f}–{:.2f}).".format(
                     b["repeats"], *b["paired_ratios"]["range"]) if "paired_ratios" in b else ".")]
    if "lightning_to_plain" in b:
        rows.append(f"Lightning / plain loop = **{b['lightning_to_plain']:.2f}×** (per repeat: "
                    + ", ".join(f"{r:.2f}" for r in b["all_lightning_to_plain"]) + ").")
    return rows


def lenet_act_table(b):
    recipe = b["recipe"]
    rows = [f"{b['device_name']}, {recipe['epochs']} epochs of batch {recipe['batch_size']}, one interleaved pair "
            "per seed:", "", "| seed | `--act torch` s | `--act cpp` s | cpp / torch | accuracy torch / cpp |",
            "|---|---|---|---|---|"]
    for r in b["per_seed"]:
        rows.append(f"| {r['seed']} | {r['torch_train_seconds']:.2f} | {r['cpp_train_seconds']:.2f} | "
                    f"{r['cpp_to_torch']:.3f} | {r['torch_accuracy']:.2%} / {r['cpp_accuracy']:.2%} |")
    ratio = b["cpp_to_torch"]
    return rows + ["", "cpp / torch: median **{:.3f}** [{:.3f}–{:.3f}].".format(ratio["median"], *ratio["range"])]


def tokenizer_table(t):
    return ["| vocabulary | training s | val bytes/token | GPT-2's val bytes/token | round-trip failures | "
            "train docs | val docs | text |", "|---|---|---|---|---|---|---|---|",
            f"| {t['vocab_size']:,} | {t['train_seconds']:.1f} | {t['val_bytes_per_token']:.3f} | "
            f"{fmt(t.get('gpt2_val_bytes_per_token'), '.3f')} | {t['val_round_trip_failures']} | "
            f"{t['num_train_docs']:,} | {t['num_val_docs']:,} | `{rel(t.get('text'))}`{corpus_label(t)} |"]


def run_section(run, table, curves, file, out, missing):
    """The table and curves of one run directory, or the line saying there is none."""
    if run is None:
        return [missing]
    return [f"Run `{rel(run['dir'])}`:", ""] + table(run["metrics"]) + [""] + curves(run["scalars"], run["metrics"],
                                                                                      out / file)


def curves_from_json(curves):
    """A result_sections figure: a run's curves redrawn from its metrics JSON, where it keeps them."""
    def figure(key, metrics, out):
        scalars = scalars_from_metrics(metrics)
        return curves(scalars, metrics, out / f"{key}.png") if any(scalars.values()) else []
    return figure


def result_sections(results, prefix, table, what, results_dir, problems, figure=None, out=None):
    """One table per report/results/<prefix>*.json (and its figure, where given), or the line saying
    there is none; a file whose fields do not fit is named in `problems` and left out."""
    lines = []
    for key in sorted(k for k in results if result_name(k).startswith(prefix)):
        data, path = results[key]
        try:
            section = table(data) + [""] + (figure(figure_name(key, results), data, out) if figure else [])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            problems.append(f"left out {path}: a field is missing or of the wrong type ({type(e).__name__}: {e})")
            continue
        lines += [f"`{rel(path)}`:", ""] + section + [""]
    return lines or [f"- no {what} found in {results_dir}"]


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories (default: the newest LeNet-5 and GPT runs)")
    p.add_argument("--runs-root", type=Path, default=REPO / "runs", help="(default: %(default)s)")
    p.add_argument("--results", type=Path, default=REPO / "report" / "results",
                   help="benchmark/tokenizer JSON files (default: %(default)s)")
    p.add_argument("--out", type=Path, default=REPO / "report" / "generated", help="(default: %(default)s)")
    p.add_argument("--no-screenshots", action="store_true", help="skip the TensorBoard screenshots (Chromium)")
    p.add_argument("--gpu", "--gpu-logs", type=Path, default=None, dest="gpu",
                   help="the GPU results folder whose nvidia-smi files and runs fill the GPU figures: "
                        "gpu_check.sh's OUT or its logs/, or a folder like report/results/h200-2026-11-30 "
                        "(default: the newest such folder under --results)")
    p.add_argument("--pdf", action="store_true", help="also render report/report.md to report/report.pdf")
    return p.parse_args(argv)


def find_runs(args, problems):
    """{kind: run}: the first run of each kind given, or the newest of each found under --runs-root."""
    dirs = args.runs or [d for d in (newest_run(args.runs_root / "lenet5", problems),
                                     newest_run(args.runs_root / "gpt", problems)) if d]
    by_kind = {}
    for run in (load_run(d, problems) for d in dirs):
        if run:
            by_kind.setdefault(run["kind"], run)
    return by_kind


def lenet_lines(run, results, args, problems):
    lines = ["## LeNet-5", ""]
    lines += run_section(run, lenet_table, lenet_curves, "lenet_curves.png", args.out,
                         f"- no LeNet-5 run found under {rel(args.runs_root / 'lenet5')}")
    images = run or committed_run("lenet5", args, problems)
    if images:
        source = images.get("source") or rel(images["dir"])
        lines += ["", f"Intermediate layers of `{source}`:", ""] + lenet_images(images, args.out)
    lines += ["", "Runs whose metrics were kept in report/results:", ""]
    lines += result_sections(results, "lenet_run", lenet_table, "LeNet-5 run metrics", args.results, problems,
                             curves_from_json(lenet_curves), args.out)
    lines += ["", "Speed against the lab's original recipe:", ""]
    return lines + result_sections(results, "lenet_bench", lenet_bench_table,
                                   "LeNet-5 benchmark", args.results, problems)


def other_lines(by_kind, results, args, problems, todo):
    """GELU, tokenizer, GPT, the ladder, GPU use and the screenshots."""
    lines = ["", "## GELU operator", ""]
    lines += result_sections(results, "gelu_bench", gelu_table, "GELU benchmark", args.results, problems)
    lines += ["", "## Tokenizer", ""]
    lines += result_sections(results, "tokenizer", tokenizer_table, "tokenizer metrics", args.results, problems)
    lines += ["", "## GPT-2", ""]
    lines += run_section(by_kind.get("gpt"), gpt_table, gpt_curves, "gpt_curves.png", args.out,
                         f"- no GPT run found under {rel(args.runs_root / 'gpt')}")
    lines += ["", "Runs whose metrics were kept in report/results:", ""]
    lines += result_sections(results, "gpt_run", gpt_table, "GPT run metrics", args.results, problems,
                             curves_from_json(gpt_curves), args.out)
    lines += ["", "## Acceleration ladder", ""]
    lines += result_sections(results, "gpt_bench", ladder_table, "acceleration ladder", args.results, problems,
                             ladder_figure, args.out)
    lines += ["", "## GPU utilisation", ""] + gpu_figure(list(by_kind.values()), args.out)
    folder = gpu_results_folder(args)
    lines += ["", "## GPU figures the report links", ""]
    lines += gpu_slot_lines(folder, args.results, args.out, todo, problems)
    if not args.no_screenshots:
        lines += ["", "## TensorBoard, as a browser shows it", ""]
        with tempfile.TemporaryDirectory() as unpacked:
            lines += tensorboard_screenshots(screenshot_sources(by_kind, args, Path(unpacked)), args.out, problems)
    return lines


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    problems = []
    by_kind = find_runs(args, problems)
    results = load_results(args.results, problems)
    lines = ["# Generated results", "",
             "Written by `python report/make_report.py`; every number is read from the files named.", ""]
    lines += lenet_lines(by_kind.get("lenet5"), results, args, problems)
    todo = []
    lines += other_lines(by_kind, results, args, problems, todo)
    if problems:
        lines += ["", "## Problems with the inputs", ""] + [f"- {p}" for p in problems]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    summary = f"wrote {args.out / 'results.md'} and {len(list(args.out.glob('*.png')))} figures"
    print(summary + (f"; {len(problems)} problem(s) with the inputs" if problems else ""))
    for line in todo:
        print(f"GPU figure missing: {line}")
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.pdf:
        print(f"wrote {browser.write_pdf(REPO / 'report' / 'report.md', REPO / 'report' / 'report.pdf')}")
    return lines


if __name__ == "__main__":
    main()
