"""The acceleration ladder: GPT-2 124M training steps, adding one acceleration at a time.

    python benchmarks/gpt_bench.py --list                                               # the rows, numbered
    python benchmarks/gpt_bench.py --metrics-out gpt_bench_cpu.json                     # CPU: ~30 min
    python benchmarks/gpt_bench.py --seq-len 128 --micro-batch 4 --metrics-out gpt_bench_cpu_short.json  # ~15 min
    python benchmarks/gpt_bench.py --preset tiny --seq-len 64 --micro-batch 8 --metrics-out tiny.json  # CPU: ~3 min
    python benchmarks/gpt_bench.py --micro-batch 16 --metrics-out gpt_bench_h200.json

Rows (ladder_rows.py) from the naive baseline to gpt_train.py's default step, each built by training/step.py;
one process, one random batch, steady steps after warm-up, --repeats interleaved; the JSON rewritten after every
row. Each row is read against a matmul of its shape measured just before it in its precision, and on a GPU
against the datasheet's peak (MFU). Peak memory per row: CUDA's allocator on a GPU, the process's on a CPU."""
import contextlib
import gc
import itertools
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.benchmark as benchmark
from transformers import GPT2Config, GPT2LMHeadModel

import common
import training.device
from ladder_rows import accelerations, default_step, ladder, unmeasured_first
from step_profile import profiled
from training import step
from training.flags import number
from training.gpt_flags import PRESETS
from training.model import GPT, model_config


