"""The acceleration ladder: GPT-2 124M training steps, adding one acceleration at a time.

    python benchmarks/gpt_bench.py --metrics-out report/results/gpt_bench_cpu.json     # CPU: ~30 min
    python benchmarks/gpt_bench.py --micro-batch 16 --metrics-out report/results/gpt_bench_h200.json
    python benchmarks/gpt_bench.py --compile-cost --seq-len 128 --micro-batch 1 --text X.txt --tokenizer tok.json

From the naive baseline — transformers' GPT2LMHeadModel as GPT2Config makes it (dropout 0.1,
eager attention), fp32, plain AdamW — each rung keeps everything above it and adds one thing;
the last rung is gpt_train.py's default on this device; then the alternatives (whole-model compile
instead of regional; the default minus each acceleration, leave-one-out). Same shapes, same random
batch, one process; steady-state steps after warm-up (compilation happens in the warm-up steps);
every row measured --repeats times, interleaved, reported as median and range.
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import gpt_train  # noqa: E402
from data import files  # noqa: E402
from training import device as decisions  # noqa: E402  (`device` is a torch.device below)


def ladder(cuda, capability, with_compile=False):
    """(name, settings) per row: the rungs, each extending the previous one's settings; then, indented,
    the alternatives: whole-model compile instead of regional, and the default minus each acceleration."""
    half = decisions.resolve_precision("auto", "cuda" if cuda else "cpu", capability, decisions.cpu_has_bf16())
    compile_ok = decisions.resolve_compile("auto", "cuda" if cuda else "cpu", capability)[0] != "off"
    rungs = [("naive: GPT2LMHeadModel, dropout 0.1, eager attention, fp32, AdamW",
              dict(model="hf", dropout=0.1, attention="eager", precision="fp32", compile="off", fused=False,
                   tf32=False)),
             ("+ dropout 0 (GPT-2 pretraining used 0.1; 12M tokens do not overfit)", dict(dropout=0.0)),
             ("+ SDPA attention (flash / memory-efficient kernel)", dict(attention="sdpa")),
             ("+ own GPT module from the same GPT2Config", dict(model="own"))]
    if cuda:
        rungs.append(("+ TF32 matmuls", dict(tf32=True)))
    if half != "fp32":  # as gpt_train.py's --precision auto: only where the hardware has 16-bit math
        rungs.append((f"+ {half} autocast" + (" + GradScaler" if half == "fp16" else ""), dict(precision=half)))
    if compile_ok or with_compile:  # as gpt_train.py's --compile auto: regional; off on Turing and on CPU
        rungs.append(("+ torch.compile, each block on its own (regional)", dict(compile="regional")))
    rungs.append(("+ fused AdamW" + (" (= gpt_train.py default)" if not with_compile or compile_ok else ""),
                  dict(fused=True)))
    settings, out = {}, []
    for name, change in rungs:
        settings = {**settings, **change}
        out.append((name, dict(settings)))
    naive = out[0][1]
    if compile_ok or with_compile:  # not a rung: the last one with the whole model compiled instead
        out.append(("  (instead of regional: whole-model torch.compile)", {**settings, "compile": "whole"}))
    for name, change in rungs[1:]:  # leave-one-out: the default minus one acceleration
        if settings["model"] == "own" and set(change) == {"dropout"}:
            continue  # the own module has no dropout: rung 2 measures it
        what = name.removeprefix("+ ").split(" (")[0].split(",")[0]
        out.append((f"  default without {what}", {**settings, **{k: naive[k] for k in change}}))
    return out


def build(settings, vocab_size, seq_len, device):
    cfg = gpt_train.model_config(vocab_size, 0, n_positions=seq_len)  # the lab shape: GPT-2 small
    if settings["model"] == "hf":
        cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = settings["dropout"]
        hf = GPT2LMHeadModel._from_config(cfg, attn_implementation=settings["attention"]).to(device)

        def loss_fn(x, y):
            logits = hf(input_ids=x).logits
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        model, forward = hf, loss_fn
    else:
        model = gpt_train.GPT(cfg, settings["attention"]).to(device)
        forward = model
    if settings["compile"] != "off":
        forward = decisions.compile_model(model, settings["compile"]) if settings["model"] == "own" \
            else torch.compile(forward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=settings["fused"] or None)
    return cfg, model, forward, optimizer


def measure(settings, args, device):
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = settings["tf32"]
    torch.backends.cudnn.allow_tf32 = settings["tf32"]
    torch.manual_seed(0)
    cfg, model, forward, optimizer = build(settings, args.vocab_size, args.seq_len, device)
    params = sum(p.numel() for p in model.parameters())
    precision = settings["precision"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")
    batch = torch.randint(0, args.vocab_size, (args.micro_batch, args.seq_len + 1), device=device)
    model.train()
    times = []
    torch._dynamo.reset()  # each rung compiles from scratch (inductor's cache may still help)
    for step in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            loss = forward(batch[:, :-1], batch[:, 1:])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()  # sync point: the step's GPU work is what is timed
        times.append(time.perf_counter() - t0)
    first, times = times[0], times[args.warmup:]
    seconds = statistics.median(times)
    tps = args.micro_batch * args.seq_len / seconds
    peak = decisions.peak_flops(torch.cuda.get_device_name(device), precision) if cuda else None
    fpt = decisions.flops_per_token(cfg, args.seq_len, params - cfg.n_positions * cfg.n_embd)
    del model, forward, optimizer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return {"tokens_per_second": tps, "ms_per_step": seconds * 1e3, "mfu": fpt * tps / peak if peak else None,
            "ms_per_step_range": [min(times) * 1e3, max(times) * 1e3],
            "first_step_extra_seconds": first - seconds,  # compilation (and warm-up) of the first step
            "loss": loss.item()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cuda = torch.cuda.is_available()
    p.add_argument("--micro-batch", type=int, default=16 if cuda else 2, help="sequences per step "
                                                                              "(default: 16 on GPU, 2 on CPU)")
    p.add_argument("--seq-len", type=int, default=1024, help="(default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=16384, help="own tokenizer's (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3 if cuda else 2, help="untimed steps, compilation included "
                                                                        "(default: 3 on GPU, 2 on CPU)")
    p.add_argument("--steps", type=int, default=10 if cuda else 2, help="timed steps (default: 10 on GPU, 2 on CPU)")
    p.add_argument("--only", type=str, default=None, help="comma-separated rung numbers to run (1 = naive)")
    p.add_argument("--with-compile", action="store_true", help="add the compile rungs where auto leaves them out (CPU)")
    p.add_argument("--compile-cost", action="store_true", help="instead of the ladder: cold and warm compile seconds "
                   "of gpt_train.py, regional vs whole model, each in a fresh process with a fresh cache")
    p.add_argument("--text", type=Path, default=None, help="--compile-cost: corpus (default: gpt_train.py's)")
    p.add_argument("--tokenizer", default=None, help="--compile-cost: tokenizer.json (default: gpt_train.py's)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every row (default: %(default)s)")
    p.add_argument("--metrics-out", type=Path, default=None, help="write the results here as JSON")
    args = p.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    device_name = torch.cuda.get_device_name(device) if cuda else \
        f"{files.cpu_name()}, CPU ({torch.get_num_threads()} threads)"
    if args.compile_cost:
        return compile_cost(args)
    rows = ladder(cuda, torch.cuda.get_device_capability() if cuda else (0, 0), args.with_compile)
    chosen = [(i, *row) for i, row in enumerate(rows, 1) if not args.only or i in {int(x) for x in args.only.split(",")}]
    print(f"{device_name}: GPT-2 124M structure, vocab {args.vocab_size}, batch {args.micro_batch} x {args.seq_len}, "
          f"median of {args.steps} steps after {args.warmup} warm-up, {args.repeats} interleaved repeats")
    runs = {i: [] for i, _, _ in chosen}
    for r in range(args.repeats):  # every row once per repeat: drift on the machine hits all rows alike
        for i, name, settings in chosen:
            runs[i].append(measure(settings, args, device))
            print(f"repeat {r + 1}, {i:2d} {name:60s} {runs[i][-1]['tokens_per_second']:10,.0f} tok/s", flush=True)
    results = summarise(chosen, runs)
    out = {"device_name": device_name, "torch": torch.__version__, "command": "python " + " ".join(sys.argv),
           "micro_batch": args.micro_batch, "seq_len": args.seq_len, "vocab_size": args.vocab_size,
           "repeats": args.repeats, "rungs": results}
    if args.metrics_out:
        files.write_json(args.metrics_out, out)
    return out


def summarise(chosen, runs):
    """Per row: the median over repeats (tokens/s, ms/step), the spread (min, max tokens/s), the
    speed-up against the first row, and whether a rung is within the noise of the one before it
    (their ranges overlap)."""
    results, base, previous = [], None, None
    for i, name, _ in chosen:
        tps = [m["tokens_per_second"] for m in runs[i]]
        row = {"name": name, "tokens_per_second": statistics.median(tps), "tokens_per_second_range": [min(tps), max(tps)],
               "ms_per_step": statistics.median(m["ms_per_step"] for m in runs[i]),
               "mfu": statistics.median(m["mfu"] for m in runs[i]) if runs[i][0]["mfu"] else None,
               "first_step_extra_seconds": statistics.median(m["first_step_extra_seconds"] for m in runs[i]),
               "repeats": runs[i]}
        base = base or row["tokens_per_second"]
        row["speedup"] = row["tokens_per_second"] / base
        if not name.startswith(" "):
            if previous:
                row["within_noise_of_previous"] = min(tps) <= previous[1] and previous[0] <= max(tps)
            previous = row["tokens_per_second_range"]
        results.append(row)
        mfu = f"{row['mfu']:6.1%}" if row["mfu"] else "     -"
        noise = "  (within noise of the rung above)" if row.get("within_noise_of_previous") else ""
        print(f"{i:2d} {name:60s} {row['tokens_per_second']:9,.0f} tok/s [{min(tps):,.0f}-{max(tps):,.0f}] "
              f"MFU {mfu} x{row['speedup']:.2f}{noise}", flush=True)
    return results


# ----------------------------------------------------------------------------- --compile-cost

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


def compile_cost(args):
    """Cold (empty cache) and warm (the same cache again) compile seconds, regional vs whole model,
    interleaved; every run a new process, as every job start is."""
    runs = {f"{mode}_{state}": [] for mode in ("regional", "whole") for state in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_once(args, "off", tmp / "off-cache", tmp / "warm-up")  # tokenises the corpus once, untimed
        for r in range(args.repeats):
            for state in ("cold", "warm"):
                for mode in ("regional", "whole"):
                    m = train_once(args, mode, tmp / f"cache-{mode}-{r}", tmp / f"run-{mode}-{state}-{r}")
                    runs[f"{mode}_{state}"].append({"compile_seconds": m["compile_seconds"],
                                                    "tokens_per_second": m["tokens_per_second"],
                                                    "total_seconds": m["total_seconds"]})
                    print(f"repeat {r + 1}: {mode:8s} {state}: compile {m['compile_seconds']:6.1f} s, steady "
                          f"{m['tokens_per_second']:7,.0f} tokens/s, process {m['total_seconds']:5.1f} s", flush=True)
    median = {k: statistics.median(x["compile_seconds"] for x in v) for k, v in runs.items()}
    out = {"device_name": m["device_name"], "torch": torch.__version__, "command": "python " + " ".join(sys.argv),
           "seq_len": args.seq_len, "micro_batch": args.micro_batch, "precision": m["precision"],
           "repeats": args.repeats, "median_compile_seconds": median,
           "regional_cold_vs_whole_cold": median["regional_cold"] / median["whole_cold"],
           "regional_warm_vs_regional_cold": median["regional_warm"] / median["regional_cold"], "runs": runs}
    print(f"medians: {json.dumps({k: round(v, 2) for k, v in median.items()})}; regional cold / whole cold = "
          f"{out['regional_cold_vs_whole_cold']:.2f}, regional warm / cold = {out['regional_warm_vs_regional_cold']:.2f}")
    if args.metrics_out:
        files.write_json(args.metrics_out, out)
    return out


if __name__ == "__main__":
    main()
