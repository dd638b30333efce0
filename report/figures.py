"""The figures (matplotlib PNGs) and the reports' Markdown tables; a figure or table raises on a missing or mistyped
field (the caller names the file in one problem line), and escapes every string of the inputs it shows."""
import re
from datetime import datetime
from statistics import median_high

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.ticker import EngFormatter, MaxNLocator

from report.inputs import FIELD_ERRORS, NUMBER, Markdown, escape
from training.metrics import SUCCESS_LOSS

BUSY = 10  # % utilisation: a sample at or above it is training, below it start-up or idle
MAX_ROWS = 200  # a ladder's rows tabled (ours has ~15): a PDF of thousands of rows is never printed


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lines(path, panels, title, hline=None, ymin0=None):
    """panels [(ylabel, {label: [(x, y)]}, xlabel)] side by side; hline (panel, y, label); ymin0: a panel from 0."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for i, (ax, (ylabel, series, xlabel)) in enumerate(zip(axes[0], panels)):
        if hline and hline[0] == i:
            ax.axhline(hline[1], color="gray", linestyle="--", linewidth=1, label=hline[2])
        if ymin0 == i:
            ax.set_ylim(bottom=0, top=max((y for pts in series.values() for _, y in pts), default=1) * 1.1)
        for label, points in series.items():
            if points:
                ax.plot(*zip(*points), marker="o" if len(points) < 20 else None, label=label.replace("$", r"\$"))
        ax.xaxis.set_major_locator(MaxNLocator(5))  # token counts as 200k, 1.2M: five fit side by side
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title.replace("$", r"\$"), fontsize=10)  # a run's strings, never matplotlib's math
    save(fig, path)


def gpt_curves(m, path, scalars=None):
    """Loss and throughput against tokens: from `scalars` ({tag: [(step, value)]}), else the metrics' curves."""
    s = scalars or {"loss/train": m.get("loss_curve", []), "loss/val": m.get("val_curve", []),
                    "perf/tokens_per_second": m.get("throughput_curve", [])}
    if not any(s.values()):
        return []
    per_step = m["tokens_seen"] / max(1, m["steps"])
    tokens = {tag: [(step * per_step, value) for step, value in s.get(tag, [])]
              for tag in ("loss/train", "loss/val", "perf/tokens_per_second")}
    size = f"{m['params'] / 1e6:.2f}M parameters" + (", tiny preset" if m.get("preset") == "tiny" else "")
    named = (m.get("corpus") or {}).get("name")  # as the corpus's content was identified
    corpus = {"stand-in": "stand-in corpus, not WOS", "WOS46985": "WOS"}.get(named, "other corpus, not WOS")
    title = (f"GPT-2 structure, {size}, {corpus}\n{m['device_name']} x {m['world_size']}, {m['precision']}, "
             f"{m['tokens_seen']:,} tokens")  # two lines: one is wider than the figure, and centred it is cut
    plot_lines(path, [("loss (nats/token)", {"train": tokens["loss/train"], "validation": tokens["loss/val"]},
                       "tokens"), ("tokens / s", {"throughput": tokens["perf/tokens_per_second"]}, "tokens")],
               title, hline=(0, SUCCESS_LOSS, f"goal: loss < {SUCCESS_LOSS:g}"), ymin0=1)
    return [f"![GPT-2 loss and throughput]({path.name})"]


def smi_series(text):
    """nvidia-smi --query-gpu CSV -> {column: [(seconds since the first row, value)]}; N/A cells skipped."""
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
            if (value := cell.strip().split(" ")[0]).replace(".", "", 1).isdigit():
                series[name].append(((when - start).total_seconds(), float(value)))
    return series


def gpu_name(files):
    """The GPU's name, from any nvidia-smi snapshot in the folder ('the GPU' when there is none)."""
    for name in sorted(n for n in files if n.startswith("nvidia-smi") and n.endswith(".txt")):
        if found := re.search(r"\|\s+\d+\s+(NVIDIA [A-Za-z0-9 -]+?)\s{2,}", files[name]()):
            return found.group(1)
    return "the GPU"


