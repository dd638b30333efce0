"""One step under torch.profiler, its time split into GROUPS, so that an acceleration can be shown removing
a part of it: each operator's own time goes to its scope(), else to a group by its name (group_of); `idle`
is the rest of the wall time (launch overhead, syncs, Python)."""
import collections
import contextlib
import time

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
_active = [False]  # whether a profile is being taken (scope() marks only then)


def scope(name):
    """A named part of the step in the profile, only while one is taken."""
    if not _active[0]:
        return contextlib.nullcontext()
    import torch
    return torch.profiler.record_function(f"lab5.{name}")


def group_of(name):
    lowered = name.lower()
    for group, words in NAME_RULES:
        if any(w in lowered for w in words):
            return group
    return "elementwise"  # norms, GELU, adds, copies, embeddings: everything that is not a matmul


def profiled(step, device, trace_dir=None):
    """(step()'s result, {"step_seconds", "groups", "top_ops"}); the trace into `trace_dir` for TensorBoard."""
    import torch
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handler = tensorboard_trace_handler(str(trace_dir)) if trace_dir else None
    _active[0] = True
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
        _active[0] = False
    return result, {"step_seconds": wall, **grouped(prof.events(), wall, cuda)}


def grouped(events, wall, cuda):
    """{"groups": {group: seconds} summing to `wall`, "top_ops": [[operator, group, seconds]...]}."""
    from torch.autograd import DeviceType
    seconds, ops = dict.fromkeys(GROUPS, 0.0), collections.Counter()
    for event in events:
        own = own_time_us(event, cuda) if event.device_type == DeviceType.CPU else 0  # kernels: via their op
        if own > 0:
            group = enclosing_scope(event) or group_of(event.name)
            seconds[group] += own / 1e6
            ops[(event.name, group)] += own / 1e6
    seconds["idle"] = max(0.0, wall - sum(seconds.values()))
    return {"groups": {k: round(v, 6) for k, v in seconds.items()},
            "top_ops": [[name, group, round(s, 6)] for (name, group), s in ops.most_common(TOP_OPS)]}


def own_time_us(event, cuda):
    if cuda:
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
    return event.self_cpu_time_total


def enclosing_scope(event):
    """The group of the innermost scope() around `event`, or None."""
    while event is not None and event.name not in SCOPES:
        event = event.cpu_parent
    return SCOPES[event.name] if event else None
