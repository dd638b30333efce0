"""A report's Jinja2 template (report.md's, student.md's) filled from results.md's inputs, and what is derived for
it (runs shown, GPU roles, ladders).

Each source is a name in the template: a results file by its figure name, an alias (`lenet`, `gpt`: the run named,
else ALIASES), a GPU role or a derived source; `{{ lenet.test_accuracy|f(".2%") }}` formats a field with Python's
format spec, `{{ x._source }}` is the file read, `{% if gpt %}` keeps a block where the source is. An unknown source
or field, a null or a list is a problem, never a blank; a string is filled in as text (inputs.escape), never as
Markdown."""
import re
import statistics
from dataclasses import replace

import jinja2

from report.figures import (
    busy_window,
    compare_table,
    device_words,
    gpu_runs_table,
    ladder_compare,
    ladder_report,
    lenet_table,
)
from report.gpu import LENET_CSV, ROLES, SLOTS, answer
from report.inputs import (
    FIELD_ERRORS,
    NUMBER,
    Markdown,
    Run,
    escape,
    events_beside,
    figure_name,
    rel,
    result_name,
    run_kind,
)
from training.metrics import SUCCESS_LOSS

# alias -> (run kind, what it follows when no run of that kind is named): the committed CPU run of the
# default LeNet-5 recipe (its events beside it), the GPU folders' graded GPT run (gpu.ROLES)
ALIASES = {"lenet": ("lenet5", "lenet_run_2x128_cpu"), "gpt": ("gpt", "gpu_gpt")}
CPU_LADDER = "gpt_bench_cpu_2x1024"  # the ladder at the lab's shape on the CPU, beside the GPU's
LIGHTNING_BENCH = "lenet_bench_cpu"  # the interleaved Lightning / plain repeats (their median is quoted)


def json_run(alias, data, path, kind=None, gpu=None):
    """The Run of a committed JSON file (its events beside it), or None where it holds no run."""
    if not isinstance(data, dict):
        return None  # (load_results lists it; nothing to show)
    events = events_beside(path)
    where = events and rel(events)
    return Run(alias, kind or run_kind(data), data, rel(path), path.stem, events, where, gpu)


def results_run(alias, results, name, kind=None):
    """The Run of the results file `name`, or None where there is none."""
    key = next((k for k in results if result_name(k) == name), None)
    return json_run(alias, *results[key], kind) if key else None


def role_runs(folders):
    """{role: Run} for each gpu.ROLES question the GPU folders answer."""
    roles = {}
    for role, pattern in ROLES.items():
        found, stem = answer(folders, pattern, results=True)
        if found and (run := json_run(role, found.results[stem], found.folder / f"{stem}.json", gpu=found)):
            roles[role] = run
    return roles


def shown_runs(by_kind, results, roles):
    """{kind: Run}: the run named on the command line, else what ALIASES follows in these inputs."""
    shown = {}
    for alias, (kind, default) in ALIASES.items():
        if run := by_kind.get(kind) or roles.get(default) or results_run(alias, results, default, kind):
            shown[kind] = replace(run, alias=alias)
    return shown


def process_seconds(metrics):
    """A run's whole process in seconds (a resumed run's: all its processes, process_seconds_total), or None."""
    seconds = metrics.get("process_seconds_total", metrics.get("process_seconds"))
    return seconds if isinstance(seconds, NUMBER) else None


def clock_facts(run):
    """`{{<alias>_clock.…}}`: process_text always (the time, or that there is none), process_seconds if measured."""
    if (seconds := process_seconds(run.metrics)) is None:
        return {"process_text": "未记录"}
    return {"process_text": f"{seconds:.0f} s", "process_seconds": seconds}


def gpu_sources(folders, roles):
    """smi_gpt / smi_lenet (busy windows), slot_*, gpu_notes (each folder that answered, with its note), gpu_runs."""
    sources, used = {}, [r.gpu for r in roles.values() if r.gpu]
    for name, pattern in (("smi_gpt", SLOTS["gpu_utilization.png"][1]), ("smi_lenet", LENET_CSV)):
        found, csv = answer(folders, pattern)
        if window := busy_window(found.files[csv]()) if found else {}:
            sources[name] = (window | {"csv": csv, "where": found.label}, f"{rel(found.folder)}/{csv}")
    for slot, (_, pattern, _) in SLOTS.items():
        found, name = answer(folders, pattern)
        if found:
            used.append(found)
            sources[f"slot_{slot.removesuffix('.png')}"] = {"file": name, "where": found.label}, rel(found.folder)
    if used := list({f.folder: f for f in used}.values()):
        notes = [f"> - **GPU（{f.label}）**：标注此项的数字测自 `{escape(rel(f.folder), code=True)}`，" + (
            escape(f.facts["note"]) if "note" in f.facts else "当前代码由 `benchmarks/gpu_check.sh` 一次测得") + "。"
                 for f in used]
        sources["gpu_notes"] = {"text": Markdown("\n".join(notes))}, ", ".join(rel(f.folder) for f in used)
    if gpt := roles.get("gpu_gpt"):
        runs = [(s, m, process_seconds(m)) for s, m in sorted(gpt.gpu.results.items())
                if s.startswith("gpt_run_") and not re.search(r"_call\d+$", s) and isinstance(m, dict)]
        sources["gpu_runs"] = ({"table": gpu_runs_table(runs, gpt.stem), "where": gpt.gpu.label}, rel(gpt.gpu.folder))
    return sources