def busy_window(text):
    """An nvidia-smi CSV's interval and, while training (first to last sample >= BUSY %), utilisation and power."""
    series = smi_series(text)
    util, power = series.get("utilization.gpu", []), dict(series.get("power.draw", []))
    if len(util) < 2 or not (busy := [i for i, (_, u) in enumerate(util) if u >= BUSY]):
        return {}
    window = util[busy[0]:busy[-1] + 1]
    values, watts = [u for _, u in window], [power[t] for t, _ in window if t in power]
    return {"sample_ms": median_high(b[0] - a[0] for a, b in zip(util, util[1:])) * 1000, "samples": len(window),
            "seconds": window[-1][0] - window[0][0], "median": median_high(values), "min": min(values),
            "max": max(values), "power_median": median_high(watts) if watts else None}


def utilization_figure(panels, path):
    """panels: [(files, csv name, what ran)]: one panel each, utilisation (left axis) and power (right)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 2.8), squeeze=False)
    for ax, (files, csv_name, what) in zip(axes[0], panels):
        series = smi_series(files[csv_name]())
        util, power = series["utilization.gpu"], series.get("power.draw", [])
        ax.plot(*zip(*util), color="tab:blue", linewidth=1)
        ax.set_ylim(0, 105)
        ax.set_ylabel("utilisation (%)", color="tab:blue")
        ax.set_xlabel("seconds")
        if power:
            twin = ax.twinx()
            twin.plot(*zip(*power), color="tab:red", linewidth=0.8, alpha=0.7)
            twin.set_ylim(0, max(p for _, p in power) * 1.1)
            twin.set_ylabel("power (W)", color="tab:red")
        ax.set_title(f"{what}: {csv_name}, {gpu_name(files)}", fontsize=8)
        ax.grid(alpha=0.3)
    save(fig, path)


def terminal_figure(text, title, path):
    """An nvidia-smi snapshot as the terminal showed it: its text, monospaced, light on dark."""
    lines = text.rstrip("\n").splitlines()
    fig = plt.figure(figsize=(0.085 * max(map(len, lines)) + 0.3, 0.17 * len(lines) + 0.6), facecolor="#1e1e1e")
    fig.text(0.5, 0.995, title, color="#dddddd", fontsize=8, ha="center", va="top")
    fig.text(0.01, 1 - 0.35 / (0.17 * len(lines) + 0.6), "\n".join(lines), family="DejaVu Sans Mono",
             fontsize=8.5, color="#e8e8e8", va="top", linespacing=1.2)
    fig.savefig(path, dpi=150, facecolor=fig.get_facecolor(), bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)


def gpu_figure(runs, out):
    series = {}
    for run in runs:
        for tag in ("system/gpu_utilization_percent", "system/gpu_memory_used_GiB"):
            if run.scalars.get(tag):
                series.setdefault(tag, {})[f"{run.kind} ({run.events.name})"] = run.scalars[tag]
    if not series:
        return ["- no GPU utilisation recorded: the runs above ran on the CPU (NVML curves appear only for GPU runs)"]
    plot_lines(out / "gpu_nvml.png", [(tag, pts, "step") for tag, pts in series.items()],
               "GPU utilisation and memory (NVML)")
    return ["![GPU utilisation (NVML)](gpu_nvml.png)"]


def device_words(name):
    """A device_name as a Chinese sentence says it: "AMD EPYC, CPU (2 threads)" as "AMD EPYC 处理器（2 线程）"."""
    cpu = re.fullmatch(r"(.+), CPU \((\d+) threads?\)", str(name))
    return f"{cpu[1]} 处理器（{cpu[2]} 线程）" if cpu else name


def seconds(value):
    return "—" if value is None else f"{value:.0f} s"


def table(header, rows):
    """A Markdown table: the header's cells, then each row's.
    Cells are Markdown already: the strings of the inputs in them escaped."""
    lines = [header, ["---"] * len(header), *rows]
    return Markdown("\n".join(f"| {' | '.join(row)} |" for row in lines))


def fmt(value, spec=".4g"):
    number = isinstance(value, NUMBER) and not isinstance(value, bool)  # a flag: True, not 1
    return "—" if value is None else format(value, spec) if number else escape(value)


# ----------------------------------------------------------------------------- tables and words

def gpu_runs_table(runs, headline):
    """A GPU folder's GPT runs [(stem, metrics, seconds)], the headline bold, rounded as the text quotes."""
    rows = []
    for stem, m, process in runs:
        tag = stem.split("_")[2] if stem.count("_") >= 2 else stem
        cache = "，冷缓存" if "cold" in tag else "，热缓存" if "warm" in tag else ""
        compiling = escape(m.get("compile", "off"))
        loop = f"{m['train_seconds']:.1f} s" + (f"（{m['compile_seconds']:.1f} s）" if compiling != "off"
                                                 and isinstance(m.get("compile_seconds"), NUMBER) else "")
        name = f"**`{escape(tag, code=True)}`**" if stem == headline else f"`{escape(tag, code=True)}`"
        rows.append([name, f"{m['vocab_size']:,}", compiling + cache, seconds(process), loop,
                     f"{m['tokens_per_second']:,.0f}", fmt(m.get("mfu"), ".1%"),
                     f"{m['final_train_loss']:.2f} / {m['final_val_loss']:.2f}", f"{m['val_bits_per_byte']:.3f}"])
    return table(["运行", "词表", "编译", "进程时间", "训练循环（其中编译）", "token/s", "MFU", "训练 / 验证损失",
                  "bits/byte"], rows)


