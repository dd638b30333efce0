"""GELU forward+backward: ATen, the lab's composite formula, the Python Function, the C++/CUDA op.

    python benchmarks/gelu_bench.py --metrics-out gelu_bench_cpu.json
    python benchmarks/gelu_bench.py --device cuda --metrics-out gelu_bench_gpu.json   # adds a device copy

Per size, --repeats rounds in which the implementations take turns in a random order, each sample many
back-to-back calls (on a GPU the launches overlap the kernels, as in training): per-call median and range, ext /
ATen per round. Bytes per element: x read twice, y, grad and dx once (5 x itemsize)."""
import json
import os
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import common
import gelu_ext
import training.device
from training.flags import number


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


IMPLS = {"aten": lambda x: F.gelu(x, approximate="tanh"), "seed": SeedGELU.apply, "python": gelu_ext.gelu_python,
         "ext": gelu_ext.gelu}
RATIOS = {"ext_vs_aten": ("aten", "ext"), "ext_vs_seed": ("seed", "ext"), "ext_vs_copy": ("copy", "ext"),
          "aten_vs_copy": ("copy", "aten")}  # the first one's time over the second's: above 1, the second is faster


def forward_backward(fn, x, grad, calls):
    def run():
        for _ in range(calls):
            x.grad = None
            fn(x).backward(grad)
    return run


def timed_round_robin(fns, device, repeats):
    """Seconds of each fn in each round, each round in a new random (seeded) order: drift hits all alike and
    none always follows the same neighbour (on a GPU at its power cap, what follows the composites is slower)."""
    names, order, cuda = list(fns), random.Random(0), device.type == "cuda"
    times = {name: [] for name in names}
    for _ in range(repeats + 1):
        for name in order.sample(names, len(names)):
            if cuda:  # the kernels' seconds, between two events
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                end.synchronize()  # sync point
                times[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t0)
    return {name: ts[1:] for name, ts in times.items()}  # round 0 warmed up caches and the allocator


def ext_missing_reason(device):
    if not gelu_ext.is_built():
        return gelu_ext.BUILD_HINT
    if device.type == "cuda" and not gelu_ext.built_with_cuda():
        return "gelu_ext was built without its CUDA kernel (no nvcc, or its CUDA did not match torch's)"
    return None


