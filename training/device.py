"""What this device can do, decided once per process (precision, compile, MFU's peak); why each `auto` is here."""
import contextlib
import os
import platform
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from data import files
from training.errors import OutputError, UserError

PEAK_TFLOPS = {  # dense datasheet peak per GPU, for MFU: 16-bit tensor cores (fp32 accumulate), TF32, plain fp32
    "H200 NVL": (835, 418, 60), "H200": (989, 494, 67), "H100 NVL": (835, 418, 60), "H100 SXM": (989, 494, 67),
    "H100 PCIe": (756, 378, 51), "H100": (989, 494, 67), "A100": (312, 156, 19.5), "L40S": (362, 183, 91.6),
    "A10": (125, 62, 31.2), "V100": (125, 15.7, 15.7), "2080 Ti": (53.8, 13.4, 13.4),
}  # the longest name found in the GPU's wins: "H200 NVL" is not an H200 SXM; no TF32 before sm80: fp32's peak


@dataclass(frozen=True)
class Device:
    """The decisions for this process's device, logged in the start-up line and the metrics."""
    name: str
    precision: str
    compile_mode: str
    peak: float | None  # the GPU's tensor-core FLOP/s, for MFU
    note: str  # why an `auto` choice went the way it did
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (sm80+)


def decide(precision_flag, compile_flag):
    """Set this process's GPU (before any CUDA context exists on GPU 0), then decide."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda" if cuda else "cpu")
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    return decisions_for(device.type, capability, precision_flag, compile_flag, device_name(device))


def decisions_for(device_type, capability, precision_flag, compile_flag, name=""):
    """The Device such a process decides, no device touched (the ladder asks for other GPUs' rows too)."""
    cuda = device_type == "cuda"
    precision = resolve_precision(precision_flag, device_type, capability, not cuda and cpu_has_bf16())
    compile_mode, note = resolve_compile(compile_flag, device_type, capability)
    tf32 = cuda and capability >= (8, 0)  # TF32 tensor cores: elsewhere "tf32 on" would measure nothing
    return Device(name, precision, compile_mode, peak_flops(name, precision, tf32) if cuda else None, note, tf32)


def proc_file(name):
    with contextlib.suppress(OSError):
        return Path("/proc", name).read_text()
    return ""  # no /proc (macOS)


def cpu_name():
    found = re.search(r"^model name\s*:(.*)$", proc_file("cpuinfo"), re.MULTILINE)
    return found.group(1).strip() if found else platform.processor() or platform.machine()


def device_name(device):
    """What every measurement names: the GPU's name, or the processor and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_name()}, CPU ({threads} thread{'' if threads == 1 else 's'})"


def resolve_precision(requested, device_type, capability, cpu_bf16=False):
    """auto: bf16 where native (sm80+, AVX512-BF16/AMX), else fp16 on a GPU (a 2080 Ti emulates bf16), fp32."""
    gpu_bf16 = device_type == "cuda" and capability >= (8, 0)
    if requested == "auto":
        if device_type == "cuda":
            return "bf16" if gpu_bf16 else "fp16"
        return "bf16" if cpu_bf16 else "fp32"
    if requested == "fp16" and device_type != "cuda":
        raise UserError("--precision fp16 needs a GPU (use bf16 or fp32 on CPU)")
    if requested == "bf16" and device_type == "cuda" and not gpu_bf16:
        raise UserError(f"--precision bf16: sm{capability[0]}{capability[1]} has no bf16 tensor cores; use fp16")
    return requested


def cpu_has_bf16():
    """Native bf16 math (AVX512-BF16 or AMX); elsewhere bf16 autocast is emulated."""
    flags = proc_file("cpuinfo")
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_compile(requested, device_type, capability):
    """auto: off, as in 12M tokens the faster steps do not win a cold compile back (report/results/README.md)."""
    if requested == "auto":
        return "off", "torch.compile off (measured: 12M tokens did not repay a cold compile, fewer repay it less; " \
                      "--compile regional)"
    if requested != "off" and not compile_supported(device_type, capability):
        raise UserError(f"--compile {requested}: inductor needs sm70+, this GPU is sm{capability[0]}{capability[1]}")
    return requested, ""


def compile_supported(device_type, capability):
    return device_type == "cpu" or capability >= (7, 0)  # inductor's Triton GPU backend needs sm70+


def compile_model(model, mode, backend="inductor"):
    """regional: each block compiled in place (one graph for all twelve; names, DDP unchanged); whole: one."""
    if mode == "regional":
        for block in getattr(model, "module", model).h:  # under DDP: the wrapped model's blocks
            block.compile(backend=backend)
        return model
    return torch.compile(model, backend=backend) if mode == "whole" else model


def use_compile_cache(directory):
    """Every compile cache in `directory`, on the home file system shared by the nodes (a requeued job finds its
    kernels), each folder the user's and writable by no one else (data/files.check_folder): a kernel or header
    planted there would run as the user. Set before inductor compiles (it reads the variables then)."""
    for variable, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        os.environ.setdefault(variable, str(Path(directory) / sub))  # the user's setting wins
        named = "--compile-cache" if os.environ[variable].startswith(str(directory)) else variable
        try:
            files.check_folder(os.environ[variable], named)
        except OutputError as e:
            raise UserError(f"{e}; or --compile off") from None
    # precompiled headers: not under TORCHINDUCTOR_CACHE_DIR but in $TMPDIR/torchinductor_$USER, fixed at this
    # module's import; a folder of that name another user made first would be theirs to fill
    from torch._inductor import codecache
    if hasattr(codecache, "_HEADER_DIR"):  # torch >= 2.6 (before: no precompiled headers)
        codecache._HEADER_DIR = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")


def ddp_handlers(precision):
    """DDP's gradients all-reduced in 16 bits where training is (half the bytes), in its buckets (no copy)."""
    from accelerate.utils import DDPCommunicationHookType as Hook
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
    hook = {"bf16": Hook.BF16, "fp16": Hook.FP16}.get(precision, Hook.NO)
    return [DistributedDataParallelKwargs(comm_hook=hook, gradient_as_bucket_view=True),
            InitProcessGroupKwargs(timeout=timedelta(minutes=5))]  # a lost node: minutes, not NCCL's 30


def eager_mode():
    """Compiled modules run eagerly (evaluation's no_grad and partial batch would recompile); torch >= 2.6."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def flops_per_token(cfg, seq_len, params):
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention (PaLM, appendix B)."""
    return 6 * params + 12 * cfg.n_layer * cfg.n_embd * seq_len


def peak_flops(device_name, precision, tf32=True):
    """The datasheet FLOP/s of this math on this GPU; None for an unknown one."""
    found = [name for name in PEAK_TFLOPS if name.lower() in device_name.lower().replace("-", " ")]
    if not found:
        return None
    half, tf32_peak, fp32 = PEAK_TFLOPS[max(found, key=len)]  # the most specific name: "H200 NVL" before "H200"
    return (half if precision in ("bf16", "fp16") else tf32_peak if tf32 else fp32) * 1e12


def mfu(tokens_per_second, flops_per_tok, peak, world):
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all `world` GPUs together."""
    return flops_per_tok * tokens_per_second / (peak * world) if peak and tokens_per_second else None


def sdpa_backend(cfg, precision, device):
    """The SDPA kernel the dispatcher picks for this model's causal training call; None if torch cannot say."""
    from torch.nn.attention import SDPBackend
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    q = torch.zeros(1, cfg.n_head, cfg.n_positions, cfg.n_embd // cfg.n_head, device=device, dtype=dtype,
                    requires_grad=True)
    with contextlib.suppress(AttributeError, RuntimeError, ValueError):  # a private function: another torch may lack it
        return SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name.lower()
    return None


def gpu_stats(device):
    stats = {"system/gpu_memory_allocated_GiB": torch.cuda.memory_allocated(device) / 2**30,
             "system/gpu_max_memory_allocated_GiB": torch.cuda.max_memory_allocated(device) / 2**30}
    with contextlib.suppress(Exception):  # NVML (nvidia-ml-py); without it only the allocator's numbers
        stats["system/gpu_utilization_percent"] = torch.cuda.utilization(device)
        stats["system/gpu_memory_used_GiB"] = torch.cuda.device_memory_used(device) / 2**30
    return stats