RUNG_NAMES = {"naive": "朴素基线", "+ dropout 0": "dropout 0",
              "+ SDPA attention": "SDPA 注意力", "+ own GPT module from the same GPT2Config": "自己的 GPT 模块",
              "+ TF32 matmuls": "TF32", "+ bf16 autocast": "**bf16 autocast**", "+ fp16 autocast + GradScaler":
              "**fp16 autocast + GradScaler**", "+ torch.compile, each block on its own": "按块 `torch.compile`",
              "+ fused AdamW": "fused AdamW（= 默认配置）"}


VERDICTS = {"faster": "更快", "slower": "更慢", "within noise": "噪声内", "undecided": "未定"}


def rung_key(name):
    """A ladder row's name without its explanation: what the same row is called on every device."""
    return name.strip().split(" (")[0].split(":")[0]


def rung_label(name):
    """A ladder row as the Chinese report names it; a row it does not know, as its JSON does."""
    key, name = rung_key(name), str(name).strip()
    if key.startswith("default without"):
        what = rung_label("+ " + key.removeprefix("default without ")).strip("*").split("（")[0]
        return f"默认配置去掉{' ' * what[:1].isascii()}{what}"
    if name.startswith("candidate:"):
        return "候选：" + escape(name.removeprefix("candidate:").strip())
    return RUNG_NAMES.get(key) or escape(name)


def verdict(row):
    """The evidence of the row's paired verdict (its word: in the row's cell): ratio [low–high], pairs, against."""
    v = row.get("verdict")
    if not isinstance(v, dict):
        return "—"
    return (f"×{fmt(v.get('ratio'), '.2f')} "
            f"[{fmt(v.get('low'), '.2f')}–{fmt(v.get('high'), '.2f')}]，{fmt(v.get('pairs'))} 对，比 "
            f"{rung_label(v.get('against', '—'))}")


def ladder_cells(bench):
    """[(row, cell)] of every row measured: tokens/s [range]（× the rung above, an indented row's × the default
    (the last rung)；its paired verdict's word, where gpt_bench.py judged it）."""
    rows = [r for r in bench["rungs"][:MAX_ROWS] if isinstance(r.get("tokens_per_second"), NUMBER)]
    rungs, out, previous = [r for r in rows if not r["name"].startswith(" ")], [], None
    for r in rows:
        base = previous if r in rungs else rungs[-1] if rungs else None
        span = r.get("tokens_per_second_range") if bench.get("repeats", 1) > 1 else None
        cell = f"{r['tokens_per_second']:,.0f}" + (" [{:,.0f}–{:,.0f}]".format(*span) if span else "")
        ratio = base and base["tokens_per_second"] and r["tokens_per_second"] / base["tokens_per_second"]
        word = VERDICTS.get((r.get("verdict") or {}).get("word"))
        if isinstance(ratio, float):  # (none against a row of 0 token/s)
            cell += f"（{'默认的 ' * (r not in rungs)}×{ratio:.2f}{f'，{word}' if word else ''}）"
        out.append((r, cell))
        previous = r if r in rungs else previous
    return out