def measure_size(n, impls, device, dtype, repeats, calls):
    """One table row: per-call ms of each implementation (median, range) and the ratios."""
    x = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(n, device=device, dtype=dtype)
    fns = {name: forward_backward(fn, x, grad, calls) for name, fn in impls.items()}
    bytes_moved = 5 * n * x.element_size()
    if device.type == "cuda":  # the same bytes as one read + one write of 2.5 n elements
        src = torch.empty(bytes_moved // 2, device=device, dtype=torch.uint8)
        dst = torch.empty_like(src)

        def copy():
            for _ in range(calls):
                dst.copy_(src)
        fns["copy"] = copy
    times = {name: [t / calls * 1e3 for t in ts] for name, ts in timed_round_robin(fns, device, repeats).items()}
    row = {"n": n, "calls": calls}
    for name, ts in times.items():
        row |= common.median_range(f"{name}_ms", ts)
    row |= {k: row[f"{a}_ms"] / row[f"{b}_ms"] for k, (a, b) in RATIOS.items() if a in times and b in times}
    if "ext" in times:
        paired = [a / e for a, e in zip(times["aten"], times["ext"])]
        row |= {"ext_vs_aten_per_round": [min(paired), statistics.median(paired), max(paired)],
                "ext_GBps": bytes_moved / row["ext_ms"] / 1e6}
    return row


def kernel_times(n, impls, dtype, runs=5):
    """The CUDA kernels' own time (torch.profiler) per kernel, `runs` calls of ATen and the op at n elements."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    calls = [forward_backward(impls[name], x, torch.randn_like(x), runs) for name in ("aten", "ext")]
    torch.cuda.synchronize()  # no warm-up: the table's rounds at this size ran both just before
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls:
            call()
        torch.cuda.synchronize()  # sync point
    return [{"kernel": e.key, "count": e.count, "ms": e.device_time_total / e.count / 1e3}
            for e in prof.key_averages() if e.device_time_total > 0]


def max_backward_error(n=1_000_000):
    """Largest |dx - exact| of the op's and ATen's over n float32 inputs, exact in float64 (gelu_ext/README)."""
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    grad = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dx = {}
    for name, dtype in (("exact", torch.float64), ("ext", torch.float32), ("aten", torch.float32)):
        xi = x.to(dtype, copy=True).requires_grad_()
        IMPLS["aten" if name == "exact" else name](xi).backward(grad.to(dtype))
        dx[name] = xi.grad.double()
    return {name: (dx[name] - dx["exact"]).abs().max().item() for name in ("ext", "aten")}


def measure_sizes(args, impls, device, dtype, repeats):
    """The table's rows, smallest size first, and why it stopped early (None: it did not)."""
    cuda = device.type == "cuda"
    rows, stopped = [], None
    for log2 in args.log2 or (range(16, 29, 2) if cuda else [10, 13, 16, 20, 24]):
        # back-to-back calls per sample: more than one call's launch latency or a timer tick; on a GPU at least 10
        # (with 2-4, 2^24-2^26 rounds ranged 0.4-1.9x on an H200; 20-call runs of ext and ATen agreed to 1-2%)
        calls = args.calls or (max(10, min(100, 2**28 >> log2)) if cuda else max(1, min(1000, 2**20 >> log2)))
        try:
            rows.append(measure_size(2**log2, impls, device, dtype, repeats, calls))
        except torch.cuda.OutOfMemoryError:  # a 2080 Ti at 2^28: the sizes before it stay
            torch.cuda.empty_cache()
            stopped = f"2^{log2}: out of GPU memory; the table ends before it"
            print(f"note: {stopped}", flush=True)
            break
        print(f"2^{log2}, {calls} calls: " + ", ".join(f"{k} {v:.4g}" for k, v in rows[-1].items()
                                                     if k.endswith(("_ms", "_aten", "GBps"))), flush=True)
    return rows, stopped


def main(argv=None):
    p = common.parser(__doc__, "write the table here as JSON")
    add = p.add_argument
    add("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
        help="(default: %(default)s)")
    add("--dtype", choices=["float32", "float16", "bfloat16", "float64"], default="float32",
        help="(default: %(default)s)")
    add("--log2", type=number(int, 0, 32), nargs="+", help="sizes as powers of two (default: 10 13 16 20 24 on "
        "CPU, LeNet-5's activations among them; 16 18 ... 28 on GPU, where only the largest are bandwidth-bound)")
    add("--repeats", type=number(int, 0), default=0, help="rounds (default: 7 on CPU, 20 on GPU)")
    add("--threads", type=number(int, 0), default=0, help="CPU threads (default: torch's own, one per core)")
    add("--calls", type=number(int, 0), default=0, help="back-to-back calls per sample (default: by size, from "
        "1000 at 2^10 down to 1 on CPU, 100 down to 10 on GPU)")
    add("--skip", nargs="*", default=[], choices=[k for k in IMPLS if k != "aten"], help="implementations left out")
    add("--kernel-times", action="store_true", help="on a GPU, also profile ATen's and the op's kernels at the "
        "largest size")
    args = common.parse(p, argv)
    device, dtype, cuda = torch.device(args.device), getattr(torch, args.dtype), args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (20 if cuda else 7)
    device_name = training.device.device_name(device)
    missing = ext_missing_reason(device)
    impls = {k: v for k, v in IMPLS.items() if k not in args.skip and not (k == "ext" and missing)}
    if missing:
        print(f"note: the ext op is not measured: {missing}", flush=True)
    print(f"{device_name}, {args.dtype}, forward+backward, ms per call, median of {repeats} rounds")
    load_before = os.getloadavg()  # on a shared machine, how busy it was is part of the result
    rows, stopped = measure_sizes(args, impls, device, dtype, repeats)
    if not rows:
        sys.exit(f"error: {stopped}")
    last = rows[-1]
    result = {"device_name": device_name, **common.run_facts(__file__, argv), "cuda": torch.version.cuda,
              "build": gelu_ext.build_info(), "ext_measured": "ext" in impls, "ext_missing_reason": missing,
              "stopped": stopped, "dtype": args.dtype, "repeats": repeats,
              "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
              "float32_max_backward_error": max_backward_error() if gelu_ext.is_built() else None,
              "n": last["n"], **{k: last[k] for k in ("aten_ms", "seed_ms", "ext_ms", "ext_vs_aten", "ext_vs_seed",
                                                        "copy_ms", "ext_vs_copy") if k in last},
              "rows": rows}
    if args.kernel_times and cuda and "ext" in impls:
        result["kernel_times"] = kernel_times(last["n"], impls, dtype)
        for k in result["kernel_times"]:
            print(f"{k['ms']:8.3f} ms  x{k['count']:<3} {k['kernel'][:110]}")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return common.write(args, result)


if __name__ == "__main__":
    main()
