"""The training loop's instruments behind one object, StepWatch, so that gpt_train.py's loop shows only training
(the step's clock, the loss window, fp16's skipped steps, the agreed stop); profiled(): --profile's step by GROUPS."""
import collections
import contextlib
import functools
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

from training.lifecycle import StopAgreement


class StepWatch:
    def __init__(self, accelerator, state, stop, total_steps, profile_dir=None):
        self.accelerator, self.cuda = accelerator, accelerator.device.type == "cuda"
        self.perf = Throughput(state)
        self.losses = LossWindow(state.loss_window, accelerator.device)
        self.skips, self.agreement = SkippedSteps(accelerator.scaler), StopAgreement(accelerator, stop)
        # --profile: a steady step (not a process's first), never the run's last
        self.profile_at = min(state.step + 1, total_steps - 1) if profile_dir else -1
        self.profile_dir, self.profile, self.state = profile_dir, None, state
        self.t0 = self.profiling = self.skipped = None

    def run(self, train_step, batches, n_micro, lr):
        """The step's clock starts; train_step runs (under the profiler at --profile's step)."""
        self.t0, self.profiling = time.perf_counter(), self.state.step == self.profile_at
        one_step = functools.partial(train_step, batches, n_micro, lr, self.losses.add)
        if self.profiling:
            grad_norm, self.profile = profiled(one_step, self.accelerator.device, self.profile_dir)
            self.profile["step"] = self.state.step + 1  # the step profiled, not the last one run
        else:
            grad_norm = one_step()
        self.losses.steps += 1
        self.skipped = self.skips.last_skipped()  # fp16: the gradients overflowed, the scaler skipped the step
        return grad_norm

    def step_done(self, tokens, synced, untimed_work_follows):
        """The step's clock stops; returns whether every process stops after this step (a signal)."""
        first = self.perf.first_step_seconds is None
        if self.cuda and not synced and (first or untimed_work_follows):
            torch.cuda.synchronize()  # sync point: the untimed work after it must not absorb the step's kernels
        stopping = self.agreement()
        self.perf.step_done(time.perf_counter() - self.t0, tokens, steady=not self.profiling)  # profiler: overhead
        return stopping


class Throughput:
    """The timed loop's seconds: tokens/s of the steady steps; the first step's extra time is compile_seconds."""

    def __init__(self, state):
        self.state = state  # train_seconds, steady_seconds, steady_tokens, compile_seconds: survive resumes
        self.first_step_seconds = None
        self.steady_steps, self.steady_seconds_here = 0, 0.0  # this process's, since it started
        self.compile_seconds_here = 0.0  # this process's part of compile_seconds (its phases split it out)
        self.window = [0.0, 0]  # steady seconds, tokens since the last log point

    def step_done(self, seconds, tokens, steady=True):
        self.state.train_seconds += seconds
        if self.first_step_seconds is None:
            self.first_step_seconds = seconds
        elif steady:
            self.steady_steps += 1
            self.steady_seconds_here += seconds
            self.state.steady_seconds += seconds
            self.state.steady_tokens += tokens
            self.window[0] += seconds
            self.window[1] += tokens

    def window_tokens_per_second(self):
        seconds, tokens = self.window
        self.window = [0.0, 0]
        return tokens / seconds if seconds else None

    def close(self):
        if self.first_step_seconds is not None and self.steady_steps:
            mean_step = self.steady_seconds_here / self.steady_steps
            self.compile_seconds_here = max(0.0, self.first_step_seconds - mean_step)
            self.state.compile_seconds += self.compile_seconds_here

    def tokens_per_second(self):
        """Steady state; a run of one step has no steady steps, and then that step counts."""
        if self.state.steady_seconds:
            return self.state.steady_tokens / self.state.steady_seconds
        return self.state.tokens_seen / self.state.train_seconds


class LossWindow:
    """The loss summed on the device since the last log point (no sync per step); checkpointed (resumes)."""

    def __init__(self, saved, device):
        total, self.steps = saved
        self.total = torch.tensor(total, device=device)

    def add(self, loss):
        self.total += loss

    def mean(self, accelerator):
        """A CPU-GPU sync point: the mean over the steps since the last call, over all processes."""
        mean = accelerator.reduce(self.total / self.steps, reduction="mean").item()
        self.total.zero_()
        self.steps = 0
        return mean

    def saved(self, accelerator):
        """[the sum, its steps] for a checkpoint: the processes' mean, as every one restores it (a collective)."""
        return [accelerator.reduce(self.total.clone(), reduction="mean").item(), self.steps]


class SkippedSteps:
    """GradScaler skipped the last step if it lowered its scale (fused AdamW: accelerate cannot tell)."""

    def __init__(self, scaler):
        self.scaler = scaler
        self.scale = scaler.get_scale() if scaler else None  # after a resume: the checkpoint's scale

    def last_skipped(self):
        if self.scaler is None:
            return False
        before, self.scale = self.scale, self.scaler.get_scale()
        return self.scale < before


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
_active = [False]  # whether a profile is being taken (scope() marks only then)


def scope(name):
    """A named part of the step in the profile, only while one is taken."""
    if not _active[0]:
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"lab5.{name}")


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
