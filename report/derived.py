"""The inputs a report shows, and the facts its captions read that no single JSON holds: which run each
section shows and where its events are, each run's process time, the nvidia-smi windows, whether the
job-clock and profile figures have anything to draw. Everything from the inputs; absent means absent.

    shown_runs(by_kind, results, committed) {kind: the run a section shows: named, else the committed one}
    derived_sources(inputs)                 {source name: (facts, where from)} beside the JSON files'
    job_rows(inputs) / profile_rows(inputs) what figures job_seconds.png and step_profile.png draw
"""
import re

from report import clock, facts
from report.figures import busy_window, gpu_name
from report.gpu import pick
from report.inputs import events_beside, figure_name, rel, result_name

RUN_PREFIXES = ("gpt_run", "lenet_run")
SMI = {"smi_gpt": r"(nvidia-)?smi-gpt.*\.csv", "smi_lenet": r"(nvidia-)?smi-lenet.*\.csv"}  # as gpu.GPU_SLOTS


def shown_runs(by_kind, results, committed=True):
    """{kind: {"metrics", "stem", "source", "events"}}: the run named on the command line, else (where
    `committed`) the committed run facts.ALIASES names (its events only where kept beside its JSON)."""
    shown = {}
    for alias, (kind, default) in facts.ALIASES.items():
        run = by_kind.get(kind)
        if run:
            shown[kind] = {"alias": alias, "metrics": run["metrics"], "stem": None, "events": run["dir"],
                           "source": f"{rel(run['dir'])}/metrics.json", "path": None}
            continue
        key = next((k for k in results if result_name(k) == default), None) if committed else None
        if key:
            data, path = results[key]
            shown[kind] = {"alias": alias, "metrics": data, "stem": default, "events": events_beside(path),
                           "source": rel(path), "path": path}
    return shown


def steps_for(path, inputs):
    """The GPU folder's step times, for a run whose JSON lies in that folder (or is one of its
    results.json's entries); {} for any other run: a CPU run is never timed by a GPU folder's log."""
    gpu = inputs["gpu"]
    if not gpu or path is None:
        return {}
    inside = str(path).startswith(str(gpu["folder"])) or str(path).startswith(rel(gpu["folder"]))
    return clock.step_seconds(gpu) if inside else {}


def label(stem, metrics):
    """A run's row name: what ran (LeNet-5 or GPT and the file's own tag: 12M-cold, tiny, ...) and where."""
    device = metrics.get("device_name") or metrics.get("device", "?")
    kind = "LeNet-5" if "test_accuracy" in metrics else "GPT"
    tag = re.sub(r"^(gpt|lenet)_run_|(_standin)?_(h200|cpu)$", "", stem) if stem else "your run"
    return f"{kind} {tag} · {device}"


def run_results(results):
    """(figure name, stem, metrics, path) of every committed run JSON."""
    for key, (data, path) in sorted(results.items()):
        if result_name(key).startswith(RUN_PREFIXES) and isinstance(data, dict):
            yield figure_name(key, results), result_name(key), data, path


def job_rows(inputs):
    """[(label, [(phase, seconds)])] for job_seconds.png: the runs shown, then (the team's report) every
    committed run, each with phases or a process time; a run without either is left out (said in the text)."""
    rows, seen = [], set()
    candidates = [(run["stem"], run["metrics"], run["path"]) for run in inputs["shown"].values()]
    if not inputs["named"]:
        candidates += [(stem, data, path) for _, stem, data, path in run_results(inputs["results"])]
    for stem, metrics, path in candidates:
        if stem in seen and stem is not None:
            continue
        seen.add(stem)
        seconds, _ = clock.process_time(stem, metrics, steps_for(path, inputs))
        segments = clock.bar_segments(metrics, seconds)
        if segments:
            rows.append((label(stem, metrics), segments))
    return sorted(rows, key=lambda row: "CPU (" not in row[0])  # the CPU's runs, then the GPU's


def rung_label(name):
    """A ladder row's short name for a figure: the naive baseline, gpt_train's default, or the row's own."""
    if name.startswith("naive"):
        return "naive (HF model, fp32, eager attention, dropout 0.1)"
    if "gpt_train.py default" in name:
        return "gpt_train.py's default step"
    return name.strip().split(" (")[0][:40]