def compared_cells(bench):
    """{row: cell} of the rungs and the leave-one-out rows, keyed as every device names the row."""
    return {rung_key(r["name"]): cell for r, cell in ladder_cells(bench)
            if not r["name"].startswith(" ") or rung_key(r["name"]).startswith("default without")}


def ladder_compare(gpu, cpu, where):
    """The ladder on the GPU (measured `where`: Markdown) beside the CPU's."""
    columns = [(f"{where}，{escape(gpu.get('repeats', 1))} 次", compared_cells(gpu))] if gpu else []
    columns += [(f"CPU，{escape(cpu.get('repeats', 1))} 次的中位数 [范围]", compared_cells(cpu))] if cpu else []
    keys = sorted(dict.fromkeys(k for _, c in columns for k in c), key=lambda k: k.startswith("default without"))
    rows = [[rung_label(k), *(cells.get(k, "—") for _, cells in columns)] for k in keys]
    return table(["在上一行之上再加", *(f"{head} token/s（× 上一行）" for head, _ in columns)], rows)


def ladder_report(bench, source):
    """A ladder JSON whole (report/student.md): a caption from its own fields, every row (candidates and failures
    too, up to MAX_ROWS) with its paired verdict and peak memory where recorded."""
    try:
        rungs, cells = bench["rungs"][:MAX_ROWS], {id(r): cell for r, cell in ladder_cells(bench)}
        extra = [("判定（配对比值）", verdict)] * any("verdict" in r for r in rungs) + [
            ("峰值内存 GiB", lambda r: fmt(r["peak_memory_gib"], ".2f") if "peak_memory_gib" in r else "—")
        ] * any("peak_memory_gib" in r for r in rungs)
        rows = [[f"{'↳ ' * r['name'].startswith(' ')}{rung_label(r['name'])}",
                 cells.get(id(r), f"失败：{escape(r.get('error'))}"), *(cell(r) for _, cell in extra)] for r in rungs]
        shape = "".join(f"，{k} {escape(bench[k])}" for k in ("preset", "n_layer", "n_head", "n_embd") if k in bench)
        left = f"另有 {len(bench['rungs']) - MAX_ROWS:,} 行没有列出；" if len(bench["rungs"]) > MAX_ROWS else ""
        caption = (f"*{escape(source)}，{escape(device_words(bench['device_name']))}：每步 "
                   f"{escape(bench['micro_batch'])} × {escape(bench['seq_len'])} 个 token，词表 {bench['vocab_size']:,}"
                   f"{shape}；{left}每行 {escape(bench.get('repeats', 1))} 次交替重复的中位数 [范围]（预热 "
                   f"{escape(bench.get('warmup', '—'))} 步、计时 {escape(bench.get('steps', '—'))} 步）。*")
        head = ["行（↳：与默认配置比，其余与上一行比）", "token/s：中位数 [范围]（×）", *(h for h, _ in extra)]
        return Markdown(f"{caption}\n\n{table(head, rows)}")
    except FIELD_ERRORS as e:
        return Markdown(f"（{escape(source)} 读不成 gpt_bench.py 的阶梯：{escape(repr(e))}）")


# ----------------------------------------------------------------------------- several runs against the first

# flags that change where a run writes or what it prints, never what it measures
NOT_A_CHANGE = {"out_dir", "argv", "metrics_out", "force", "cache_dir", "compile_cache", "no_download", "log_every",
                "sample_tokens", "ckpt_every", "keep_checkpoints", "profile"}


