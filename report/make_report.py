"""Regenerate the report's figures and results tables from run directories and benchmark JSON.

    python report/make_report.py                          # newest runs/lenet5/* and runs/gpt/* + report/results/*.json
    python report/make_report.py runs/lenet5/A runs/gpt/B --out /tmp/report

Reads TensorBoard event files (tensorboard's EventAccumulator) and the metrics.json every run
writes; writes PNG figures and results.md into --out (default report/generated/). Whatever is
missing is named in results.md ("no GPT run found under runs/gpt"), never filled in.
"""
import argparse
import json
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- inputs

def newest_run(root, problems):
    """The most recent run under root whose metrics.json reads; each newer run that was passed over
    (crashed, still running, metrics broken) is named in `problems`, never skipped silently."""
    runs = sorted((d for d in root.glob("*") if d.is_dir() and (d / "args.json").exists()),
                  key=lambda d: (d / "args.json").stat().st_mtime, reverse=True)
    for run_dir in runs:
        try:
            json.loads((run_dir / "metrics.json").read_text())
            return run_dir
        except FileNotFoundError:
            problems.append(f"skipped the newer run {run_dir}: no metrics.json (crashed, stopped or still running)")
        except (OSError, json.JSONDecodeError) as e:
            problems.append(f"skipped the newer run {run_dir}: unreadable metrics.json ({e})")
    return None


def run_kind(run_dir, metrics):
    if "act" in metrics:
        return "lenet5"
    if "tokens_seen" in metrics:
        return "gpt"
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
    metrics_path = run_dir / "metrics.json"
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"unreadable {metrics_path}: {e}")
        return None
    scalars, images = load_events(run_dir, problems)
    return {"dir": run_dir, "metrics": metrics, "scalars": scalars, "images": images,
            "kind": run_kind(run_dir, metrics)}