def profile_rows(inputs):
    """[(label, groups, step seconds)] for step_profile.png: the ladder rows with a `profile` (the same model and
    batch, so their seconds compare), else the GPT run shown, where it was run with --profile."""
    rows = []
    entries = [] if inputs["named"] else [(result_name(k), d) for k, (d, _) in sorted(inputs["results"].items())
                                          if result_name(k).startswith("gpt_bench") and isinstance(d, dict)]
    for stem, bench in entries:
        for rung in bench.get("rungs") or []:
            profile = rung.get("profile") if isinstance(rung, dict) else None
            if isinstance(profile, dict) and isinstance(profile.get("groups"), dict):
                rows.append((f"{rung_label(rung['name'])}, {bench.get('device_name')}, {bench.get('micro_batch')} x "
                             f"{bench.get('seq_len')}", profile["groups"], profile.get("step_seconds") or 0.0))
    gpt = inputs["shown"].get("gpt")
    profile = gpt and gpt["metrics"].get("profile")
    if not rows and isinstance(profile, dict) and isinstance(profile.get("groups"), dict):
        rows.append((f"GPT run {label(gpt['stem'], gpt['metrics'])}", profile["groups"],
                     profile.get("step_seconds") or 0.0))
    return [r for r in rows if all(isinstance(v, (int, float)) for v in r[1].values())]


def smi_sources(gpu):
    """smi_gpt / smi_lenet: the busy window of the GPU folder's nvidia-smi CSV for each, where there is one."""
    if not gpu or gpu["damage"]:
        return {}
    files, out = gpu["files"], {}
    for source, pattern in SMI.items():
        name = pick(files, pattern)
        window = busy_window(files[name]()) if name else {}
        if window:
            out[source] = (window | {"csv": name, "device": gpu_name(files), "folder": rel(gpu["folder"])},
                           f"{rel(gpu['folder'])}/{name}")
    return out


def derived_sources(inputs):
    """The facts beside the JSON files': <alias>_clock and <run>_clock (process times), lenet_tb / gpt_tb
    (the events screenshotted), <ladder>_ratio (rows over rows), gpt_goal (when the loss fell below 7),
    gpu_folder, smi_gpt / smi_lenet, gpu_nvml, job_clock, step_profile."""
    sources = {}
    for kind, run in inputs["shown"].items():
        steps = steps_for(run["path"], inputs)
        sources[f"{run['alias']}_clock"] = (clock.clock_source(run["stem"], run["metrics"], steps), run["source"])
        if run["events"]:
            sources[f"{run['alias']}_tb"] = ({"source": rel(run["events"])}, rel(run["events"]))
    for name, stem, data, path in run_results(inputs["results"]):
        sources[f"{name}_clock"] = (clock.clock_source(stem, data, steps_for(path, inputs)), rel(path))
    for key, (data, path) in inputs["results"].items():
        if result_name(key).startswith("gpt_bench") and isinstance(data, dict):
            sources[f"{figure_name(key, inputs['results'])}_ratio"] = (ladder_ratios(data), rel(path))
    if "gpt" in inputs["shown"]:
        sources["gpt_goal"] = (goal_facts(inputs["shown"]["gpt"]["metrics"]), inputs["shown"]["gpt"]["source"])
    gpu = inputs["gpu"]
    if gpu and not gpu["damage"]:
        sources["gpu_folder"] = ({"folder": rel(gpu["folder"]), "device": gpu_name(gpu["files"])}, rel(gpu["folder"]))
    sources.update(smi_sources(gpu))
    nvml = [r for r in inputs["by_kind"].values() if r["scalars"].get("gpu/utilization_percent")]
    if nvml:
        sources["gpu_nvml"] = ({"runs": len(nvml)}, ", ".join(rel(r["dir"]) for r in nvml))
    if inputs["job_rows"]:
        sources["job_clock"] = ({"runs": len(inputs["job_rows"])}, "job_seconds.png")
    if inputs["profile_rows"]:
        sources["step_profile"] = ({"rows": len(inputs["profile_rows"])}, "step_profile.png")
    return sources


def ladder_ratios(bench):
    """{"i": {"j": tokens/s of row i over row j}}: what one acceleration gained over another row."""
    speeds = {str(i): r.get("tokens_per_second") for i, r in enumerate(bench.get("rungs") or [])
              if isinstance(r, dict) and isinstance(r.get("tokens_per_second"), (int, float))}
    return {i: {j: a / b for j, b in speeds.items() if j != i and b} for i, a in speeds.items()}


def goal_facts(metrics):
    """When the GPT run's training loss first fell below the lab's goal, as a sentence (and the number)."""
    from training.metrics import SUCCESS_LOSS
    per_step = metrics.get("tokens_seen", 0) / max(1, metrics.get("steps") or 1)
    first = next((step for step, loss in metrics.get("loss_curve") or [] if loss < SUCCESS_LOSS), None)
    final = metrics.get("final_train_loss")
    verdict = (f"< {SUCCESS_LOSS:g}，达到目标" if isinstance(final, (int, float)) and final < SUCCESS_LOSS
               else f"未达到 < {SUCCESS_LOSS:g} 的目标")
    if first is None:
        return {"verdict": verdict, "text": f"训练损失的记录点没有一个低于 {SUCCESS_LOSS:g}"}
    tokens = first * per_step
    return {"tokens": tokens, "verdict": verdict,
            "text": f"训练损失在约 {tokens / 1e6:.2g}M 个 token（第 {first} 步）时首次低于 {SUCCESS_LOSS:g}"}