def run_sources(results, shown, roles):
    """The results files by figure name, and the runs the aliases and GPU roles show, their clocks and events."""
    sources = {figure_name(key, results): (data, rel(path)) for key, (data, path) in results.items()}
    for run in [*roles.values(), *shown.values()]:
        where = run.gpu.label if run.gpu else device_words(run.metrics.get("device_name") or run.metrics.get("device"))
        data = run.metrics | {"where": where} if isinstance(run.metrics, dict) else run.metrics
        sources[run.alias] = data, run.source
        if run.kind:
            sources[f"{run.alias}_clock"] = clock_facts(run), run.source
        if run.events_source and run.alias in ALIASES:
            sources[f"{run.alias}_tb"] = {"source": run.events_source}, run.events_source
        if run.args:
            sources[f"{run.alias}_args"] = run.args, f"{run.events_source}/args.json"
    return sources


def goal_sources(shown):
    """gpt_goal: whether the GPT run reached the lab's goal, and when its training loss first fell below it;
    lenet_curve: the accuracy curve's points a TensorBoard screenshot shows."""
    sources = {}
    if gpt := shown.get("gpt"):
        m = gpt.metrics
        per_step = m.get("tokens_seen", 0) / max(1, m.get("steps") or 1)
        first = next((step for step, loss in m.get("loss_curve") or [] if loss < SUCCESS_LOSS), None)
        verdict = f"< {SUCCESS_LOSS:g}，达到目标" if m.get("success") is True else f"未达到 < {SUCCESS_LOSS:g} 的目标"
        text = (f"训练损失的记录点没有一个低于 {SUCCESS_LOSS:g}" if first is None else
                f"训练损失在约 {first * per_step / 1e6:.2g}M 个 token（第 {first} 步）时首次低于 {SUCCESS_LOSS:g}")
        sources["gpt_goal"] = {"verdict": Markdown(verdict), "text": Markdown(text)}, gpt.source
    if lenet := shown.get("lenet5"):
        m, epochs = lenet.metrics, max(1, lenet.metrics.get("epochs") or 1)
        train, test = (len(m.get(f"{k}_accuracy_curve") or []) / epochs for k in ("train", "test"))
        sources["lenet_curve"] = {"text": Markdown(f"每个 epoch `accuracy/train` {train:.0f} 个点、`accuracy/test` "
                                                   f"{max(1, test):.0f} 个点")}, lenet.source
    return sources


def bench_sources(results, roles):
    """ladder (the GPU's beside the CPU's), lenet_lightning (its repeats' median), bench (each ladder whole), gelu."""
    sources, named = {}, {result_name(key): entry for key, entry in results.items()}
    cpu, gpu = named.get(CPU_LADDER, (None,))[0], roles.get("gpu_ladder")
    if cpu or gpu:
        table = ladder_compare(gpu and gpu.metrics, cpu, gpu.gpu.label if gpu else None)
        sources["ladder"] = {"table": table}, "ladder"
    if (bench := named.get(LIGHTNING_BENCH, (None, None)))[0] and bench[0].get("all_lightning_to_plain"):
        ratios = sorted(bench[0]["all_lightning_to_plain"])  # one ratio per interleaved repeat
        sources["lenet_lightning"] = ({"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1],
                                       "repeats": len(ratios)}, f"{rel(bench[1])} (all_lightning_to_plain's median)")
    files = [(data, rel(path)) for data, path in results.values() if isinstance(data, dict)]
    if ladders := [(data, path) for data, path in files if isinstance(data.get("rungs"), list)]:  # each one whole
        sources["bench"] = {"text": Markdown("\n\n".join(ladder_report(*ladder) for ladder in ladders))}, \
            ", ".join(path for _, path in ladders)
    if gelu := next(((data, path) for data, path in files if "ext_ms" in data), None):
        sources["gelu"] = gelu[0] | {"where": device_words(gelu[0].get("device_name"))}, gelu[1]
    return sources