def load_results(results_dir, problems):
    out = {}
    for path in sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []:
        try:
            out[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            problems.append(f"unreadable {path}: {e}")
    return out


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


def lenet_figures(run, out):
    """The curves and the intermediate-layer images of one LeNet-5 run; the lines that show them."""
    lines = lenet_curves(run["scalars"], run["metrics"], out / "lenet_curves.png")
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


def gpt_figures(run, out):
    return gpt_curves(run["scalars"], run["metrics"], out / "gpt_curves.png")


def gpt_curves(s, m, path):
    """Loss (train, validation, the lab's goal) and throughput against tokens, for one GPT run."""
    per_step = m["tokens_seen"] / max(1, m["steps"])
    tokens = {tag: [(step * per_step, value) for step, value in s.get(tag, [])]
              for tag in ("train/loss", "val/loss", "perf/tokens_per_second")}
    size = f"{m['params'] / 1e6:.2f}M parameters" + (", tiny preset" if m.get("preset") == "tiny" else "")
    corpus = "stand-in corpus, not WOS" if "standin" in str(m.get("text")) else "WOS"
    title = (f"GPT-2 structure, {size}, {corpus} ({m['device_name']} x {m['world_size']}, {m['precision']}, "
             f"{m['tokens_seen']:,} tokens)")
    plot_lines(path, [("loss (nats/token)", {"train": tokens["train/loss"], "validation": tokens["val/loss"]}, "tokens"),
                      ("tokens / s", {"throughput": tokens["perf/tokens_per_second"]}, "tokens")], title,
               hline=(0, 7.0, "goal: loss < 7"), ymin0=1)
    return [f"![GPT-2 loss and throughput]({path.name})"]


def nvidia_smi_figures(log_dir, out):
    """From benchmarks/gpu_check.sh's logs: the nvidia-smi snapshot as an image, and the utilisation
    logged every 500 ms beside each training run (nvidia-smi-<run>.csv)."""
    lines = []
    snapshot = log_dir / "nvidia-smi.txt"
    if snapshot.is_file():
        text = snapshot.read_text()
        fig = plt.figure(figsize=(9, 0.16 * len(text.splitlines()) + 0.4))
        fig.text(0.01, 0.99, text, family="monospace", fontsize=7, va="top")
        fig.savefig(out / "gpu_nvidia_smi.png", dpi=120)
        plt.close(fig)
        lines.append("![nvidia-smi](gpu_nvidia_smi.png)")
    series = {}
    for csv_path in sorted(log_dir.glob("nvidia-smi-*.csv")):
        rows = [r.split(",") for r in csv_path.read_text().splitlines()[1:] if r.count(",") >= 2]
        util = [float(r[1].strip().split()[0]) for r in rows if r[1].strip().split()[0].replace(".", "").isdigit()]
        series[csv_path.stem.removeprefix("nvidia-smi-")] = [(i * 0.5, u) for i, u in enumerate(util)]
    if series:
        plot_lines(out / "gpu_nvidia_smi_utilization.png", [("GPU utilisation %", series, "seconds")],
                   "nvidia-smi, every 500 ms during each run", ymin0=0)
        lines.append("![nvidia-smi utilisation](gpu_nvidia_smi_utilization.png)")
    return lines


def gpu_figure(runs, out):
    series = {}
    for run in runs:
        for tag in ("gpu/utilization_percent", "gpu/memory_used_GiB"):
            if run["scalars"].get(tag):
                series.setdefault(tag, {})[f"{run['kind']} ({run['dir'].name})"] = run["scalars"][tag]
    if not series:
        return ["- no GPU utilisation recorded: the runs above ran on the CPU (NVML curves appear only for GPU runs)"]
    plot_lines(out / "gpu_utilization.png", [(tag, pts, "step") for tag, pts in series.items()],
               "GPU utilisation and memory (NVML)")
    return ["![GPU utilisation](gpu_utilization.png)"]


def ladder_figure(name, bench, out):
    rungs = bench["rungs"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rungs) + 1.2))
    ax.barh(range(len(rungs)), [r["tokens_per_second"] for r in rungs], color="tab:blue")
    ax.set_yticks(range(len(rungs)), [r["name"].split(" (")[0].split(":")[0] for r in rungs], fontsize=8)
    ax.invert_yaxis()
    for i, r in enumerate(rungs):
        ax.text(r["tokens_per_second"], i, f" x{r['speedup']:.2f}", va="center", fontsize=7)
    ax.set_xlabel("tokens / s")
    ax.set_title(f"Acceleration ladder, {bench['device_name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return [f"![{name}]({name}.png)"]


# ----------------------------------------------------------------------------- TensorBoard in a real browser

BROWSER_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
SHOTS = {  # run kind -> [(file, TensorBoard page: dashboard & its tag filter)]: the cards that matter
    "lenet5": [("lenet_tensorboard_scalars.png", "scalars&tagFilter=loss%7Caccuracy&_smoothingWeight=0"),
               ("lenet_tensorboard_layers.png", "images&tagFilter=layers")],
    "gpt": [("gpt_tensorboard_scalars.png", "scalars&tagFilter=train%2Floss%7Cval%2Floss%7Ctokens_per_second"
                                            "&_smoothingWeight=0")],
}


def find_browser():
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_tensorboard(base, timeout=90):
    """Until the server lists at least one run with scalars: its HTTP API answered with data."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=5) as response:
                if json.loads(response.read()):
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def browser(*args, timeout=120):
    """Headless Chromium with a fresh profile, quiet about the network it cannot reach."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([find_browser(), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                       capture_output=True, timeout=timeout)


def tensorboard_screenshots(runs, out, problems):
    """Start a real TensorBoard server on each run and let Chromium photograph its pages, as a student
    sees them; the lines that show them. Without Chromium: said, and the matplotlib figures remain."""
    if not find_browser():
        return ["- no TensorBoard screenshots: Chromium not found (`apt-get install chromium`)"]
    lines = []
    for run in runs:
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(run["dir"]), "--host",
                                   "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            if not wait_for_tensorboard(base):
                problems.append(f"TensorBoard on {run['dir']} did not answer; no screenshots of it")
                continue
            for file, page in SHOTS.get(run["kind"], []):
                browser("--window-size=1600,1000", "--virtual-time-budget=10000", f"--screenshot={out / file}",
                        f"{base}/?darkMode=false#{page}")
                lines.append(f"![TensorBoard: {page.split('&')[0]} of {run['dir'].name}]({file})")
        finally:
            server.terminate()
            server.wait(timeout=30)
    return lines


# ----------------------------------------------------------------------------- the PDF

PDF_CSS = """
body { font-family: "Noto Sans CJK SC", "Noto Sans", sans-serif; font-size: 10.5pt; line-height: 1.5; margin: 0; }
h1 { font-size: 18pt; } h2 { font-size: 14pt; border-bottom: 1px solid #999; } h3 { font-size: 12pt; }
img { max-width: 100%; display: block; margin: 6px auto; }
table { border-collapse: collapse; font-size: 9pt; margin: 6px 0; } td, th { border: 1px solid #bbb; padding: 2px 5px; }
code, pre { font-family: "Noto Sans Mono CJK SC", monospace; font-size: 8.5pt; } pre { white-space: pre-wrap; }
blockquote { color: #444; border-left: 3px solid #bbb; margin-left: 0; padding-left: 10px; }
@page { size: A4; margin: 16mm 14mm; }
"""


def write_pdf(markdown_path, pdf_path):
    """report.md -> HTML (python-markdown: tables, code) -> PDF by Chromium's print-to-pdf; Chinese
    text in Noto CJK (Debian's fonts-noto-cjk). The HTML sits beside report.md so figure links resolve."""
    import markdown
    if not find_browser():
        raise SystemExit("error: --pdf needs Chromium (apt-get install chromium fonts-noto-cjk)")
    body = markdown.markdown(markdown_path.read_text(), extensions=["tables", "fenced_code"])
    html = markdown_path.with_suffix(".pdf.html")
    html.write_text(f'<!doctype html><html lang="zh"><head><meta charset="utf-8"><style>{PDF_CSS}</style></head>'
                    f"<body>{body}</body></html>")
    try:
        browser("--no-pdf-header-footer", f"--print-to-pdf={pdf_path}", html.resolve().as_uri())
    finally:
        html.unlink()
    if not pdf_path.exists():
        raise SystemExit(f"error: Chromium wrote no {pdf_path}")
    return pdf_path


# ----------------------------------------------------------------------------- tables

def rel(path):
    """Paths inside the repository as repository-relative, so results.md reads the same on any machine."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def corpus_label(text):
    return " — **stand-in corpus, not WOS**" if text and "standin" in str(text) else ""


def fmt(value, spec=".4g"):
    return "—" if value is None else format(value, spec) if isinstance(value, (int, float)) else str(value)


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
            "", f"Text: `{rel(m.get('text'))}`{corpus_label(m.get('text'))}; tokenizer: `{rel(m.get('tokenizer'))}`, "
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
    rows = [f"{bench['device_name']}, {bench['dtype']}, forward + backward (ms, median):", "",
            "| n | ATen | lab's composite | Python Function | ext | ext vs ATen |", "|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        rows.append(f"| 2^{r['n'].bit_length() - 1} | {r['aten_ms']:.3f} | {r.get('seed_ms', 0):.3f} | "
                    f"{r.get('python_ms', 0):.3f} | {r['ext_ms']:.3f} | {r['ext_vs_aten']:.2f}× |")
    return rows


def lenet_bench_table(b):
    rows = [f"{b['device_name']}:", "", "| run | training s | test accuracy |", "|---|---|---|"]
    for i, (s, a) in enumerate(zip(b["baseline_epoch_seconds"], b["baseline_accuracy"]), 1):
        rows.append(f"| original recipe (batch 64, Adam 1e-3, ToTensor), epoch {i} | {s:.2f} | {a:.2%} |")
    rows.append(f"| default `lenet5.py`, {b['default_epochs']} epochs | {b['default_train_seconds']:.2f} | "
                f"{b['default_accuracy']:.2%} |")
    if "lightning_train_seconds" in b:
        rows.append(f"| `lenet5.py --engine lightning`, {b['default_epochs']} epochs | {b['lightning_train_seconds']:.2f} | "
                    f"{b['lightning_accuracy']:.2%} |")
    rows += ["", f"Default training time = **{b['ratio_to_one_baseline_epoch']:.2f}×** one original epoch."]
    if "lightning_to_plain" in b:
        rows.append(f"Lightning / plain loop = **{b['lightning_to_plain']:.2f}×** (per repeat: "
                    + ", ".join(f"{r:.2f}" for r in b["all_lightning_to_plain"]) + ").")
    return rows


def tokenizer_table(t):
    return ["| vocabulary | training s | val bytes/token | GPT-2's val bytes/token | round-trip failures | "
            "train docs | val docs | text |", "|---|---|---|---|---|---|---|---|",
            f"| {t['vocab_size']:,} | {t['train_seconds']:.1f} | {t['val_bytes_per_token']:.3f} | "
            f"{fmt(t.get('gpt2_val_bytes_per_token'), '.3f')} | {t['val_round_trip_failures']} | "
            f"{t['num_train_docs']:,} | {t['num_val_docs']:,} | `{rel(t.get('text'))}`{corpus_label(t.get('text'))} |"]


def run_section(run, table, figures, out, missing):
    """The table and figures of one run directory, or the line saying there is none."""
    if run is None:
        return [missing]
    return [f"Run `{rel(run['dir'])}`:", ""] + table(run["metrics"]) + [""] + figures(run, out)


def result_sections(results, prefix, table, what, results_dir, curves=None, out=None):
    """One table per report/results/<prefix>*.json (and its curves redrawn from the JSON, where it
    keeps them), or the line saying there is none."""
    lines = []
    for key in sorted(k for k in results if k.startswith(prefix)):
        lines += [f"`report/results/{key}.json`:", ""] + table(results[key]) + [""]
        scalars = scalars_from_metrics(results[key]) if curves else {}
        if any(scalars.values()):
            lines += curves(scalars, results[key], out / f"{key}.png") + [""]
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
    p.add_argument("--gpu-logs", type=Path, default=None, help="benchmarks/gpu_check.sh's logs/ folder: "
                                                                "nvidia-smi snapshot and utilisation")
    p.add_argument("--pdf", action="store_true", help="also render report/report.md to report/report.pdf")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    problems, lines = [], ["# Generated results", "",
                           "Written by `python report/make_report.py`; every number is read from the files named.",
                           ""]
    dirs = args.runs or [d for d in (newest_run(args.runs_root / "lenet5", problems),
                                     newest_run(args.runs_root / "gpt", problems)) if d]
    runs = [r for r in (load_run(d, problems) for d in dirs) if r]
    by_kind = {}
    for run in runs:
        by_kind.setdefault(run["kind"], run)  # the first of each kind given (or the newest found)
    results = load_results(args.results, problems)

    lines += ["## LeNet-5", ""]
    lines += run_section(by_kind.get("lenet5"), lenet_table, lenet_figures, args.out,
                         f"- no LeNet-5 run found under {args.runs_root / 'lenet5'}")
    lines += ["", "Runs whose metrics were kept in report/results:", ""]
    lines += result_sections(results, "lenet_run", lenet_table, "LeNet-5 run metrics", args.results, lenet_curves,
                             args.out)
    lines += ["", "Speed against the lab's original recipe:", ""]
    lines += result_sections(results, "lenet_bench", lenet_bench_table, "LeNet-5 benchmark", args.results)
    lines += ["", "## GELU operator", ""]
    lines += result_sections(results, "gelu_bench", gelu_table, "GELU benchmark", args.results)
    lines += ["", "## Tokenizer", ""]
    lines += result_sections(results, "tokenizer", tokenizer_table, "tokenizer metrics", args.results)

    lines += ["", "## GPT-2", ""]
    lines += run_section(by_kind.get("gpt"), gpt_table, gpt_figures, args.out,
                         f"- no GPT run found under {args.runs_root / 'gpt'}")
    lines += ["", "Runs whose metrics were kept in report/results:", ""]
    lines += result_sections(results, "gpt_run", gpt_table, "GPT run metrics", args.results, gpt_curves, args.out)
    lines += ["", "## Acceleration ladder", ""]
    lines += result_sections(results, "gpt_bench", ladder_table, "acceleration ladder", args.results)
    for key in sorted(k for k in results if k.startswith("gpt_bench")):
        lines += ladder_figure(key, results[key], args.out)

    lines += ["", "## GPU utilisation", ""]
    lines += gpu_figure(runs, args.out)
    if args.gpu_logs:
        lines += nvidia_smi_figures(args.gpu_logs, args.out)
    if not args.no_screenshots:
        lines += ["", "## TensorBoard, as a browser shows it", ""]
        lines += tensorboard_screenshots([by_kind[k] for k in ("lenet5", "gpt") if k in by_kind], args.out, problems)
    if problems:
        lines += ["", "## Problems with the inputs", ""] + [f"- {p}" for p in problems]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    summary = f"wrote {args.out / 'results.md'} and {len(list(args.out.glob('*.png')))} figures"
    print(summary + (f"; {len(problems)} problem(s) with the inputs" if problems else ""))
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.pdf:
        print(f"wrote {write_pdf(REPO / 'report' / 'report.md', REPO / 'report' / 'report.pdf')}")
    return lines


if __name__ == "__main__":
    main()
