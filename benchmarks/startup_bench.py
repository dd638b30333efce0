"""The job's clock outside the training loop: each script run as a process, as a grader's `time` sees it,
today's code beside commit 139e3cc's (before the changes to the job's clock), interleaved repeats.

    python benchmarks/startup_bench.py --metrics-out startup_bench_cpu.json                  # ~10 min on 2 cores

Per run: the wall time from the parent (fork to exit), the loop's `train_seconds`, their difference, the current
code's `process_seconds` and `phases`. The baseline runs from a git worktree; each token cache is warmed untimed."""
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
from training.flags import number

BASELINE = "139e3cc"
SHARED = REPO.parent / "shared" / "data"
GPT = ["gpt_train.py", "--text", f"{SHARED}/wos-standin/X.txt", "--tokenizer", f"{SHARED}/gpt2-tokenizer",
       "--cache-dir", "{cache}"]
OUT = ["--out-dir", "{out}", "--metrics-out", "{out}.json"]
CASES = {"lab-1-step": GPT + ["--tokens", "1024", "--global-batch", "1", "--micro-batch", "1", "--val-batches", "1"],
         "tiny-20k": GPT + ["--preset", "tiny", "--tokens", "20000"],
         "lenet-1-epoch": ["lenet5.py", "--device", "cpu", "--epochs", "1", "--data-dir", "{mnist}", "--no-download"]}


def main(argv=None):
    p = common.parser(__doc__, "write the results here as JSON (after every run)")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="(default: all)")
    p.add_argument("--repeats", type=number(int, 1), default=3, help="interleaved repeats (default: %(default)s)")
    p.add_argument("--mnist", type=Path, default=SHARED, help="MNIST's folder (default: %(default)s)")
    args = common.parse(p, argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the baseline's checkout
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        baseline = Path(tmp) / "baseline"
        try:
            done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), BASELINE],
                                  capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"error: the baseline {BASELINE}: {done.stderr.strip().splitlines()[-1]}")
            return measure_all(args, argv, {"baseline": baseline, "current": REPO}, Path(tmp))
        except KeyboardInterrupt:  # the runs so far are not a measurement: nothing is written
            print("\ninterrupted (Ctrl-C): nothing written; the baseline's checkout is removed", file=sys.stderr)
            sys.exit(130)
        finally:  # twice --force: a Ctrl-C during `worktree add` leaves it locked
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", "--force", str(baseline)],
                           capture_output=True)


def measure_all(args, argv, versions, tmp):
    """Each case's token cache made once per version, untimed; then the repeats, each case and version in turn."""
    def run(case, version, out):
        shutil.rmtree(out, ignore_errors=True)
        Path(f"{out}.json").unlink(missing_ok=True)  # the other version's: a script replaces only what it wrote
        script, *flags = CASES[case] + OUT
        fill = {"mnist": args.mnist, "cache": tmp / f"cache-{version}", "out": out}
        cmd = [sys.executable, str(versions[version] / script)] + [f.format(**fill) for f in flags]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=versions[version])
        wall = time.perf_counter() - t0
        if done.returncode:
            sys.exit(f"error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        m = json.loads(Path(f"{out}.json").read_text())
        return {"wall_seconds": wall, "loop_seconds": m["train_seconds"], "outside_loop_seconds":
                wall - m["train_seconds"], "process_seconds": m.get("process_seconds"), "phases": m.get("phases")}
    for case in args.cases:
        for version in versions:
            run(case, version, tmp / "warm-up")
    head = {"machine": {"cpu": device.cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
            **common.run_facts(__file__, argv), "baseline": git("rev-parse", BASELINE), "repeats": args.repeats,
            "load_average_at_start": os.getloadavg()[0]}
    runs = {case: {v: [] for v in versions} for case in args.cases}
    for _ in range(args.repeats):
        for case in args.cases:
            for version in versions:
                runs[case][version].append(got := run(case, version, tmp / f"run-{version}"))
                print(f"{case} {version}: {got['outside_loop_seconds']:.1f} s outside the loop", flush=True)
                out = common.write(args, {**head, "load_average_now": os.getloadavg()[0], "cases": summarise(runs)})
    return out


def summarise(runs):
    """Per case and version: the median and range of each time, the current code's median phases; the ratio."""
    out = {}
    for case, by_version in runs.items():
        out[case] = {}
        for version, got in ((v, g) for v, g in by_version.items() if g):
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
