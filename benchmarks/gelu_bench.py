"""GELU forward+backward: ATen, the lab's composite formula, the Python Function, the C++/CUDA op.

    OMP_NUM_THREADS=1 python benchmarks/gelu_bench.py --metrics-out gelu_bench_cpu.json   # one CPU thread
    python benchmarks/gelu_bench.py --device cuda --metrics-out gelu_bench_gpu.json   # adds a device copy

Per size, --repeats rounds in which the implementations take turns in a random order, each sample many
back-to-back calls (on a GPU the launches overlap the kernels, as in training): per-call median and range, ext /
ATen per round; on a GPU also the kernels' own times at the largest size (torch.profiler). Bytes per element: x
read twice, y, grad and dx once (5 x itemsize)."""
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
LAST_ROW = ("n", "aten_ms", "seed_ms", "ext_ms", "ext_vs_aten", "copy_ms")  # the summary: the largest size's


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
    """Why the op cannot be measured on this device; None when it can."""
    if not gelu_ext.is_built():
        return gelu_ext.BUILD_HINT
    if device.type == "cuda" and not gelu_ext.built_with_cuda():
        return "gelu_ext was built without its CUDA kernel (no nvcc, or its CUDA did not match torch's)"


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
    if "ext" in times:  # above 1: the op is faster than ATen (the others' ratios follow from the times)
        paired = [a / e for a, e in zip(times["aten"], times["ext"])]
        row |= {"ext_vs_aten": row["aten_ms"] / row["ext_ms"], "ext_GBps": bytes_moved / row["ext_ms"] / 1e6,
                "ext_vs_aten_per_round": [min(paired), statistics.median(paired), max(paired)]}
    return row


def kernel_times(n, impls, dtype):
    """The CUDA kernels' own time (torch.profiler) per kernel, 5 calls of ATen and the op at n elements."""
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    calls = [forward_backward(impls[name], x, torch.randn_like(x), 5) for name in ("aten", "ext")]
    torch.cuda.synchronize()  # no warm-up: the table's rounds at this size ran both just before
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls:
            call()
        torch.cuda.synchronize()  # sync point
    return [{"kernel": e.key, "count": e.count, "ms": e.device_time_total / e.count / 1e3}
            for e in prof.key_averages() if e.device_time_total > 0]


def max_backward_error():
    """Largest |dx - exact| of the op's and ATen's over a million float32 inputs, exact in float64 (gelu_ext/README)."""
    x = torch.randn(1_000_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    grad = torch.randn(1_000_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def dx(name, dtype):
        xi = x.to(dtype, copy=True).requires_grad_()
        IMPLS[name](xi).backward(grad.to(dtype))
        return xi.grad.double()
    exact = dx("aten", torch.float64)
    return {name: (dx(name, torch.float32) - exact).abs().max().item() for name in ("ext", "aten")}


def measure_sizes(args, impls, device, dtype):
    """The table's rows, smallest size first, and why it stopped early (None: it did not)."""
    cuda = device.type == "cuda"
    rows = []
    for log2 in args.log2 or (range(16, 29, 2) if cuda else [10, 13, 16, 20, 24]):
        # back-to-back calls per sample: more than one call's launch latency or a timer tick; on a GPU at least 10
        # (with 2-4, 2^24-2^26 rounds ranged 0.4-1.9x on an H200; 20-call runs of ext and ATen agreed to 1-2%)
        calls = max(10, min(100, 2**28 >> log2)) if cuda else max(1, min(1000, 2**20 >> log2))
        try:
            rows.append(measure_size(2**log2, impls, device, dtype, args.repeats, calls))
        except torch.cuda.OutOfMemoryError:  # a 2080 Ti at 2^28: the sizes before it stay
            torch.cuda.empty_cache()
            return rows, f"2^{log2}: out of GPU memory; the table ends before it"
        print(f"2^{log2}: {calls} calls measured", flush=True)  # progress: a GPU's table takes minutes
    return rows, None


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
    args = common.parse(p, argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU")
    args.repeats = args.repeats or (20 if device.type == "cuda" else 7)
    missing = ext_missing_reason(device)
    impls = {k: v for k, v in IMPLS.items() if not (k == "ext" and missing)}
    if missing:
        print(f"note: the ext op is not measured: {missing}", flush=True)
    load_before = os.getloadavg()[0]  # on a shared machine, how busy it was is part of the result
    rows, stopped = measure_sizes(args, impls, device, dtype)
    if not rows:
        sys.exit(f"error: {stopped}")
    result = {"device_name": training.device.device_name(device), **common.run_facts(__file__, argv),
              "cuda": torch.version.cuda, "build": gelu_ext.build_info(), "ext_measured": "ext" in impls,
              "ext_missing_reason": missing, "stopped": stopped, "dtype": args.dtype, "repeats": args.repeats,
              "load_average_1min_before_after": [load_before, os.getloadavg()[0]],
              "float32_max_backward_error": max_backward_error() if gelu_ext.is_built() else None,
              **{k: v for k, v in rows[-1].items() if k in LAST_ROW}, "rows": rows}
    if device.type == "cuda" and "ext" in impls:
        result["kernel_times"] = kernel_times(rows[-1]["n"], impls, dtype)
    return common.write(args, result)


if __name__ == "__main__":
    main()
