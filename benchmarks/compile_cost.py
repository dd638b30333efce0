"""`python benchmarks/gpt_bench.py --compile-cost`: cold and warm compile seconds of gpt_train.py, regional
against whole model, each run a fresh process with a fresh cache (as every job start is), interleaved.

    python benchmarks/gpt_bench.py --compile-cost --seq-len 128 --micro-batch 1 --text X.txt --tokenizer tok.json
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common
from common import REPO


def train_once(args, mode, cache, run_dir):
    """gpt_train.py in a fresh process: the lab model at --seq-len, a few steps; its metrics."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = str(cache / "xdg")  # nothing of an earlier run's caches but the compile cache
    cmd = [sys.executable, str(REPO / "gpt_train.py"), "--preset", "lab", "--seq-len", str(args.seq_len),
           "--micro-batch", str(args.micro_batch), "--global-batch", str(args.micro_batch),
           "--tokens", str(8 * args.micro_batch * args.seq_len), "--compile", mode, "--compile-cache", str(cache),
           "--eval-every", "1000", "--val-batches", "1", "--ckpt-every", "0", "--log-every", "1",
           "--out-dir", str(run_dir), "--metrics-out", str(run_dir / "m.json")]
    cmd += ["--text", str(args.text)] if args.text else []
    cmd += ["--tokenizer", args.tokenizer] if args.tokenizer else []
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode:
        sys.exit(f"error: gpt_train.py --compile {mode} failed:\n{result.stderr[-2000:]}")
    return json.loads((run_dir / "m.json").read_text())


def compile_cost(args, argv=None):
    """Cold (empty cache) and warm (the same cache again) compile seconds, regional vs whole model, interleaved."""
    runs = {f"{mode}_{state}": [] for mode in ("regional", "whole") for state in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_once(args, "off", tmp / "off-cache", tmp / "warm-up")  # tokenises the corpus once, untimed
        for r in range(args.repeats):
            for state in ("cold", "warm"):
                for mode in ("regional", "whole"):
                    m = train_once(args, mode, tmp / f"cache-{mode}-{r}", tmp / f"run-{mode}-{state}-{r}")
                    runs[f"{mode}_{state}"].append({k: m[k] for k in ("compile_seconds", "tokens_per_second",
                                                                      "total_seconds")})
                    print(f"repeat {r + 1}: {mode:8s} {state}: compile {m['compile_seconds']:6.1f} s, steady "
                          f"{m['tokens_per_second']:7,.0f} tokens/s, process {m['total_seconds']:5.1f} s", flush=True)
    median = {k: statistics.median(x["compile_seconds"] for x in v) for k, v in runs.items()}
    out = {"device_name": m["device_name"], **common.run_facts("gpt_bench.py", argv), "seq_len": args.seq_len,
           "micro_batch": args.micro_batch, "precision": m["precision"], "repeats": args.repeats,
           "median_compile_seconds": median,
           "regional_cold_vs_whole_cold": median["regional_cold"] / median["whole_cold"],
           "regional_warm_vs_regional_cold": median["regional_warm"] / median["regional_cold"], "runs": runs}
    print(f"medians: {json.dumps({k: round(v, 2) for k, v in median.items()})}; regional cold / whole cold = "
          f"{out['regional_cold_vs_whole_cold']:.2f}, "
          f"regional warm / cold = {out['regional_warm_vs_regional_cold']:.2f}")
    return common.write(args, out)


