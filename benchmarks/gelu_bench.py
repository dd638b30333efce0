"""GELU forward+backward: ATen, the lab's composite formula, the Python Function, the C++/CUDA op.

    python benchmarks/gelu_bench.py --metrics-out report/results/gelu_bench_cpu.json
    python benchmarks/gelu_bench.py --device cuda      # adds a device-to-device copy of the same bytes

One process, the same inputs, the median of --repeats runs per cell. Bytes moved per element
and pass: forward reads x and writes y, backward reads grad and x and writes dx: 5 x itemsize.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import gelu_ext  # noqa: E402
from data import files  # noqa: E402


class SeedGELU(torch.autograd.Function):
    """The lab's starting point: the formula as ~ten separate ATen calls, rounded constants."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x.pow(3))))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.797885 * x + 0.0356774 * x.pow(3))
        return grad * (0.5 * x * ((1 - t * t) * (0.797885 + 0.107032 * x * x)) + 0.5 * (1 + t))


IMPLS = {
    "aten": lambda x: F.gelu(x, approximate="tanh"),
    "seed": SeedGELU.apply,
    "python": gelu_ext.gelu_python,
    "ext": gelu_ext.gelu,
}


def forward_backward(fn, x, grad):
    def run():
        x.grad = None
        fn(x).backward(grad)
    return run


def time_once(fn, device):
    """Seconds of one call: on a GPU between two CUDA events (the kernels' time, not the launch
    overhead of the host), on a CPU by the wall clock."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()  # sync point
    return start.elapsed_time(end) / 1e3


def timed_round_robin(fns, device, repeats):
    """Median ms of each fn and its spread (min, max); the fns take turns, so drift on a noisy
    machine hits them alike."""
    times = {name: [] for name in fns}
    for r in range(repeats + 1):  # round 0 warms up caches and the allocator
        for name, fn in fns.items():
            seconds = time_once(fn, device)
            if r:
                times[name].append(seconds)
    return {name: (statistics.median(ts) * 1e3, min(ts) * 1e3, max(ts) * 1e3) for name, ts in times.items()}


def max_backward_error(n=1_000_000):
    """Largest |dx - exact| over n float32 inputs, the exact value computed in float64: the ext's
    and ATen's (the accuracy claim in gelu_ext/README.md)."""
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    grad = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    errors = {}
    for name, fn in (("exact", IMPLS["aten"]), ("ext", IMPLS["ext"]), ("aten", IMPLS["aten"])):
        xi = (x if name == "exact" else x.float()).clone().requires_grad_()
        fn(xi).backward(grad if name == "exact" else grad.float())
        errors[name] = xi.grad.double()
    return {name: (errors[name] - errors["exact"]).abs().max().item() for name in ("ext", "aten")}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="(default: %(default)s)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16", "float64"], default="float32",
                   help="(default: %(default)s)")
    p.add_argument("--min-log2", type=int, default=16, help="(default: %(default)s)")
    p.add_argument("--max-log2", type=int, default=None, help="(default: 28 on GPU, where 2^24 elements are still "
                                                               "launch-bound; 24 on CPU)")
    p.add_argument("--repeats", type=int, default=0, help="runs per cell (default: 7 on CPU, 50 on GPU)")
    p.add_argument("--skip", nargs="*", default=[], choices=list(IMPLS), help="implementations to leave out")
    p.add_argument("--metrics-out", type=Path, default=None, help="write the table here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not gelu_ext.is_built():
        sys.exit(f"error: {gelu_ext.BUILD_HINT}")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU")
    repeats = args.repeats or (50 if device.type == "cuda" else 7)
    max_log2 = args.max_log2 or (28 if device.type == "cuda" else 24)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else \
        f"{files.cpu_name()}, CPU ({torch.get_num_threads()} threads)"
    impls = {k: v for k, v in IMPLS.items() if k not in args.skip}

    rows = []
    print(f"{device_name}, {args.dtype}, forward+backward, median of {repeats}")
    header = f"{'n':>10} " + " ".join(f"{name + ' ms':>11}" for name in impls)
    header += f" {'copy ms':>9} {'ext GB/s':>9} {'ext/aten':>9}" + (" ext/copy" if device.type == "cuda" else "")
    print(header)
    for log2 in range(args.min_log2, max_log2 + 1, 2):
        n = 2**log2
        x = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(n, device=device, dtype=dtype)
        fns = {name: forward_backward(fn, x, grad) for name, fn in impls.items()}
        bytes_moved = 5 * n * x.element_size()
        if device.type == "cuda":  # the same bytes as one read + one write of 2.5 n elements
            src = torch.empty(bytes_moved // 2, device=device, dtype=torch.uint8)
            dst = torch.empty_like(src)
            fns["copy"] = lambda: dst.copy_(src)
        timed = timed_round_robin(fns, device, repeats)
        row = {"n": n, **{f"{name}_ms": ms for name, (ms, _, _) in timed.items()},
               **{f"{name}_ms_range": [lo, hi] for name, (_, lo, hi) in timed.items()}}
        if device.type == "cuda":
            row["ext_vs_copy"] = row["copy_ms"] / row["ext_ms"]
        row["ext_GBps"] = bytes_moved / row["ext_ms"] / 1e6
        row["ext_vs_aten"] = row["aten_ms"] / row["ext_ms"]
        if "seed_ms" in row:
            row["ext_vs_seed"] = row["seed_ms"] / row["ext_ms"]
        rows.append(row)
        line = f"{n:>10} " + " ".join(f"{row[name + '_ms']:>11.3f}" for name in impls)
        line += f" {row.get('copy_ms', float('nan')):>9.3f} {row['ext_GBps']:>9.1f} {row['ext_vs_aten']:>9.2f}"
        print(line + (f" {row['ext_vs_copy']:>8.2f}" if device.type == "cuda" else ""), flush=True)

    last = rows[-1]
    result = {"device_name": device_name, "torch": torch.__version__, "command": "python " + " ".join(sys.argv),
              "float32_max_backward_error": max_backward_error(), "dtype": args.dtype, "n": last["n"],
              **{k: last[k] for k in ("aten_ms", "seed_ms", "ext_ms", "ext_vs_aten", "ext_vs_seed",
                                      "copy_ms", "ext_vs_copy") if k in last},
              "rows": rows}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.metrics_out:
        files.write_json(args.metrics_out, result)
    return result


if __name__ == "__main__":
    main()
