"""One training step under torch.profiler, its time grouped by what the hardware did (GROUPS): the operators'
own time to the step's scopes (training/metrics.py's scope(): data, optimizer), else to a group by name."""
import collections
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

from training import metrics

# the step's time split so that an acceleration can be shown removing a part of it: each operator's own time to its
# scope(), else to a group by its name (group_of); `idle`: the rest of the wall time (launch overhead, syncs, Python)
GROUPS = ("matmul", "attention", "elementwise", "loss", "optimizer", "communication", "data", "idle")
SCOPES = {"lab5.data": "data", "lab5.optimizer": "optimizer"}
NAME_RULES = (  # the first rule whose words appear in the lower-cased operator name decides
    ("communication", ("nccl", "all_reduce", "allreduce", "gloo", "c10d::", "broadcast")),
    ("loss", ("cross_entropy", "nll_loss", "nllloss", "log_softmax", "logsoftmax", "logsumexp", "chunkedcrossentropy")),
    # a batched matmul is attention's QK^T and AV in these models (their linear layers are mm/addmm): the
    # eager attention's bmm counts where SDPA's kernel would, so the two compare
    ("attention", ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha", "softmax",
                   "aten::bmm", "aten::baddbmm", "bmmbackward")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::matmul", "_addmm_activation", "gemm", "cutlass", "sm90_xmma",
                "ampere_", "volta_", "turing_")),
)
TOP_OPS = 12  # the operators with the most own time, kept beside the groups (what each group is made of)


def group_of(name):
    lowered = name.lower()
    for group, words in NAME_RULES:
        if any(w in lowered for w in words):
            return group
    return "elementwise"  # norms, GELU, adds, copies, embeddings: everything that is not a matmul


def profiled(step, device, trace_dir=None):
    """(step()'s result, {"step_seconds", "groups", "top_ops"}); the trace into `trace_dir` for TensorBoard."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handler = tensorboard_trace_handler(str(trace_dir)) if trace_dir else None
    metrics.PROFILING[0] = True
    try:
        with profile(activities=activities, on_trace_ready=handler) as prof:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = step()
            if cuda:
                torch.cuda.synchronize()  # sync point: the step's kernels are in the wall time
            wall = time.perf_counter() - t0
    finally:
        metrics.PROFILING[0] = False
    return result, {"step_seconds": wall, **grouped(prof.events(), wall, cuda)}


def grouped(events, wall, cuda):
    """{"groups": {group: seconds} summing to `wall`, "top_ops": [[operator, group, seconds]...]}."""
    seconds, ops = dict.fromkeys(GROUPS, 0.0), collections.Counter()
    for event in (e for e in events if e.device_type == DeviceType.CPU):  # kernels: counted on their op
        if cuda:  # an older torch names it self_cuda_time_total
            own = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        else:
            own = event.self_cpu_time_total
        if own <= 0:
            continue
        scope = event
        while scope is not None and scope.name not in SCOPES:  # the innermost scope() around it decides
            scope = scope.cpu_parent
        group = SCOPES[scope.name] if scope else group_of(event.name)
        seconds[group] += own / 1e6
        ops[(event.name, group)] += own / 1e6
    seconds["idle"] = max(0.0, wall - sum(seconds.values()))
    return {"groups": {k: round(v, 6) for k, v in seconds.items()},
            "top_ops": [[name, group, round(s, 6)] for (name, group), s in ops.most_common(TOP_OPS)]}