def settings(run):
    """A run's flags (args.json) and the accelerations and optimizer its metrics.json names, one level deep."""
    named = {k: run.metrics[k] for k in ("accelerations", "optimizer") if k in run.metrics}
    flat = {f"{k}.{n}": v for k, value in named.items() if isinstance(value, dict) for n, v in value.items()}
    return run.args | flat | {k: v for k, v in named.items() if not isinstance(v, dict)}


def changes(run, base):
    """What `run` set otherwise than `base`, as `flag: base's → its`."""
    mine, theirs = settings(run), settings(base)
    return "；".join(f"`{escape(k, code=True)}`: {fmt(theirs.get(k))} → {fmt(v)}" for k, v in sorted(mine.items())
                    if theirs.get(k) != v and k not in NOT_A_CHANGE) or "（与基线相同）"


def loss_clock(run):
    """[(seconds since the job started, train loss)]: the steps' end times from the events where kept (else the
    loop's seconds spread evenly over its steps), after the seconds before the loop (metrics' phases)."""
    m = run.metrics
    phases = list((m.get("phases") or {}).items())
    before = sum(s for name, s in phases[:[n for n, _ in phases].index("loop")]) if "loop" in dict(phases) else 0
    per_step = m["train_seconds"] / max(1, m["steps"])
    walls = dict(run.scalars.get("time/loss/train", []))
    curve = run.scalars.get("loss/train") or m.get("loss_curve") or []
    if walls and curve and curve[0][0] in walls:
        first = curve[0][0]
        return [(before + first * per_step + walls[s] - walls[first], loss) for s, loss in curve if s in walls]
    return [(before + s * per_step, loss) for s, loss in curve]


def compare_table(runs, jobs):
    """GPT runs (the first the baseline) and their job seconds: what each changed -> its effect."""
    base = runs[0].metrics
    rows = []
    for run, job in zip(runs, jobs):
        m, clock = run.metrics, loss_clock(run)
        below = next((f"{t:.0f} s" for t, loss in clock if loss < SUCCESS_LOSS), "未达到")
        peak = m.get("peak_memory_gib") or max((v for _, v in run.scalars.get(
            "system/gpu_max_memory_allocated_GiB", [])), default=None)
        name = "（基线）" if run is runs[0] else changes(run, runs[0])
        rows.append([f"`{escape(run.events.name, code=True)}`", name, f"{m['tokens_seen']:,}", seconds(job), below,
                     f"{m['final_train_loss']:.2f} / {m['final_val_loss']:.2f}",
                     f"{m['tokens_per_second']:,.0f}（×{m['tokens_per_second'] / base['tokens_per_second']:.2f}）",
                     fmt(peak, ".2f")])
    return table(["运行", "相对基线的改动", "token", "作业进程", "训练损失首次 < 7", "训练 / 验证损失",
                  "token/s（× 基线）", "峰值显存 GiB"], rows)


def lenet_table(runs, jobs):
    """LeNet-5 runs (the first the baseline): what each changed -> accuracy and time."""
    base = runs[0].metrics["train_seconds"]
    rows = []
    for run, job in zip(runs, jobs):
        m = run.metrics
        name = "（基线）" if run is runs[0] else changes(run, runs[0])
        rows.append([f"`{escape(run.events.name, code=True)}`", name, str(m["epochs"]), f"{m['test_accuracy']:.2%}",
                     f"{m['train_seconds']:.1f} s（×{m['train_seconds'] / base:.2f}）", seconds(job)])
    return table(["运行", "相对基线的改动", "epoch", "测试准确率", "训练循环（× 基线）", "作业进程"], rows)


def compare_figure(runs, path):
    """Train loss against the job's clock, one line a run."""
    plot_lines(path, [("train loss (nats/token)", {run.events.name: loss_clock(run) for run in runs},
                       "seconds since the job started")], "GPT runs compared",
               hline=(0, SUCCESS_LOSS, f"goal: loss < {SUCCESS_LOSS:g}"))
    return [f"![GPT runs compared]({path.name})"]