class HFLoss(torch.nn.Module):
    """transformers' GPT2LMHeadModel as the "hf" rows train it: (inputs, targets) -> the mean loss (fp32 logits)."""

    def __init__(self, cfg, dropout, attention):
        super().__init__()
        hf_cfg = GPT2Config(**{**asdict(cfg), "resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout})
        self.hf = GPT2LMHeadModel._from_config(hf_cfg, attn_implementation=attention)
        self.cfg, self.attention = cfg, attention

    def forward(self, x, y):
        logits = self.hf(input_ids=x).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def build(settings, vocab_size, seq_len, recipe, **shape):
    """A row's (model config, TrainStep), built by training/step.py as gpt_train.py builds its own (GPT-2 small)."""
    acc = accelerations(settings)
    accelerator = step.make_accelerator(acc, fresh=True)  # one per row: each row's precision
    cfg = model_config(settings.get("vocab_size", vocab_size), 0, n_positions=seq_len, **shape)
    with accelerator.device:  # weights made where they train
        model = (HFLoss(cfg, settings["dropout"], acc.attention) if settings["model"] == "hf"
                 else GPT(cfg, acc.attention))
    return cfg, step.build(step.change_model(model, acc), acc, recipe, accelerator)


def timed_steps(args, run, vocab_size):
    """(seconds of each timed step with its GPU work, the first step's extra seconds, the last loss)."""
    batch = torch.randint(0, vocab_size, (args.micro_batch, args.seq_len + 1), device=run.accelerator.device)
    batches, losses, times = itertools.repeat(batch), [], []
    sync = torch.cuda.synchronize if run.accelerator.device.type == "cuda" else lambda: None
    for _ in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        run(batches, 1, run.recipe.lr, losses.append)
        sync()  # sync point: the step's kernels are in its seconds
        times.append(time.perf_counter() - t0)
    return times[args.warmup:], times[0] - statistics.median(times[args.warmup:]), losses[-1].item()


def measure(settings, args, device, profile=False):
    """One row once: tokens/s, FLOPs per token, MFU, peak memory, the step as built; `profile`: one more step."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch._dynamo.reset()  # each row compiles from scratch (inductor's cache may still help)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    measured = cuda or process_peak_GiB(reset=True) is not None  # the peak from here
    cfg, run = build(settings, args.vocab_size, args.seq_len, args.recipe, **args.shape)
    acc = run.accelerations
    run.train_model.train()
    times, first_extra, loss = timed_steps(args, run, cfg.vocab_size)
    seconds = statistics.median(times)
    tps = args.micro_batch * args.seq_len / seconds
    params = sum(p.numel() for p in run.model.parameters())
    fpt = training.device.flops_per_token(cfg, args.seq_len, params - cfg.n_positions * cfg.n_embd)
    peak = training.device.peak_flops(torch.cuda.get_device_name(device), acc.precision, acc.tf32) if cuda else None
    out = {"tokens_per_second": tps, "ms_per_step": seconds * 1e3, "flops_per_token": fpt,
           "mfu": fpt * tps / peak if peak else None, "ms_per_step_range": [min(times) * 1e3, max(times) * 1e3],
           "first_step_extra_seconds": first_extra,  # compilation (and warm-up) of the first step
           "loss": loss, "vocab_size": cfg.vocab_size, "matmul_kind": matmul_kind(settings, cuda),
           "sdpa_backend": step.attention_kernel(run.accelerator.unwrap_model(run.model), acc), "built": run.describe()}
    if profile:
        batch = itertools.repeat(torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1), device=device))
        out["profile"] = profiled(lambda: run(batch, 1, run.recipe.lr, lambda loss: None), device)[1]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else process_peak_GiB()
    out["peak_memory_GiB"] = peak if measured else None  # without a reset it is not this row's
    run.accelerator.free_memory()  # the accelerator's references: the row's memory goes when measure() returns
    return out


def process_peak_GiB(reset=False):
    """The process's peak resident memory since the last reset (Linux's VmHWM; writing 5 to clear_refs resets it)."""
    with contextlib.suppress(OSError, StopIteration), open("/proc/self/status") as status:  # elsewhere: None
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 2**20  # in kB


def matmul_kind(settings, cuda):
    if settings["precision"] in ("bf16", "fp16"):
        return settings["precision"]
    return "tf32" if cuda and settings["tf32"] else "fp32"


def matmul_rate(kind, m, device, k=768, n=3072):
    """FLOP/s of an (m x k) @ (k x n) matmul in `kind` (torch's benchmark Timer, on this process's threads)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    g = torch.Generator(device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=g)
    timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    return 2 * m * k * n / timer.blocked_autorange(min_run_time=0.6).median


def try_measure(settings, args, device, profile):
    try:
        got = measure(settings, args, device, profile=profile)
    except Exception as e:  # any failure of one row (out of memory, a kernel): the other rows still count
        text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "can't allocate memory" in text
        got = {"error": "out of memory" if oom else f"{type(e).__name__}: {text}"}
        unavailable = ("No available kernel", "No viable backend", "has no SDPBackend")
        if settings.get("sdpa_backend") and any(w in text for w in unavailable):
            got["error"] = f"SDPA's {settings['sdpa_backend']} backend not available here: {text}"
        torch._dynamo.reset()
    gc.collect()  # after the except: its traceback held the failed row's tensors
    torch.cuda.empty_cache()  # nothing to do without CUDA
    return got


def main(argv=None):
    """Group by group, each row once per repeat just after a matmul in its precision; the JSON after every row."""
    p = common.parser(__doc__, "write the results here as JSON (after every row)")
    cuda = torch.cuda.is_available()
    add, positive = p.add_argument, number(int, 0, low_open=True)
    add("--micro-batch", type=positive, default=16 if cuda else 2, help="sequences per step (default: 16 on GPU, "
        "2 on CPU)")
    add("--preset", choices=list(PRESETS), default="lab", help="gpt_train.py's layers, heads, width (default: lab)")
    add("--seq-len", type=positive, default=1024, help="(default: %(default)s)")
    add("--vocab-size", type=positive, default=16384, help="own tokenizer's (default: %(default)s)")
    add("--warmup", type=number(int, 0), default=3 if cuda else 2, help="untimed steps, compilation included "
        "(default: 3 on GPU, 2 on CPU)")
    add("--steps", type=positive, default=10 if cuda else 2, help="timed steps (default: 10 on GPU, 2 on CPU)")
    add("--repeats", type=positive, default=3, help="interleaved repeats of every row (default: %(default)s)")
    add("--only", help="comma-separated row numbers to run (1 = naive; --list numbers them)")
    add("--list", action="store_true", help="print the rows with their numbers and exit, measuring nothing")
    add("--order", choices=["ladder", "unmeasured"], default="ladder", help="unmeasured: the rows the report's "
        "conclusions rest on first, group by group, for a run that may be cut (default: %(default)s)")
    args = common.parse(p, argv)
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    args.recipe = default_step(cuda, capability, args.preset)[1]  # every row computes what gpt_train.py does
    args.shape = {k: PRESETS[args.preset][k] for k in ("n_layer", "n_head", "n_embd")}
    rows = ladder(cuda, capability, vocab_size=args.vocab_size)
    if args.list:
        print("\n".join(f"{i:2d} {name}" for i, (name, _) in enumerate(rows, 1)))
        return rows
    try:
        wanted = {int(x) for x in args.only.split(",")} if args.only else set(range(1, len(rows) + 1))
    except ValueError:
        p.error(f"--only takes row numbers 1..{len(rows)}, got {args.only!r}")
    if not wanted <= set(range(1, len(rows) + 1)):
        p.error(f"--only: the ladder has rows 1..{len(rows)} here, got {args.only!r}")
    groups = unmeasured_first(rows) if args.order == "unmeasured" else [list(range(1, len(rows) + 1))]
    chosen = {i: row for i, row in enumerate(rows, 1) if i in wanted}
    device = torch.device("cuda" if cuda else "cpu")
    device_name = training.device.device_name(device)
    print(f"{device_name}: GPT-2 {args.preset} preset, vocab {args.vocab_size}, batch {args.micro_batch} x "
          f"{args.seq_len}, median of {args.steps} steps after {args.warmup} warm-up, {args.repeats} repeats")
    m, k = args.micro_batch * args.seq_len, args.shape["n_embd"]
    runs, rates = {i: [] for i in chosen}, {}
    head = {"device_name": device_name, **common.run_facts(__file__, argv), "recipe": vars(args.recipe),
            "micro_batch": args.micro_batch, "seq_len": args.seq_len, "vocab_size": args.vocab_size,
            "preset": args.preset, **args.shape, "peak_memory_GiB_measures": "torch.cuda.max_memory_allocated"
            if cuda else "the process's peak resident memory (VmHWM), its libraries' included: compare rows",
            "repeats": args.repeats, "warmup": args.warmup, "steps": args.steps, "cpu_count": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],  # other work on the machine: read the ranges with it
            "order": args.order, "rows_planned": len(chosen)}
    rungs = [i for i, (name, _) in chosen.items() if not name.startswith(" ")]
    profile = {min(rungs), max(rungs)} if rungs else set()
    for r, i in ((r, i) for group in groups for r in range(args.repeats) for i in group if i in wanted):
        name, settings = chosen[i]
        kind = matmul_kind(settings, cuda)
        rates.setdefault(kind, []).append(rate := matmul_rate(kind, m, device, k, 4 * k))
        got = try_measure(settings, args, device, profile=r == 0 and i in profile)
        runs[i].append(got)
        if "error" not in got:  # the row's FLOP/s over the matmul's, measured just before it
            got["fraction_of_matmul_rate"] = got["flops_per_token"] * got["tokens_per_second"] / rate
        print(f"repeat {r + 1}, {i:2d} {name:60s} " + (f"{got['tokens_per_second']:10,.0f} tok/s, "
              f"{got['fraction_of_matmul_rate']:6.1%} of {kind} matmul {rate / 1e12:.3f} TFLOP/s"
              if "error" not in got else got["error"]), flush=True)
        matmul = {"shape": [m, k, 4 * k], "flops_per_second": {k: statistics.median(v) for k, v in rates.items()},
                  "flops_per_second_range": {k: [min(v), max(v)] for k, v in rates.items()}}
        out = common.write(args, {**head, "load_average_now": os.getloadavg()[0], "matmul": matmul,
                                  "rungs": summarise(chosen, runs)})
    return out


