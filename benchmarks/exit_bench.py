"""How often does a finished 2-rank job abort at exit? Three ways to end it, interleaved.

    python benchmarks/exit_bench.py --runs 20 --hogs 1 --metrics-out exit_bench_cpu.json

Each run: `torchrun --nproc_per_node 2` of JOB (gloo, a DDP Linear, 5 steps, a barrier) ended by returning, by
accelerator.end_training() or in training.lifecycle.no_teardown_after_collectives (gpt_train.py's way); aborted:
a rank printed "terminate called". The abort needs a busy machine: --hogs CPU-bound processes run beside."""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import REPO
from training import device
from training.flags import number

MODES = ("plain", "destroy", "no_teardown")

JOB = """
import contextlib
import sys
import torch
from accelerate import Accelerator
from training.lifecycle import no_teardown_after_collectives

def job(mode):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(64, 64)
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    for _ in range(5):
        accelerator.backward(model(torch.randn(8, 64)).square().mean())
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_everyone()
    if mode == "destroy":
        accelerator.end_training()

with no_teardown_after_collectives() if sys.argv[1] == "no_teardown" else contextlib.nullcontext():
    job(sys.argv[1])
"""


def one_run(script, mode):
    """"ok", "aborted" (terminate called) or "failed" (anything else), and the output's end."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), mode]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        return "failed", "no end after 300 s"
    output = done.stdout + done.stderr
    return "aborted" if "terminate called" in output else "failed" if done.returncode else "ok", output[-1500:]


def main(argv=None):
    p = common.parser(__doc__, "write the counts here (JSON)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=number(int, 1), default=20, help="runs of each mode")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--hogs", type=number(int, 0), default=1, help="CPU-bound processes beside the runs")
    args = common.parse(p, argv)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    counts = {m: {"ok": 0, "aborted": 0, "failed": 0} for m in args.modes}  # of --runs each
    load_start, t0 = os.getloadavg(), time.time()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "job.py"
            script.write_text(JOB)
            for r in range(args.runs):  # the modes alternate: the machine's drift hits all alike
                for mode in args.modes:
                    outcome, tail = one_run(script, mode)
                    counts[mode][outcome] += 1
                    if outcome == "failed":
                        print(f"\n{mode}: failed without an abort:\n{tail}", file=sys.stderr)
                print(f"round {r + 1} of {args.runs}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    metrics = {**common.run_facts(__file__, argv), "device_name": f"{device.cpu_name()}, {os.cpu_count()} cores",
               "hogs": args.hogs, "load_average_1min_start_end": [load_start[0], os.getloadavg()[0]],
               "seconds": round(time.time() - t0, 1), "modes": counts}
    return common.write(args, metrics)


if __name__ == "__main__":
    main()