def named_sources(runs):
    """compare_gpt / compare_lenet5: the runs of a kind against the first named; gpu_nvml: runs with NVML curves."""
    sources = {}
    for kind, table in (("gpt", compare_table), ("lenet5", lenet_table)):
        if len(group := [run for run in runs if run.kind == kind]) > 1:
            table = table(group, [process_seconds(run.metrics) for run in group])
            sources[f"compare_{kind}"] = ({"table": table, "baseline": group[0].events_source, "runs": len(group)},
                                          ", ".join(run.events_source for run in group))
    if nvml := [r for r in runs if r.scalars.get("system/gpu_utilization_percent")]:
        sources["gpu_nvml"] = {"runs": len(nvml)}, ", ".join(r.events_source for r in nvml)
    return sources


def derived_sources(r, roles):
    """Every source a template may name (r: make_report's Report); what a file's wrong field stops, a problem."""
    sources = {}
    for name, part in (("the runs", lambda: run_sources(r.results, r.shown, roles)),
                       ("the goals", lambda: goal_sources(r.shown)), ("the GPU folders", lambda: gpu_sources(
                           r.folders, roles)), ("the benchmarks", lambda: bench_sources(r.results, roles)),
                       ("the comparison of the runs named", lambda: named_sources(r.runs))):
        try:
            sources |= part()
        except FIELD_ERRORS as e:
            r.problems.append(f"left out what {name} give: a field is missing or of the wrong type "
                              f"({type(e).__name__}: {e})")
    return sources


class Field:
    """A value of the inputs as a template reaches it (`gpt.steps`, `run.loss_curve.0`), with the file it came from."""

    def __init__(self, value, source, key):
        self.value, self.source, self.key = value, source, key

    def __getitem__(self, part):
        try:
            value = self.value[int(part)] if isinstance(self.value, list) else self.value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return Missing(f"{self.source} has no '{part}' in '{self.key}'", name=f"{self.key}.{part}")
        return Field(value, self.source, f"{self.key}.{part}")

    def __bool__(self):
        return bool(self.value)


class Fields(jinja2.Environment):
    """`x.name` is always the field `name` of the inputs, never an attribute of Field (its `source`, `key`)."""

    def getattr(self, obj, attribute):
        return obj[attribute] if isinstance(obj, Field) else super().getattr(obj, attribute)


class Missing(jinja2.ChainableUndefined):
    """A name or field the inputs do not have: false in `{% if %}`, a problem line where it is shown."""

    def __getattr__(self, part):
        if part.startswith("__"):
            raise AttributeError(part)
        return Missing(self._undefined_hint, name=f"{self._undefined_name}.{part}")

    def __getitem__(self, part):
        return self.__getattr__(str(part))


def fill(text, sources):
    """(the Jinja2 template `text` filled from `sources`, [problem], [(field, shown, source)]); a name or field that
    cannot be filled stays visible as `{{name}}` and is a problem. Values reach Markdown, then HTML, only through
    `shown`: escaped as text (a code span's with `|code`), never as markup."""
    problems, used = [], []

    def unfilled(name, why):
        problems.append(f"report placeholder {{{{{name}}}}}: {why}")
        return f"{{{{{name}}}}}"

    def shown(field, spec="", code=False):
        """`{{ x|f(".2%") }}`: the field's value formatted, a string of the inputs escaped as text."""
        if isinstance(field, Missing):
            name = field._undefined_name
            return unfilled(name, field._undefined_hint or f"no input named '{name.split('.')[0]}'")
        if not isinstance(field, Field):
            return field  # the template's own text
        value, key = field.value, field.key
        if value is None or isinstance(value, (list, dict)):
            what = f"a {type(value).__name__}, not one value" if value is not None else "null (missing or invalid)"
            return unfilled(key, f"{field.source}: '{key}' is {what}")
        try:
            text = format(value, spec) if spec or isinstance(value, (bool, str)) else \
                f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
        except (ValueError, TypeError) as e:
            return unfilled(key, f"format '{spec}' does not fit {value!r} ({e})")
        text = text if isinstance(value, Markdown) or not isinstance(value, str) else escape(text, code)
        used.append((f"{{{{{key}{':' * bool(spec)}{spec}}}}}", text, field.source))
        return Markdown(text)
    env = Fields(undefined=Missing, finalize=lambda v: v if isinstance(v, Markdown) else shown(v),
                 trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters |= {"f": shown, "code": lambda field: shown(field, code=True)}
    context = {name: Field(data | {"_source": source} if isinstance(data, dict) else data, source, name)
               for name, (data, source) in sources.items()}
    try:
        filled = env.from_string(text).render(context)
    except jinja2.TemplateError as e:
        return text, [f"report template: {type(e).__name__}: {e}"], []
    numbers = iter(range(1, 1000))  # the figures numbered in the order they are kept
    return re.sub(r"\n{3,}", "\n\n", re.sub("图 #", lambda m: f"图 {next(numbers)}", filled)), problems, used
