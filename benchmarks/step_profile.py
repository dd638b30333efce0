"""One training step under torch.profiler, its time grouped by what the hardware did: gpt_bench.py --profile, and
the ladder's naive and default rows. Each operator's own time goes to the step's scope around it (training/step.py
marks its data and optimizer parts with training.metrics.scope), else to a group by its name (group_of); `idle` is
the rest of the wall time (launch overhead, syncs, Python)."""
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

GROUPS = ("matmul", "attention", "elementwise", "loss", "optimizer", "data", "idle")
SCOPES = {"lab5.data": "data", "lab5.optimizer": "optimizer"}  # training.metrics.scope(name) records "lab5.<name>"
NAME_RULES = (  # the first rule whose words appear in the lower-cased operator name decides
    ("loss", ("cross_entropy", "nll_loss", "nllloss", "log_softmax", "logsoftmax", "logsumexp", "chunkedcrossentropy")),
    # a batched matmul is attention's QK^T and AV in these models (their linear layers are mm/addmm): the
    # eager attention's bmm counts where SDPA's kernel would, so the two compare
    ("attention", ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha", "softmax",
                   "aten::bmm", "aten::baddbmm", "bmmbackward")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::matmul", "_addmm_activation", "gemm", "cutlass", "sm90_xmma",
                "ampere_", "volta_", "turing_")),
)


def group_of(name):
    lowered = name.lower()
    for group, words in NAME_RULES:
        if any(w in lowered for w in words):
            return group
    return "elementwise"  # norms, GELU, adds, copies, embeddings: everything that is not a matmul


def profiled(step, device):
    """(step()'s result, {"step_seconds", "groups"})."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else lambda: None
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        sync()
        t0 = time.perf_counter()
        result = step()
        sync()  # sync point: the step's kernels are in the wall time
        wall = time.perf_counter() - t0
    return result, {"step_seconds": wall, **grouped(prof.events(), wall, cuda)}


def grouped(events, wall, cuda):
    """{"groups": {group: seconds} summing to `wall`}."""
    seconds = dict.fromkeys(GROUPS, 0.0)
    for event in (e for e in events if e.device_type == DeviceType.CPU):  # kernels: counted on their op
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        if own <= 0:
            continue
        scope = event
        while scope is not None and scope.name not in SCOPES:  # the innermost scope() around it decides
            scope = scope.cpu_parent
        group = SCOPES[scope.name] if scope else group_of(event.name)
        seconds[group] += own / 1e6
    seconds["idle"] = max(0.0, wall - sum(seconds.values()))
    return {"groups": {k: round(v, 6) for k, v in seconds.items()}}
