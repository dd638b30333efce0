"""The job's clock: how long each run's process took and where its seconds went, and the grouped
one-step profile; read from the inputs, never estimated.

    step_seconds(gpu)               {step name: (seconds, log)} of a GPU folder's step log or results.json
    process_time(stem, m, steps)    (seconds, how it was measured) of one run (all its processes where it was
                                    resumed), or (None, why there is none)
    clock_source(stem, m, steps)    the facts report.md's `{{<alias>_clock.…}}` placeholders read
    phases_figure(runs, path)       one stacked bar per run: its phases, the training loop marked
    profile_figure(rows, path)      the one-step profile's groups, side by side for each row

Where a run's seconds come from, best first: its metrics' `process_seconds` (the whole process, from the
OS's record of its start to after its last output) and `phases`; else the step that ran it in a GPU
folder (gpu_check.sh's results.json `steps`, or the first H200 folder's `steps_call*.log`, whole
seconds); else nothing, said. The older metrics' `total_seconds` is never called the job's time: it
started after the imports and stopped before the final model was written.
"""
import re
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLOURS = {"startup": "#636363", "imports": "#8c6d31", "inputs": "#bdbdbd", "data": "#9ecae1",
                 "model": "#3182bd", "compile": "#fdae6b", "loop": "#d62728", "evaluation": "#74c476",
                 "sampling": "#c7e9c0", "checkpoints": "#bcbddc", "final_save": "#756bb1", "logging": "#e7ba52",
                 "teardown": "#252525", "outside the loop": "#e0e0e0",
                 "earlier processes": "#fcbba1"}
PROFILE_GROUPS = ("matmul", "attention", "elementwise", "loss", "optimizer", "communication", "data", "idle")
STEP_LINE = re.compile(r"^\[(\d+)\s*s\]\s+(.*)$")
STEP_END = re.compile(r"^([\w.-]+):? rc=(-?\d+)")
STEP_START = re.compile(r"^([\w.-]+): start\b")


def log_steps(text, log):
    """{step: (seconds, log)} of a `[12s] name: start` / `[40s] name: rc=0` log; a step without its own
    start line began at the line before its end (the second H200 call's format)."""
    found, starts, previous = {}, {}, None
    for line in text.splitlines():
        match = STEP_LINE.match(line.strip())
        if not match:
            continue
        at, what = int(match.group(1)), match.group(2)
        if start := STEP_START.match(what):
            starts[start.group(1)] = at
        elif (end := STEP_END.match(what)) and end.group(2) == "0":
            begun = starts.pop(end.group(1), previous)
            if begun is not None:
                found[end.group(1)] = (at - begun, log)
        previous = at
    return found


def step_seconds(gpu):
    """{step name: (seconds, the file they come from)} of a GPU results folder: results.json's steps
    that ended ok (gpu_check.sh), else its steps_call*.log files, later calls winning."""
    if not gpu or gpu["damage"]:
        return {}
    files, found = gpu["files"], {}
    for name in sorted(n for n in files if re.fullmatch(r"steps_call\d+\.log", n)):
        found.update(log_steps(files[name](), name))
    for entry in gpu.get("steps") or []:
        if isinstance(entry, dict) and entry.get("status") == "ok" and isinstance(entry.get("seconds"), int):
            found[str(entry.get("step"))] = (entry["seconds"], "results.json")
    return found


def run_step(stem, steps):
    """The step of a GPU folder that ran the run `stem` (gpt_run_12M-cold_standin_h200 was the step
    gpt-12M-cold, lenet_run_torch_h200 lenet-torch): the longest step name, less its kind, found in the
    run's own name part; a `_callN` run only from that call's log."""
    parts = stem.split("_")
    if len(parts) < 3 or parts[1] != "run":
        return None
    kind, own, call = parts[0], parts[2], re.search(r"_call(\d+)$", stem)
    best = None
    for step, (seconds, log) in steps.items():
        bare = step.removeprefix(f"{kind}-")
        if step.split("-")[0] in ("gpt", "lenet") and not step.startswith(f"{kind}-"):
            continue
        if call and log != f"steps_call{call.group(1)}.log":
            continue
        if bare and bare in own and (best is None or len(bare) > len(best[0])):
            best = (bare, seconds, log, step)
    return best


def resumed_seconds(metrics):
    """The seconds of a resumed run's earlier processes (process_seconds_total less this process's), else 0."""
    total, here = metrics.get("process_seconds_total"), metrics.get("process_seconds")
    if isinstance(total, (int, float)) and isinstance(here, (int, float)) and total > here + 0.05:
        return total - here
    return 0.0


