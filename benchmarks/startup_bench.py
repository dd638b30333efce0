"""The job's clock outside the training loop: each script run as a process, as a grader's `time` sees it,
today's code beside a baseline commit's in the same run, interleaved repeats, median and range.

    python benchmarks/startup_bench.py --metrics-out startup_bench_cpu.json                  # ~10 min on 2 cores
    python benchmarks/startup_bench.py --baseline 139e3cc --repeats 5 --cases tiny-20k,lenet-1-epoch

A case is a command; for each repeat, every case runs once per version (baseline, current), in turn, so that
drift on the machine hits both alike. Per run: the process's wall time (from the parent: fork to exit),
the training loop's own time from its metrics (`train_seconds`), and their difference, the seconds outside
the loop; the current code's runs also give their `process_seconds` and `phases`. The baseline is the
commit checked out into a temporary git worktree; both versions read the same inputs, each with a token
cache warmed by one untimed run (a student's second run, and the figure the goals are stated for).
"""
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import REPO, git
from training import device

SHARED = REPO.parent / "shared" / "data"
CASES = {  # name -> (script and flags; {text}, {tokenizer}, {mnist}, {cache}, {out} are filled in)
    "lab-1-step": ["gpt_train.py", "--text", "{text}", "--tokenizer", "{tokenizer}", "--cache-dir", "{cache}",
                   "--tokens", "1024", "--global-batch", "1", "--micro-batch", "1", "--val-batches", "1",
                   "--out-dir", "{out}", "--metrics-out", "{out}.json"],
    "tiny-20k": ["gpt_train.py", "--preset", "tiny", "--tokens", "20000", "--text", "{text}", "--tokenizer",
                 "{tokenizer}", "--cache-dir", "{cache}", "--out-dir", "{out}", "--metrics-out", "{out}.json"],
    "lenet-1-epoch": ["lenet5.py", "--device", "cpu", "--epochs", "1", "--data-dir", "{mnist}", "--no-download",
                      "--out-dir", "{out}", "--metrics-out", "{out}.json"],
}
GOALS = {"lab-1-step": 8.0, "tiny-20k": 4.0, "lenet-1-epoch": 3.0}  # seconds outside the loop (issue 34, quiet VM)


def build_parser():
    p = common.parser(__doc__, "write the results here as JSON (after every run)")
    p.add_argument("--baseline", default="139e3cc", help="the commit to compare with (default: %(default)s, the "
                   "code the job-clock issue measured)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default: %(default)s)")
    p.add_argument("--text", type=Path, default=SHARED / "wos-standin" / "X.txt", help="corpus (default: %(default)s)")
    p.add_argument("--tokenizer", default=str(SHARED / "gpt2-tokenizer"), help="(default: %(default)s)")
    p.add_argument("--mnist", type=Path, default=SHARED, help="MNIST's folder (default: %(default)s)")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    if not set(cases) <= set(CASES) or args.repeats < 1:
        p.error(f"--cases takes {', '.join(CASES)}; --repeats >= 1")
    common.check_metrics_out(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the baseline's checkout
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        tmp = Path(tmp)
        try:
            done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tmp / "baseline"),
                                   args.baseline], capture_output=True, text=True)  # its own data/cache: none shared
            if done.returncode:
                sys.exit(f"error: --baseline {args.baseline}: {done.stderr.strip().splitlines()[-1]}")
            versions = {"baseline": tmp / "baseline", "current": REPO}
            return measure_all(args, argv, cases, versions, tmp)
        except KeyboardInterrupt:  # the runs so far are not a measurement: nothing is written
            print("\ninterrupted (Ctrl-C): nothing written; the baseline's checkout is removed", file=sys.stderr)
            sys.exit(130)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tmp / "baseline")],
                           capture_output=True)


def command(case, tree, args, cache, out):
    fill = {"text": args.text, "tokenizer": args.tokenizer, "mnist": args.mnist, "cache": cache, "out": out}
    script, *flags = CASES[case]
    return [sys.executable, str(tree / script)] + [f.format(**fill) for f in flags]


def run_once(case, tree, args, cache, out):
    """One process, timed from the parent; its metrics."""
    shutil.rmtree(out, ignore_errors=True)
    Path(f"{out}.json").unlink(missing_ok=True)  # the other version's: a script replaces only what it wrote
    cmd = command(case, tree, args, cache, out)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    if done.returncode:
        sys.exit(f"error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    m = json.loads(Path(f"{out}.json").read_text())
    return {"wall_seconds": wall, "loop_seconds": m["train_seconds"], "outside_loop_seconds": wall - m["train_seconds"],
            "process_seconds": m.get("process_seconds"), "phases": m.get("phases")}


def measure_all(args, argv, cases, versions, tmp):
    runs = {case: {v: [] for v in versions} for case in cases}
    for case in cases:  # untimed: each version's token cache made once
        for version, tree in versions.items():
            run_once(case, tree, args, tmp / f"cache-{version}", tmp / "warm-up")
    head = {"machine": {"cpu": device.cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
            **common.run_facts(__file__, argv), "baseline": git("rev-parse", args.baseline), "repeats": args.repeats,
            "goals_outside_loop_seconds": {c: GOALS[c] for c in cases},
            "commands": {c: " ".join(command(c, Path("."), args, "CACHE", "OUT")[1:]) for c in cases},
            "load_average_at_start": os.getloadavg()[0]}
    for r in range(args.repeats):
        for case in cases:
            for version, tree in versions.items():
                got = run_once(case, tree, args, tmp / f"cache-{version}", tmp / f"run-{version}")
                runs[case][version].append(got)
                print(f"repeat {r + 1}, {case:14s} {version:8s}: {got['wall_seconds']:6.1f} s process, "
                      f"{got['loop_seconds']:6.1f} s loop, {got['outside_loop_seconds']:5.1f} s outside", flush=True)
                out = common.write(args, {**head, "load_average_now": os.getloadavg()[0], "cases": summarise(runs)})
    for case, result in out["cases"].items():
        c, b = result["current"], result["baseline"]
        print(f"{case:14s} outside the loop: {b['outside_loop_seconds']:.1f} -> {c['outside_loop_seconds']:.1f} s "
              f"(goal <= {GOALS[case]:g}: {'met' if c['outside_loop_seconds'] <= GOALS[case] else 'NOT met'})")
    return out


def summarise(runs):
    """Per case and version: the median and range of each time; the current code's median phases."""
    out = {}
    for case, by_version in runs.items():
        out[case] = {}
        for version, got in by_version.items():
            if not got:
                continue
            row = {}
            for key in ("wall_seconds", "loop_seconds", "outside_loop_seconds"):
                row |= common.median_range(key, [g[key] for g in got])
            if got[0]["phases"]:
                row["phases_median"] = {k: statistics.median(g["phases"].get(k, 0.0) for g in got)
                                        for k in got[0]["phases"]}
                row["process_seconds"] = statistics.median(g["process_seconds"] for g in got)
            out[case][version] = {**row, "runs": got}
        if len(out[case]) == 2:
            out[case]["outside_loop_ratio"] = (out[case]["current"]["outside_loop_seconds"] /
                                               out[case]["baseline"]["outside_loop_seconds"])
    return out


if __name__ == "__main__":
    main()