def summarise(chosen, runs):
    """Per row so far: medians over its repeats, the speed-up against row 1, whether within the rung before's noise."""
    results, base, previous = [], None, None
    for i, (name, settings) in ((i, chosen[i]) for i in chosen if runs[i]):
        good = [m for m in runs[i] if "error" not in m]
        errors = [m["error"] for m in runs[i] if "error" in m]
        if not good:
            results.append({"name": name, "error": errors[0], "repeats": runs[i]})
            continue
        extras = {k: m[k] for m in good for k in ("built", "profile") if k in m}
        good = [{k: v for k, v in m.items() if k not in extras} for m in good]
        first = good[0]
        row = {"name": name, "settings": settings, **extras,
               **common.median_range("tokens_per_second", [m["tokens_per_second"] for m in good]),
               **{k: statistics.median(m[k] for m in good)
                  for k in ("ms_per_step", "first_step_extra_seconds", "fraction_of_matmul_rate")},
               **{k: first[k] for k in ("flops_per_token", "vocab_size", "matmul_kind")},
               "mfu": statistics.median(m["mfu"] for m in good) if first["mfu"] else None,
               "sdpa_backend": first.get("sdpa_backend"), "repeats": good, **({"errors": errors} if errors else {})}
        row["peak_memory_GiB"] = max((m["peak_memory_GiB"] for m in good if m.get("peak_memory_GiB")), default=None)
        base = base or row["tokens_per_second"]
        row["speedup"] = row["tokens_per_second"] / base
        if not name.startswith(" "):
            if previous:
                lo, hi = row["tokens_per_second_range"]
                row["within_noise_of_previous"] = lo <= previous[1] and previous[0] <= hi
            previous = row["tokens_per_second_range"]
        results.append(row)
    return results


if __name__ == "__main__":
    main()
