"""The acceleration ladder: GPT-2 124M training steps, adding one acceleration at a time.

    python benchmarks/gpt_bench.py --list                                               # the rows, numbered
    python benchmarks/gpt_bench.py --metrics-out gpt_bench_cpu.json                     # CPU: an hour or more
    python benchmarks/gpt_bench.py --preset tiny --seq-len 64 --micro-batch 8 --metrics-out tiny.json  # CPU: minutes
    python benchmarks/gpt_bench.py --like runs/gpt/RUN --only 6,16 --metrics-out mine.json  # your model's shape
    python benchmarks/gpt_bench.py --profile --preset tiny --metrics-out profile.json   # one step, where it goes
    python benchmarks/gpt_bench.py --micro-batch 16 --metrics-out gpt_bench_h200.json

Rows (ladder_rows.py) from the naive baseline to gpt_train.py's default step, each built by training/step.py.
Each row is judged against its reference row (the rung before; the default for an indented row): the two are
built once and timed alternately, --steps steps a sample, and the verdict is read from the paired ratios (a
sign-test interval of their median against a noise band), pairs added until it decides or --max-pairs. A pair in
which either row got under 3/4 of its usual CPU time per second (another process took the cores) is measured again.
Each sample is read against a matmul of its shape in its precision timed just before it, and on a GPU against the
datasheet's peak (MFU). Peak memory per row: CUDA's allocator on a GPU, a fresh process's on a CPU. The JSON is
rewritten after every row."""
import gc
import itertools
import json
import math
import multiprocessing
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.benchmark as benchmark
from transformers import GPT2Config, GPT2LMHeadModel

import common
import training.device
from ladder_rows import accelerations, default_step, ladder, reference, unmeasured_first
from step_profile import profiled
from training import step
from training.flags import number
from training.gpt_flags import PRESETS
from training.model import GPT, model_config

NOISE = 0.05  # a ratio within 1 +- 5% is no effect: what one step costs moves that much on a shared machine
ALPHA = 0.005  # each look's risk of a wrong verdict: the pairs are judged again after each new pair (<= 20 looks)
STARVED = 0.75  # a sample with under 3/4 of the row's usual CPU time per second did not get the CPUs it asked for
SHAPE = ("n_layer", "n_head", "n_embd")
UNAVAILABLE = ("No available kernel", "No viable backend", "has no SDPBackend")  # a forced SDPA backend's errors


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


