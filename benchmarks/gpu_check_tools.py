"""What benchmarks/gpu_check.sh needs Python for once its steps run, one command a function (the standard
library and data/files.py only; what runs before the first step: gpu_check_prep.py).

    python benchmarks/gpu_check_tools.py facts WORK GPU NVCC ...           results.json's head: what ran where
    python benchmarks/gpu_check_tools.py record WORK STEP STATUS SECONDS  one step's entry (any bytes)
    python benchmarks/gpu_check_tools.py results WORK OUT.json            every step's status and results
    python benchmarks/gpu_check_tools.py clock WORK METRICS.json T0 T1    a run's shell wall time beside its clock
    python benchmarks/gpu_check_tools.py compile-ab WORK TOKENS GPU       compile off vs regional, cold and warm
    python benchmarks/gpu_check_tools.py gpt-verdict M.json REHEARSE      train loss < 7, GradScaler's skips
    python benchmarks/gpu_check_tools.py plan PLAN ONLY BUDGET RESERVE    what fits the budget, what is cut
    python benchmarks/gpu_check_tools.py summary | second-call | all-ok   the end: the second call, exit 0 if done
"""
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.files import write_json

COMMANDS = "facts record results clock compile_ab gpt_verdict plan summary second_call all_ok"


def fail(message):
    print(one_line(message, 400))
    return 1


def one_line(text, limit=300):
    """A message as one line of text: tabs, newlines and carriage returns (progress bars) as spaces."""
    return re.sub(r"[\t\r\n]+", " ", text).strip()[:limit]


def from_argv(text):
    """An argument as text whatever its bytes: what is not UTF-8 becomes U+FFFD, never an error."""
    return os.fsencode(text).decode("utf-8", "replace")


def append(path, entry):
    """One JSON line (WORK/steps.jsonl, WORK/clocks.jsonl): no byte of a message breaks the file."""
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def read_lines(path, name):
    """The entries of a JSON-lines file; a line that does not parse (a write cut by a kill) is said, not fatal."""
    out = []
    for line in path.read_bytes().decode("utf-8", "replace").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({name: None, "status": "unreadable entry: " + one_line(line, 100), "seconds": None})
    return out


def record(work, step, status, seconds):
    append(Path(work) / "steps.jsonl",
           {"step": step, "status": one_line(from_argv(status), 400), "seconds": int(seconds) if seconds else None})


def steps_of(work):
    return read_lines(Path(work) / "steps.jsonl", "step")


