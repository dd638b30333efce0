"""Regenerate the report's figures and results tables from run directories and benchmark JSON.

    python report/make_report.py                          # newest runs/lenet5/* and runs/gpt/* + report/results/*.json
    python report/make_report.py runs/lenet5/A runs/gpt/B --out /tmp/report

Reads TensorBoard event files (tensorboard's EventAccumulator) and the metrics.json every run
writes; writes PNG figures and results.md into --out (default report/generated/). Whatever is
missing is named in results.md ("no GPT run found under runs/gpt"), never filled in.
"""
import argparse
import json
import struct
import sys
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

def plot_lines(path, panels, title):
    """panels: [(ylabel, {label: [(x, y)]}, xlabel)] side by side."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (ylabel, series, xlabel) in zip(axes[0], panels):
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


def lenet_figures(run, out, lines):
    s, m = run["scalars"], run["metrics"]
    name = f"LeNet-5 ({m.get('device_name', m['device'])}, act={m['act']})"
    plot_lines(out / "lenet_curves.png",
               [("loss", {"train": s.get("train/loss", []), "test": s.get("test/loss", [])}, "step"),
                ("test accuracy", {"test": s.get("test/accuracy", [])}, "step")], name)
    lines.append("![LeNet-5 curves](lenet_curves.png)")
    for tag, file in (("layers/conv1_filters", "lenet_conv1_filters.png"),
                      ("layers/conv1_feature_maps", "lenet_conv1_feature_maps.png"),
                      ("layers/conv2_feature_maps", "lenet_conv2_feature_maps.png")):
        if tag in run["images"]:
            (out / file).write_bytes(run["images"][tag])  # TensorBoard stores them as PNG already
            lines.append(f"![{tag}]({file})")
        else:
            lines.append(f"- no `{tag}` image in {run['dir']}")


def gpt_figures(run, out, lines):
    s, m = run["scalars"], run["metrics"]
    title = f"GPT-2 ({m['device_name']} x {m['world_size']}, {m['precision']}, {m['tokens_seen']:,} tokens)"
    plot_lines(out / "gpt_curves.png",
               [("loss (nats/token)", {"train": s.get("train/loss", []), "validation": s.get("val/loss", [])}, "step"),
                ("tokens / s", {"throughput": s.get("perf/tokens_per_second", [])}, "step")], title)
    lines.append("![GPT-2 loss and throughput](gpt_curves.png)")


def gpu_figure(runs, out, lines):
    series = {}
    for run in runs:
        for tag in ("gpu/utilization_percent", "gpu/memory_used_GiB"):
            if run["scalars"].get(tag):
                series.setdefault(tag, {})[f"{run['kind']} ({run['dir'].name})"] = run["scalars"][tag]
    if not series:
        lines.append("- no GPU utilisation recorded: the runs above ran on the CPU (NVML curves appear "
                     "only for GPU runs)")
        return
    plot_lines(out / "gpu_utilization.png", [(tag, pts, "step") for tag, pts in series.items()],
               "GPU utilisation and memory (NVML)")
    lines.append("![GPU utilisation](gpu_utilization.png)")


def ladder_figure(name, bench, out, lines):
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
    lines.append(f"![{name}]({name}.png)")


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
    rows = [f"{bench['device_name']}, batch {bench['micro_batch']} x {bench['seq_len']}, vocabulary "
            f"{bench['vocab_size']:,}:", "", "| # | rung | tokens/s | ms/step | MFU | speed-up |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(bench["rungs"], 1):
        rows.append(f"| {i} | {r['name']} | {r['tokens_per_second']:,.0f} | {r['ms_per_step']:,.1f} | "
                    f"{fmt(r['mfu'], '.1%')} | {r['speedup']:.2f}× |")
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
    rows += ["", f"Default training time = **{b['ratio_to_one_baseline_epoch']:.2f}×** one original epoch."]
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
    lines = [f"Run `{rel(run['dir'])}`:", ""] + table(run["metrics"]) + [""]
    figures(run, out, lines)
    return lines


def result_sections(results, prefix, table, what, results_dir):
    """One table per report/results/<prefix>*.json, or the line saying there is none."""
    lines = []
    for key in sorted(k for k in results if k.startswith(prefix)):
        lines += [f"`report/results/{key}.json`:", ""] + table(results[key]) + [""]
    return lines or [f"- no {what} found in {results_dir}"]


# ----------------------------------------------------------------------------- main

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories (default: the newest LeNet-5 and GPT runs)")
    p.add_argument("--runs-root", type=Path, default=REPO / "runs", help="(default: %(default)s)")
    p.add_argument("--results", type=Path, default=REPO / "report" / "results",
                   help="benchmark/tokenizer JSON files (default: %(default)s)")
    p.add_argument("--out", type=Path, default=REPO / "report" / "generated", help="(default: %(default)s)")
    args = p.parse_args(argv)
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
    lines += result_sections(results, "lenet_run", lenet_table, "LeNet-5 run metrics", args.results)
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
    lines += result_sections(results, "gpt_run", gpt_table, "GPT run metrics", args.results)
    lines += ["", "## Acceleration ladder", ""]
    lines += result_sections(results, "gpt_bench", ladder_table, "acceleration ladder", args.results)
    for key in sorted(k for k in results if k.startswith("gpt_bench")):
        ladder_figure(key, results[key], args.out, lines)

    lines += ["", "## GPU utilisation", ""]
    gpu_figure(runs, args.out, lines)
    if problems:
        lines += ["", "## Problems with the inputs", ""] + [f"- {p}" for p in problems]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    summary = f"wrote {args.out / 'results.md'} and {len(list(args.out.glob('*.png')))} figures"
    print(summary + (f"; {len(problems)} problem(s) with the inputs" if problems else ""))
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return lines


if __name__ == "__main__":
    main()