class Row:
    """A row built and warmed up (at least one step: compilation, and on a GPU its peak memory), then sampled;
    `record` is its JSON, kept when the row is freed."""

    def __init__(self, record, args):
        self.args, self.record, self.shares = args, record, []
        cuda = args.device.type == "cuda"
        self.sync = torch.cuda.synchronize if cuda else lambda: None
        torch.manual_seed(0)
        torch._dynamo.reset()  # each row compiles from scratch (inductor's cache may still help)
        if cuda:
            before = torch.cuda.memory_allocated()  # the reference row's, alive beside it
            torch.cuda.reset_peak_memory_stats()
        cfg, self.run = build(record["settings"], args.vocab_size, args.seq_len, args.recipe, **args.shape)
        self.batch = itertools.repeat(torch.randint(0, cfg.vocab_size, (args.micro_batch, args.seq_len + 1),
                                                    device=args.device))
        first = [self.step() for _ in range(max(1, args.warmup))][0]
        record["loss"] = self.loss.item()  # the first step's: the same math gives the same number in every row
        params = sum(p.numel() for p in self.run.model.parameters())
        acc = self.run.accelerations
        self.kind = "tf32" if cuda and acc.tf32 and acc.precision == "fp32" else acc.precision
        record.update(flops_per_token=training.device.flops_per_token(cfg, args.seq_len, params - cfg.n_positions
                                                                     * cfg.n_embd),
                      vocab_size=cfg.vocab_size, matmul_kind=self.kind, first_step_seconds=first,
                      peak_flops=training.device.peak_flops(torch.cuda.get_device_name(), acc.precision, acc.tf32)
                      if cuda else None, built=self.run.describe())
        if cuda:
            record["peak_memory_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30

    def step(self):
        self.sync()
        t0 = time.perf_counter()
        self.run(self.batch, 1, self.run.recipe.lr, lambda loss: setattr(self, "loss", loss))
        self.sync()  # sync point: the step's kernels are in its seconds
        return time.perf_counter() - t0

    def sample(self):
        """tokens/s over --steps steps, its FLOP/s over a matmul's timed just before it (at most 1: flagged), and
        whether it was starved: less CPU time per second than STARVED of this row's median."""
        args = self.args
        torch.backends.cuda.matmul.allow_tf32 = self.run.accelerations.tf32  # a global: the other row's may differ
        rate = matmul_rate(self.kind, args.micro_batch * args.seq_len, args.shape["n_embd"], args.device)
        cpu, t0 = time.process_time(), time.perf_counter()  # CPU seconds of all this process's threads
        times = [self.step() for _ in range(args.steps)]
        self.shares.append((time.process_time() - cpu) / (time.perf_counter() - t0))
        tps = args.micro_batch * args.seq_len / statistics.median(times)
        fraction = self.record["flops_per_token"] * tps / rate
        return {"tokens_per_second": tps, "fraction_of_matmul_rate": min(fraction, 1.0), "above_matmul": fraction > 1,
                "starved": self.shares[-1] < STARVED * statistics.median(self.shares)}


def matmul_rate(kind, m, k, device):
    """FLOP/s of an (m x k) @ (k x 4k) matmul in `kind` (torch's benchmark Timer, on this process's threads); TF32
    as the caller has set it."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, torch.float32)
    a = torch.ones(m, k, device=device, dtype=dtype)
    b = a.new_ones(k, 4 * k)
    timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    return 8 * m * k * k / timer.blocked_autorange(min_run_time=0.2).median


def verdict(ratios, against):
    """Paired ratios row/reference -> their median, a 1 - ALPHA interval of it (the sign test's: the j-th smallest
    and largest ratio) and the word: faster or slower when the interval is outside 1 +- NOISE, within noise inside."""
    r, n, j = sorted(ratios), len(ratios), 0
    while j < n // 2 and 2 * sum(math.comb(n, i) for i in range(j + 1)) <= ALPHA * 2**n:
        j += 1
    low, high = r[max(j, 1) - 1], r[n - max(j, 1)]  # j = 0 (under 9 pairs): the extremes, and no verdict
    word = ("undecided" if not j else "faster" if low > 1 + NOISE else "slower" if high < 1 - NOISE
            else "within noise" if 1 - NOISE <= low and high <= 1 + NOISE else "undecided")
    return {"against": against, "ratio": statistics.median(r), "low": low, "high": high, "pairs": n, "word": word}


def compare(row, ref, repeats, max_pairs):
    """Row and reference sampled alternately (ABBA..., a drift in the machine's load falls on both), at least
    `repeats` pairs, more until the verdict decides, at most `max_pairs`; a starved pair measured again."""
    ratios, redone = [], 0
    while len(ratios) < max_pairs:
        first, second = (row, ref) if len(ratios) % 2 == 0 else (ref, row)
        got = {first: first.sample(), second: second.sample()}
        if (got[row]["starved"] or got[ref]["starved"]) and redone < max_pairs:
            redone += 1
            continue
        for r in got:
            r.record["repeats"].append(got[r])
        ratios.append(got[row]["tokens_per_second"] / got[ref]["tokens_per_second"])
        judged = verdict(ratios, ref.record["name"])
        if len(ratios) >= repeats and judged["word"] != "undecided":
            break
    row.record["pairs_measured_again"] = redone  # a busier machine for one of the two: the pair was measured again
    return judged


def fresh_process_peak(settings, args):
    """(In a fresh process) the row built and stepped -> the process's peak resident memory in GiB, torch's own
    included: what one row holds, compared between rows."""
    Row({"settings": settings}, args)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: kB


def cpu_peak(settings, args):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fresh_process_peak, settings, args).result()


def open_row(record, args, profile):
    """A Row of `record`, or None with its error recorded (a failing row does not stop the others)."""
    try:
        row = Row(record, args)
        if args.device.type == "cpu" and "peak_memory_gib" not in record:
            record["peak_memory_gib"] = cpu_peak(record["settings"], args)
        if profile and "profile" not in record:
            record["profile"] = profiled(row.step, args.device)[1]
        return row
    except Exception as e:  # out of memory, a kernel this machine lacks: that row only
        text = str(e).strip().split("\n")[0][:300]  # its first line
        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "can't allocate memory" in text
        record["error"] = "out of memory" if oom else f"{type(e).__name__}: {text}"
        if (forced := record["settings"]["sdpa_backend"]) and any(w in text for w in UNAVAILABLE):
            record["error"] = f"SDPA's {forced} backend not available here: {text}"
        torch._dynamo.reset()
        gc.collect()  # the traceback held the failed row's tensors


def parse_args(argv):
    """The flags; the device, the recipe, the model's shape (--like: a run's) and the rows follow from them."""
    p = common.parser(__doc__, "write the results here as JSON (after every row)")
    cuda = torch.cuda.is_available()
    add, positive = p.add_argument, number(int, 0, ends="(]")
    add("--micro-batch", type=positive, default=16 if cuda else 2, help="sequences per step (default: 16 on GPU, "
        "2 on CPU)")
    add("--preset", choices=list(PRESETS), default="lab", help="gpt_train.py's layers, heads, width (default: lab)")
    add("--seq-len", type=positive, default=1024, help="(default: %(default)s)")
    add("--vocab-size", type=positive, default=16384, help="own tokenizer's (default: %(default)s)")
    add("--like", type=Path, help="a finished gpt_train.py run folder: its preset, shape, vocabulary, sequence "
        "length and micro-batch, in place of the four flags above")
    add("--warmup", type=number(int, 0), default=3 if cuda else 2, help="untimed steps, compilation included; one "
        "at least (default: 3 on GPU, 2 on CPU)")
    add("--steps", type=positive, default=10 if cuda else 2, help="timed steps a sample (default: 10 on GPU, 2 on CPU)")
    add("--repeats", type=positive, default=9, help="pairs of samples, row and reference, at least (default: "
        "%(default)s: fewer give no verdict)")
    add("--max-pairs", type=positive, default=20, help="pairs at most, while undecided (default: %(default)s)")
    add("--only", help="comma-separated row numbers to run, each with its reference (1 = naive; --list numbers them)")
    add("--list", action="store_true", help="print the rows with their numbers and exit, measuring nothing")
    add("--profile", action="store_true", help="one steady step of the default row under torch.profiler, grouped "
        "(data, matmul, attention, ..., optimizer), instead of the ladder")
    add("--order", choices=["ladder", "unmeasured"], default="ladder", help="unmeasured: the rows the report's "
        "conclusions rest on first, group by group, for a run that may be cut (default: %(default)s)")
    args = common.parse(p, argv)
    if args.like:  # args.json: the flags as typed; metrics.json (a finished run's): the vocabulary, the micro-batch
        try:
            run = {**json.loads((args.like / "args.json").read_text()),
                   **json.loads((args.like / "metrics.json").read_text())}
            vars(args).update({k: run[k] for k in ("preset", "vocab_size", "seq_len", "micro_batch", *SHAPE)})
        except (OSError, ValueError, KeyError, TypeError) as e:
            p.error(f"--like {args.like} is not a finished gpt_train.py run ({type(e).__name__}: {e})")
    args.shape = {k: vars(args).get(k, PRESETS[args.preset][k]) for k in SHAPE}  # --like: the run's
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    args.recipe = default_step(cuda, capability, args.preset)[1]  # every row computes what gpt_train.py does
    args.device = torch.device("cuda" if cuda else "cpu")
    rows = ladder(cuda, capability, vocab_size=args.vocab_size)
    numbers = set(range(1, len(rows) + 1))
    try:
        args.only = {int(x) for x in args.only.split(",")} if args.only else numbers
        if not args.only <= numbers:
            raise ValueError
    except ValueError:
        p.error(f"--only takes row numbers 1..{len(rows)} (the ladder's here), got {args.only!r}")
    return args, rows


def main(argv=None):
    """Row by row with its reference, the two built once and sampled alternately; the JSON after every row."""
    args, rows = parse_args(argv)
    if args.list:
        print("\n".join(f"{i:2d} {name}" for i, (name, _) in enumerate(rows, 1)))
        return rows
    order = unmeasured_first(rows) if args.order == "unmeasured" else range(1, len(rows) + 1)
    plan = [(i, reference(rows, i)) for i in order if i in args.only]
    default = reference(rows, len(rows) + 1)  # the last rung
    if args.profile:  # the default row alone, one step of it profiled
        plan = [(default, None)]
    records = {i: dict(zip(("name", "settings"), rows[i - 1]), repeats=[])
               for i in sorted({i for pair in plan for i in pair if i})}
    device_name = training.device.device_name(args.device)
    print(f"{device_name}: GPT-2 {args.preset} preset, vocab {args.vocab_size}, batch {args.micro_batch} x "
          f"{args.seq_len}, {args.steps} steps a sample after {args.warmup} warm-up, {args.repeats} to "
          f"{args.max_pairs} pairs a row")
    head = {"device_name": device_name, **common.run_facts(__file__, argv), "recipe": vars(args.recipe),
            **{k: getattr(args, k) for k in ("micro_batch", "seq_len", "vocab_size", "preset", "repeats",
                                             "max_pairs", "warmup", "steps")},
            **args.shape, "like": args.like and str(args.like.resolve()), "rows_planned": len(records)}
    live = {}
    for i, ref in plan:
        for j in set(live) - {i, ref}:
            live.pop(j).run.accelerator.free_memory()  # its references: the row's memory goes with the row
        for j in (j for j in (ref, i) if j and j not in live and "error" not in records[j]):
            if row := open_row(records[j], args, j in (1, default)):
                live[j] = row
        measure(records[i], live.get(i), live.get(ref), args)
        out = common.write(args, {**head, "rungs": [summary(records[j]) for j in records if records[j]["repeats"]
                                                   or "error" in records[j]]})
    return out


def measure(record, row, ref, args):
    """Row against its reference; alone, without a verdict, where it has none (row 1) or its reference failed."""
    if row and ref:
        record["verdict"] = compare(row, ref, args.repeats, args.max_pairs)
    elif row and not record["repeats"]:
        record["repeats"] += [row.sample() for _ in range(args.repeats)]
    if "error" in record:
        return print(f"{record['name']:60s} {record['error']}", flush=True)
    got, v = summary(record), record.get("verdict")
    judged = (f", x{v['ratio']:.2f} [{v['low']:.2f}, {v['high']:.2f}] in {v['pairs']} pairs ("
              f"{record['pairs_measured_again']} measured again): {v['word']}") if v else ""
    print(f"{got['name']:60s} {got['tokens_per_second']:10,.0f} tok/s, {got['fraction_of_matmul_rate']:6.1%} of "
          f"{got['matmul_kind']} matmul{judged}", flush=True)


def summary(record):
    """A row's JSON: its facts, the median and range of its samples' tokens/s, MFU (GPU), the matmul fraction."""
    if "error" in record:
        return {k: record[k] for k in ("name", "error")}
    samples = record["repeats"]
    tps = common.median_range("tokens_per_second", [s["tokens_per_second"] for s in samples])
    flops = record["flops_per_token"] * tps["tokens_per_second"]
    return {**record, **tps, "mfu": record["peak_flops"] and flops / record["peak_flops"],
            "fraction_of_matmul_rate": statistics.median(s["fraction_of_matmul_rate"] for s in samples),
            "above_matmul": any(s["above_matmul"] for s in samples)}  # the matmul is no ceiling here: capped at 1


if __name__ == "__main__":
    main()