def results(work, out):
    """results.json: the run's facts, an entry per step in order (status, seconds), an interruption if
    there was one, and every JSON result the steps wrote, by file name."""
    work = Path(work)
    facts = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    if (work / "interrupted").exists():
        facts["interrupted"] = (work / "interrupted").read_text().strip()
    found = {}
    for path in sorted((work / "results").glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a step cut while writing: say so, keep the rest
            found[path.stem] = {"unreadable": str(e)}
    write_json(out, {**facts, "steps": steps_of(work), "clocks": read_lines(work / "clocks.jsonl", "run"),
                     "results": found})


def facts(work, gpu, nvcc, source, docs, budget, rehearse, argv, python, torch, torch_cuda):
    """WORK/facts.json, results.json's head: what ran where (torch's versions as the shell read them)."""
    write_json(Path(work) / "facts.json", {
        "gpu": gpu, "rehearsal": rehearse == "1", "budget_seconds": int(budget),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
        "interpreter": python, "command": "bash benchmarks/gpu_check.sh " + from_argv(argv), "torch": torch,
        "torch_cuda": torch_cuda or None, "nvcc": nvcc or None,
        # what the corpus is, not what it is called: a stand-in must never be quoted as WOS
        "corpus": {"source": from_argv(source), "documents": int(docs)}})


def clock(work, metrics, started, ended):
    """A run's wall time as the shell measured it (fork to exit) beside its metrics' own process_seconds and
    phases, into WORK/clocks.jsonl (results.json's `clocks`): a grader's clock and the run's should agree
    within a second (the interpreter's exit is the difference)."""
    wall = float(ended) - float(started)
    try:
        m = json.loads(Path(metrics).read_text())
    except (OSError, ValueError):
        m = {}
    process = m.get("process_seconds")
    entry = {"run": Path(metrics).stem, "shell_wall_seconds": round(wall, 3), "process_seconds": process,
             "process_seconds_total": m.get("process_seconds_total"), "train_seconds": m.get("train_seconds"),
             "phases": m.get("phases"), "agree_within_1s": process is not None and abs(wall - process) <= 1.0,
             # the report quotes process_seconds (report/facts.py); the shell's is the job's, CUDA's teardown
             # after os._exit included: a gap over 1 s here says the report's figure is short by it
             "report_quotes": "process_seconds"}
    append(Path(work) / "clocks.jsonl", entry)
    print(f"clock: {entry['run']}: {wall:.2f} s from the shell, process_seconds {process} (quoted by the report; "
          f"{'they agree within 1 s' if entry['agree_within_1s'] else 'they DISAGREE by over 1 s'})")
    return 0


AB_KEYS = ("process_seconds", "compile_seconds", "train_seconds", "tokens_per_second")


def compile_ab(work, tokens, gpu):
    """results/compile_ab_GPU.json: every compile off / regional run so far, cold (fresh compile and
    micro-batch caches) and warm (a cold run's caches again), its seconds, and per cell the medians:
    does compile pay for the graded run, first and later?"""
    work = Path(work)
    clocks = {c["run"]: c.get("shell_wall_seconds") for c in read_lines(work / "clocks.jsonl", "run")}
    names = {f"{tokens}-own-vocab-cold": "off-cold-1", f"{tokens}-own-vocab-regional-compile-cold": "regional-cold-1"}
    cells = {}
    for path in sorted((work / "results").glob(f"gpt_run_{tokens}-own-vocab-*_{gpu}.json")):
        name = path.stem.removeprefix("gpt_run_").removesuffix(f"_{gpu}")
        run = names.get(name) or name.removeprefix(f"{tokens}-own-vocab-ab-")
        if run.count("-") != 2 or not run.startswith(("off-", "regional-")):
            continue
        m = json.loads(path.read_text())
        mode, state, _ = run.split("-")
        cells.setdefault(f"{mode}_{state}", []).append({"run": path.stem, **{k: m.get(k) for k in AB_KEYS},
                                                         "shell_wall_seconds": clocks.get(path.stem)})
    def med(runs, key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None
    median = {cell: {k: med(runs, k) for k in ("process_seconds", "shell_wall_seconds", "compile_seconds")}
              for cell, runs in cells.items()}
    out = {"gpu": gpu, "tokens": tokens, "runs": cells, "median": median, "report_quotes": "process_seconds"}
    write_json(work / "results" / f"compile_ab_{gpu}.json", out)
    print("compile A/B, median process seconds: " + ", ".join(f"{c} {v['process_seconds']} ({len(cells[c])} runs)"
                                                             for c, v in sorted(median.items())))
    return 0


def gpt_verdict(metrics, rehearsal="0"):
    """The lab's criterion (train loss < 7) and the steps GradScaler skipped, from a run's metrics."""
    m = json.loads(Path(metrics).read_text())
    skipped = m.get("skipped_steps")
    said = (f"{skipped} of {m['steps']} steps skipped by GradScaler" if skipped is not None
            else "skipped steps not in gpt_train's metrics")
    print(f"{m.get('precision', '?')}: train loss {m['final_train_loss']:.3f} "
          f"({'below' if m['success'] else 'NOT below'} 7), {said}")
    return 0 if m["success"] or rehearsal == "1" else 1


# ----------------------------------------------------------------------------- the plan

NEEDS = {"cuda-tests": "build", "gelu-bench": "build", "lenet-cpp": "build", "gpt-own-vocab": "tokenizer",
         "gpt-own-vocab-regional-compile": "tokenizer", "gpt-own-vocab-fp16": "tokenizer",
         "compile-ab": "tokenizer gpt-own-vocab gpt-own-vocab-regional-compile"}  # warm: their caches again
LEASE_SECONDS = 15 * 60  # a lent machine's time, all calls together
START_SECONDS = 120  # what starting it took of that (one to two minutes)
MARGIN_SECONDS = 30  # the transfers and the warm wait between calls


def parse_plan(text):
    """'step expected cap|...' -> [(step, expected seconds (0: beside the others), estimated?)]."""
    return [(step, int(expected.lstrip("~")), expected.startswith("~"))
            for step, expected, _ in (item.split() for item in text.split("|"))]


def plan(text, only, budget, reserve=30):
    """The plan line: in order, what fits the budget (less the report's reserve) at the H200's expected
    seconds, the step the budget runs out in (cut there, or the ladder as far as it goes), and what is left
    for the second call that the last line gives."""
    fits, cut, used, room = [], [], 0, int(budget) - int(reserve)
    for step, expected, estimated in parse_plan(text):
        if step not in only.split() or step == "report":
            continue
        said = f"{step} {'beside' if expected == 0 else ('~' if estimated else '') + str(expected)}"
        if used + expected <= room and not cut:
            fits.append(said)
        elif not cut and room - used >= 30:
            fits.append(f"{step} (cut after ~{room - used} of ~{expected} s)")
            cut.append(f"{step}'s rest")
        else:
            cut.append(step)
        used += expected
    print(f"plan for a budget of {budget} s (one call on the lent H200: its 15 device-minutes less 1-2 to start; "
          f"seconds each as measured there on 2026-11-30, ~ estimated): {', '.join(fits)}, report; "
          + (f"cut, for a second call: {', '.join(cut)}" if cut else "nothing cut"))


def summary(work, out):
    steps = steps_of(work)
    ok = sum(s["status"] == "ok" for s in steps)
    print(f"done: {ok} steps ok, {len(steps) - ok} not; OUT: {' '.join(sorted(p.name for p in Path(out).iterdir()))}")


def settled(entry):
    """ok, not asked, or a ladder cut by the budget (its design: the rows done are its result)."""
    status = entry["status"]
    return status == "ok" or status.startswith("skipped: not asked") or (
        entry["step"] == "ladder" and status.startswith("cut at"))


def second_call(work, text, elapsed, from_arg, rehearsal, out=None):
    """The exact command for what was cut or failed, in the plan's order, sized to the warm machine's
    remaining minutes (the lease less its start, this call and a margin); the ladder takes the rest."""
    steps = steps_of(work)
    status = {s["step"]: s["status"] for s in steps}
    again = [s["step"] for s in steps if not settled(s) or s["status"].startswith("cut")]  # a cut ladder too
    for step in list(again):  # what a step needs comes along (the build: unless this call made it)
        again += [s for s in NEEDS.get(step, "").split() if s not in again]
    again = [s for s in again if not (s == "build" and status.get(s) == "ok")]
    if not [s for s in again if s != "report"]:
        print("second call: none needed (every step asked for is done)")
        return 0
    left = LEASE_SECONDS - START_SECONDS - int(elapsed) - MARGIN_SECONDS
    budget = min(540, left)
    chosen, need = [], 30  # the report's
    for step, expected, _ in parse_plan(text):  # the ladder last: it takes what the others leave
        if step in again and step not in ("report", "ladder") and need + expected <= budget:
            chosen.append(step)
            need += expected
    if "ladder" in again and budget - need >= 60:
        chosen.append("ladder")
    chosen.append("report")
    base = "bash benchmarks/gpu_check.sh " + ("--rehearse " if rehearsal == "1" else "")
    base += (from_arg + " " if from_arg else "") + f"--out {out or 'OUT-2'}"
    if budget < 90:
        print(f"second call: no room on this machine (about {max(left, 0)} s of its lease left); on the next: "
              f"{base} --budget 520 --only " + ",".join(s for s, _, _ in parse_plan(text)
                                                         if s in again or s == "report"))
    else:
        print(f"second call (about {left} s of this machine's lease left): {base} --budget {budget} "
              f"--only {','.join(chosen)}")
    return 0


def all_ok(work):
    return 0 if all(settled(s) for s in steps_of(work)) else 1


if __name__ == "__main__":  # gpu_check_tools.py COMMAND ARGS: the function of that name, dashes for underscores
    command = sys.argv[1].replace("-", "_")
    sys.exit(globals()[command](*sys.argv[2:]) if command in COMMANDS.split() else f"unknown command {sys.argv[1]}")