def process_time(stem, metrics, steps):
    """(seconds, how) of one run's whole process (a resumed run's: all its processes), or (None, why none
    was recorded)."""
    if isinstance(metrics.get("process_seconds"), (int, float)):
        if resumed_seconds(metrics):  # its loop time counts every process: so must its process time
            return metrics["process_seconds_total"], "metrics.json 的 process_seconds_total（续跑：所有进程之和）"
        if metrics.get("resumed") and not isinstance(metrics.get("process_seconds_total"), (int, float)):
            return None, "未记录（续跑的运行没有可用的 process_seconds_total；process_seconds 只是最后一个进程的）"
        return metrics["process_seconds"], "metrics.json 的 process_seconds"
    found = run_step(stem, steps) if stem else None
    if found:
        _, seconds, log, step = found
        return float(seconds), f"步骤日志 `{log}` 中的进程时间，整秒"
    return None, "未记录（metrics.json 中没有 process_seconds：早于该字段的代码）"


def clock_source(stem, metrics, steps):
    """The facts of `{{gpt_clock.…}}` / `{{lenet_clock.…}}`: process_text always (a number and how it was
    measured, or why there is none), process_seconds and outside_loop_seconds only where measured."""
    seconds, how = process_time(stem, metrics, steps)
    loop = metrics.get("train_seconds")
    facts = {"how": how, "process_text": f"{seconds:.0f} s（{how}）" if seconds is not None else how}
    if seconds is not None:
        facts["process_seconds"] = seconds
        if isinstance(metrics.get("total_seconds"), (int, float)):  # the older in-process span, for contrast
            facts["over_total_seconds"] = seconds - metrics["total_seconds"]
        if isinstance(loop, (int, float)) and seconds >= loop:  # less: inputs that disagree, never a negative
            facts["outside_loop_seconds"] = seconds - loop
            facts["loop_share"] = loop / seconds if seconds else None
    return facts


def bar_segments(metrics, seconds):
    """[(phase, seconds)] of one run: its `phases` where it has them, else the loop and the rest of the
    process (the process time from a step log), else None."""
    phases = metrics.get("phases")
    if seconds is None and metrics.get("resumed"):  # its earlier processes unknown: no bar rather than a part
        return None
    if isinstance(phases, dict) and phases and all(isinstance(v, (int, float)) for v in phases.values()):
        earlier = resumed_seconds(metrics)  # a resumed run: its earlier processes, then this one's phases
        return ([("earlier processes", earlier)] if earlier else []) + list(phases.items())
    loop, compiling = metrics.get("train_seconds"), metrics.get("compile_seconds")
    if seconds is None or not isinstance(loop, (int, float)):
        return None
    compiling = compiling if isinstance(compiling, (int, float)) and 0 < compiling <= loop else 0.0
    inside = [("compile", compiling)] if compiling >= 0.5 else []  # the loop's first step, where it compiled
    return inside + [("loop", loop - (compiling if inside else 0.0)),
                     ("outside the loop", max(0.0, seconds - loop))]


def phases_figure(runs, path):
    """runs: [(label, [(phase, seconds)])]; one horizontal stacked bar each (sums, not a timeline), the training
    loop hatched: its steps and its first step's compile."""
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(runs) + 1.8))
    seen, longest = set(), max(sum(s for _, s in segments) for _, segments in runs)
    for i, (label, segments) in enumerate(runs):
        left = 0.0
        for phase, seconds in segments:
            if seconds < 0.005 * longest:
                continue  # not drawn, not in the legend
            colour = PHASE_COLOURS.get(phase, "#dddddd")
            looping = phase in ("loop", "compile")
            ax.barh(i, seconds, left=left, color=colour, edgecolor="black" if looping else "white",
                    hatch="//" if looping else None, linewidth=0.6,
                    label=None if phase in seen else phase)
            seen.add(phase)
            left += seconds
        ax.text(left, i, f" {left:.0f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)), [label for label, _ in runs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.1)  # room for each bar's total
    ax.set_xlabel("seconds of the process, summed by phase (hatched: training loop, with its compile)")
    ax.set_title("Where the job's seconds go", fontsize=10)
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_figure(rows, path):
    """rows: [(label, {group: seconds}, step_seconds)]: each row's one step split into PROFILE_GROUPS, in
    seconds on one axis (the rows are one model and batch: what an acceleration removed is the shorter bar)."""
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.6))
    colours = plt.get_cmap("tab10")
    longest = max(sum(groups.values()) for _, groups, _ in rows) or 1.0
    for i, (label, groups, step) in enumerate(rows):
        left = 0.0
        for j, group in enumerate(PROFILE_GROUPS):
            ax.barh(i, groups.get(group, 0.0), left=left, color=colours(j), label=group if i == 0 else None)
            left += groups.get(group, 0.0)
        ax.text(left + 0.01 * longest, i, f"{step:,.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [textwrap.fill(label, 44) for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.15)
    ax.set_xlabel("seconds of one training step (torch.profiler: operators' own time, by group)")
    ax.set_title("One training step, grouped", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="lower right")  # beside the shorter, later bars
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
