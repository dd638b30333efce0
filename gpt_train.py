"""Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.

    python tokenizer_train.py && python gpt_train.py          # one GPU (or CPU), own tokenizer
    accelerate launch --num_processes 4 gpt_train.py          # 4 GPUs, DDP
    torchrun --nproc_per_node 2 gpt_train.py --preset tiny    # 2 CPU processes (gloo)
    sbatch slurm/gpt.sh                                       # 1 GPU, checkpoints + requeue
    sbatch --nodes=2 slurm/gpt_multi.sh                       # N nodes x G GPUs
    python gpt_train.py --preset tiny --text ../shared/data/wos-standin/X.txt   # CPU smoke run

The model is GPT2Config's architecture (hidden 768, 12 heads, 12 layers, 1024 positions),
implemented below in ~70 lines so that attention is one SDPA call and nothing runs that training
does not need. Every acceleration has a flag; `auto` picks what works on the device at hand.

Reading order: the model -> device decisions -> token budget and micro-batch -> data ->
checkpoints -> the Trainer (one optimizer step, then what follows it) -> train(), the phases.
"""
import signal

PENDING_SIGNALS = []
if __name__ == "__main__":  # before the slow imports: Slurm's warning or a scancel must not kill us unsaved
    for _sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(_sig, lambda signum, frame: PENDING_SIGNALS.append(signum))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.data_loader import prepare_data_loader, skip_first_batches  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from accelerate.utils import GradScalerKwargs, broadcast_object_list, set_seed  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import GPT2Config  # noqa: E402

from data import files, wos  # noqa: E402
from training.metrics import STOP_EXIT_CODE, SUCCESS_LOSS  # noqa: E402

REPO = Path(__file__).resolve().parent
PRESETS = {  # model shape, batch and peak learning rate; everything else is a flag
    "lab": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, global_batch=64, lr=1e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, micro_batch=8, global_batch=16, lr=3e-3),
}
PEAK_TFLOPS = {  # dense tensor-core peak per GPU (bf16/fp16 with fp32 accumulate, tf32) for MFU
    "H200": (989, 494), "H100 SXM": (989, 494), "H100 PCIe": (756, 378), "H100": (989, 494),
    "A100": (312, 156), "L40S": (362, 183), "A10": (125, 62), "V100": (125, 15.7), "2080 Ti": (53.8, 13.4),
}
CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lab5"  # shared on a cluster


class UserError(Exception):
    """Bad flags, data or run directory: reported as one line, never as a traceback."""


# ----------------------------------------------------------------------------- model

class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.n_head, self.attention = cfg.n_head, attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if self.attention == "sdpa":  # flash attention on sm80+, memory-efficient kernel on older GPUs
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # "eager": the textbook softmax(QK^T / sqrt(d)) V with an explicit (T, T) mask
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 as GPT2Config describes it (pre-LayerNorm, tanh-GELU, tied embeddings), no dropout.
    Parameter names follow transformers' GPT2LMHeadModel without its `transformer.` prefix."""

    def __init__(self, cfg: GPT2Config, attention="sdpa"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for block in self.h:  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, std=cfg.initializer_range / math.sqrt(2 * cfg.n_layer))

    def _init(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def model_config(args, vocab_size, eot_id):
    """GPT2Config of the run's shape, vocabulary padded to a multiple of 64 (tensor-core friendly)."""
    padded = (vocab_size + 63) // 64 * 64
    return GPT2Config(vocab_size=padded, n_positions=args.seq_len, n_embd=args.n_embd, n_layer=args.n_layer,
                      n_head=args.n_head, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=eot_id, eos_token_id=eot_id)


def flops_per_token(cfg, seq_len, params):
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention (PaLM, appendix B)."""
    return 6 * params + 12 * cfg.n_layer * cfg.n_embd * seq_len


# ----------------------------------------------------------------------------- device decisions

def resolve_precision(requested, device_type, capability, cpu_bf16=False):
    """auto: bf16 on sm80+ GPUs (Ampere and newer have bf16 tensor cores) and on CPUs with native
    bf16 (AVX512-BF16/AMX); fp16 + GradScaler on older GPUs — on a 2080Ti (sm75) torch would
    *emulate* bf16, without tensor cores; fp32 on other CPUs, where bf16 is emulated too."""
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
    """Native bf16 math (AVX512-BF16 or AMX, from /proc/cpuinfo); elsewhere bf16 autocast is emulated."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_compile(requested, device_type, capability):
    """(mode, note). auto: `regional` on sm80+ GPUs — each transformer block compiled on its own,
    so the twelve identical blocks share one graph and the cold compile is a fraction of a
    whole-model compile. Off on Turing (sm75), which recent Triton no longer targets, and on CPU,
    where it measured no faster (benchmarks/gpt_bench.py)."""
    if requested != "auto":
        return requested, ""
    if device_type == "cpu":
        return "off", "torch.compile off on CPU (no gain measured; --compile regional to force)"
    if capability < (8, 0):
        return "off", f"torch.compile skipped: Triton does not target sm{capability[0]}{capability[1]}"
    return "regional", ""


def compile_model(model, mode, backend="inductor"):
    """The module the training steps call. regional: the blocks compiled in place (parameter names,
    checkpoints and DDP unchanged); whole: one graph of the whole model (compare them in the ladder)."""
    if mode == "regional":
        for block in getattr(model, "module", model).h:  # under DDP: the wrapped model's blocks
            block.compile(backend=backend)
        return model
    return torch.compile(model, backend=backend) if mode == "whole" else model


def use_compile_cache(directory):
    """Keep inductor's and Triton's caches in `directory` (default ~/.cache/lab5/torch-compile: the
    home file system, shared by a cluster's nodes, unlike inductor's default /tmp), so that a
    second run, or a requeued job on another node, finds its kernels compiled. User settings win."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(directory) / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path(directory) / "triton"))


def eager_mode():
    """Run compiled modules eagerly (evaluation: no_grad and a partial last batch would each
    recompile; torch >= 2.6). Older torch: a no-op, and those recompiles happen."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def peak_flops(device_name, precision):
    for name, (half, tf32) in PEAK_TFLOPS.items():
        if name.lower() in device_name.lower().replace("-", " "):
            return (half if precision in ("bf16", "fp16") else tf32) * 1e12
    return None


def mfu(tokens_per_second, flops_per_tok, peak, world):
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all `world` GPUs together."""
    return flops_per_tok * tokens_per_second / (peak * world) if peak and tokens_per_second else None


def gpu_stats(device):
    stats = {"gpu/memory_allocated_GiB": torch.cuda.memory_allocated(device) / 2**30,
             "gpu/max_memory_allocated_GiB": torch.cuda.max_memory_allocated(device) / 2**30}
    try:  # NVML (nvidia-ml-py); without it only the allocator's numbers
        stats["gpu/utilization_percent"] = torch.cuda.utilization(device)
        stats["gpu/memory_used_GiB"] = torch.cuda.device_memory_used(device) / 2**30
    except Exception:
        pass
    return stats


# ----------------------------------------------------------------------------- token budget, micro-batch

@dataclass(frozen=True)
class Budget:
    """The token budget in whole micro-batches.

    One optimizer step = `accum` micro-batch rounds; one round = `micro_batch` sequences on each
    of `world` processes. The budget is rounded up to whole rounds (`total_micro`), so the last
    step may accumulate fewer rounds; the gradient is then averaged over those it had.
    """
    micro_batch: int
    world: int
    accum: int
    seq_len: int
    total_micro: int

    @property
    def tokens_per_micro(self):  # all processes together
        return self.micro_batch * self.world * self.seq_len

    @property
    def total_steps(self):
        return math.ceil(self.total_micro / self.accum)

    def micro_in_step(self, micro_done):
        """Rounds in the step that starts after `micro_done` rounds: accum, fewer only at the very end."""
        return min(self.accum, self.total_micro - micro_done)


def plan_budget(tokens, global_batch, micro_batch, world, seq_len):
    if global_batch % (micro_batch * world):
        raise UserError(f"--global-batch {global_batch} is not a multiple of micro-batch {micro_batch} x "
                        f"{world} processes")
    per_micro = micro_batch * world * seq_len
    return Budget(micro_batch, world, global_batch // (micro_batch * world), seq_len, math.ceil(tokens / per_micro))


def fit_micro_batch(global_batch, world, limit):
    """The largest micro-batch <= limit that divides this process's share of the global batch."""
    if global_batch % world:
        raise UserError(f"--global-batch {global_batch} cannot be split over {world} processes")
    share = global_batch // world
    return max(m for m in range(1, min(limit, share) + 1) if share % m == 0)


def agree_on_micro_batch(accelerator, micro):
    """The smallest micro-batch any process found: the GPUs of one job may differ in free memory, and
    processes accumulating different numbers of micro-batches would wait on each other for ever."""
    return int(accelerator.gather(torch.tensor([micro], device=accelerator.device)).min())


def find_micro_batch(try_step, share):
    """The largest divisor of `share` for which try_step(m) runs without running out of memory:
    share, share/2, ... (divisors, largest first); out-of-memory errors are caught and freed."""
    for m in sorted((d for d in range(1, share + 1) if share % d == 0), reverse=True):
        try:
            try_step(m)
            return m
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
    raise UserError("not even a micro-batch of 1 sequence fits on this GPU")


def probe_micro_batch(model, args, precision, device, share):
    """--micro-batch auto on a GPU: a real forward + backward per candidate, with a ballast the size of
    AdamW's two moments and DDP's gradient buckets (allocated later). Remembered per GPU name and
    shape in ~/.cache/lab5/micro_batch.json; delete an entry to probe again."""
    key = (f"{torch.cuda.get_device_name(device)}|{args.n_layer}x{args.n_embd}|seq {args.seq_len}|vocab "
           f"{model.cfg.vocab_size}|{precision}|{args.attention}")
    cache = CACHE_HOME / "micro_batch.json"
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in known:
        return fit_micro_batch(share, 1, known[key]), "remembered"
    n_params = sum(p.numel() for p in model.parameters())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def try_step(m):
        ballast = torch.empty(3 * n_params, dtype=torch.float32, device=device)
        batch = torch.zeros(m, args.seq_len + 1, dtype=torch.long, device=device)  # no RNG: training unchanged
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            model(batch[:, :-1], batch[:, 1:]).backward()
        model.zero_grad(set_to_none=True)
        del ballast

    found = find_micro_batch(try_step, share)
    known[key] = found
    files.write_json(cache, known)
    return found, "probed"


# ----------------------------------------------------------------------------- data

def batch_stream(blocks, accelerator, micro_batch, global_batch, seed, consumed):
    """This process's micro-batches, epoch after epoch, starting after the first `consumed`.

    Each epoch's order is fixed by (seed, epoch) (wos.epoch_loader), so the position is two
    integers and a resumed run sees exactly the batches an uninterrupted one would have. Each
    epoch is cut to whole global batches: a run on N processes then sees what one process sees,
    across epoch ends too (uneven shards would otherwise drop a different remainder). No
    worker processes: stacking a batch of token ids is tiny next to a training step, and workers
    would be started anew at every epoch; on a GPU the batch goes through pinned memory, copied
    asynchronously.
    """
    cuda = accelerator.device.type == "cuda"

    def loader(epoch):  # sharded across processes by accelerate
        dl = wos.epoch_loader(blocks, micro_batch, seed, epoch, whole=global_batch, pin_memory=cuda, num_workers=0)
        return prepare_data_loader(dl, accelerator.device, num_processes=accelerator.num_processes,
                                   process_index=accelerator.process_index, put_on_device=True,
                                   rng_types=[], non_blocking=cuda)

    per_epoch = len(loader(0))
    if per_epoch == 0:
        raise UserError(f"{len(blocks)} training blocks are fewer than one global batch ({global_batch} sequences)")
    epoch, skip = divmod(consumed, per_epoch)
    while True:
        yield from skip_first_batches(loader(epoch), skip) if skip else loader(epoch)
        epoch, skip = epoch + 1, 0


@torch.no_grad()
def evaluate(model, blocks, accelerator, micro_batch, max_batches):
    """Mean validation loss per token over the first max_batches micro-batches of each process's
    shard, with the eager modules: evaluation must not trigger compilations."""
    model.eval()
    loader = prepare_data_loader(wos.epoch_loader(blocks, micro_batch, seed=0, epoch=0, drop_last=False),
                                 accelerator.device, num_processes=accelerator.num_processes,
                                 process_index=accelerator.process_index, put_on_device=True, rng_types=[])
    total = torch.zeros(2, device=accelerator.device)
    with eager_mode():
        for i, batch in enumerate(loader):
            if i == max_batches:
                break
            with accelerator.autocast():
                loss = model(batch[:, :-1], batch[:, 1:]).float()
            total += torch.stack([loss * len(batch), torch.tensor(float(len(batch)), device=total.device)])
    total = accelerator.reduce(total, reduction="sum")
    model.train()
    return (total[0] / total[1]).item() if total[1] else float("nan")


# ----------------------------------------------------------------------------- checkpoints

MANIFEST = "manifest.json"  # written last: a checkpoint without a matching one is incomplete or damaged


def save_checkpoint(accelerator, out_dir, state, keep=2):
    """accelerate's save_state into ckpt-N.tmp, a manifest (size and sha256 of every file), then an
    atomic rename: a killed write leaves no ckpt-N, and later damage is found by verify_checkpoint."""
    final = out_dir / f"ckpt-{state['step']:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    # model, optimizer, GradScaler, every process's RNG states; torch.save format because safetensors
    # cannot hold the tied lm_head/wte weight and says so at every save
    accelerator.save_state(str(tmp), safe_serialization=False)
    accelerator.wait_for_everyone()  # every process's files are on disk before the manifest and the rename
    if accelerator.is_main_process:
        files.write_json(tmp / "trainer_state.json", state)
        manifest = {p.name: {"bytes": p.stat().st_size, "sha256": files.sha256_file(p)}
                    for p in sorted(tmp.iterdir()) if p.is_file()}
        files.write_json(tmp / MANIFEST, manifest)
        if final.exists():  # the same step saved before (a resumed run stopped again at once)
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(out_dir.glob("ckpt-*[0-9]"))[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def verify_checkpoint(path):
    """None if every file matches the manifest, else why not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest (an interrupted or older checkpoint)"
    for name, expected in manifest.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {expected['bytes']}"
        if files.sha256_file(file) != expected["sha256"]:
            return f"{name} does not match its checksum"
    return None


def latest_checkpoint(out_dir):
    """(the newest checkpoint that verifies, [(name, why skipped) for newer ones that did not])."""
    skipped = []
    for path in sorted(Path(out_dir).glob("ckpt-*[0-9]"), reverse=True):  # complete renames only
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path.name, problem))
    return None, skipped


def check_same_run(saved, current):
    """A resume continues the same run: refuse, in one line, anything that would change it."""
    for key, value in current.items():
        if key in saved and saved[key] != value:
            raise UserError(f"the checkpoint was made with {key} = {saved[key]}, this run has {value}; "
                            f"resume with the same settings or pick a new --out-dir")


class StopFlag:
    """USR1/TERM (Slurm's warning before the time limit, scancel) and Ctrl-C: finish the step,
    checkpoint, exit with STOP_EXIT_CODE. A second Ctrl-C aborts at once."""
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.signal = signal.Signals(PENDING_SIGNALS[0]).name if PENDING_SIGNALS else None
        self.previous = {sig: signal.signal(sig, self._set) for sig in self.SIGNALS}
        return self

    def _set(self, signum, frame):
        if signum == signal.SIGINT:
            if self.signal == "SIGINT":
                raise KeyboardInterrupt
            print("\nCtrl-C: checkpointing after this step (Ctrl-C again aborts without saving)", file=sys.stderr)
        self.signal = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------- the loop

class Throughput:
    """Wall-clock bookkeeping. A process's first step pays for compilation and warm-up: its extra
    time over the mean steady step is `compile_seconds`; tokens/s and MFU count only the steps
    after it. Evaluation and checkpoints count in neither (only in the run's total seconds)."""

    def __init__(self, state):
        self.state = state  # train_seconds, steady_seconds, steady_tokens, compile_seconds: survive resumes
        self.first_step = None
        self.window = [0.0, 0]  # steady seconds, tokens since the last log point

    def step_done(self, seconds, tokens, first):
        self.state["train_seconds"] += seconds
        if first:
            self.first_step = seconds
            return
        self.state["steady_seconds"] += seconds
        self.state["steady_tokens"] += tokens
        self.window[0] += seconds
        self.window[1] += tokens

    def window_tokens_per_second(self):
        seconds, tokens = self.window
        self.window = [0.0, 0]
        return tokens / seconds if seconds else None

    def close(self, steady_steps):
        """At the end of this process's part of the run: add its compile seconds."""
        if self.first_step is not None and steady_steps:
            mean_step = self.state["steady_seconds"] / steady_steps
            self.state["compile_seconds"] += max(0.0, self.first_step - mean_step)

    def tokens_per_second(self):
        """Steady state; a run of one step has no steady steps, and then that step counts."""
        s = self.state
        return s["steady_tokens"] / s["steady_seconds"] if s["steady_seconds"] else s["tokens_seen"] / s["train_seconds"]


class Trainer:
    """One optimizer step at a time (_run_step); its timed end (_end_of_step: logging, the stop
    decision); then what is kept out of the timing (_aside: evaluation, checkpoint). Like
    pytorch/examples' DDP Trainer._run_batch / _run_epoch."""

    def __init__(self, run, accelerator, model, train_model, optimizer, budget, blocks, state, stop):
        self.run, self.acc, self.model, self.train_model = run, accelerator, model, train_model
        self.optimizer, self.budget, self.blocks, self.state, self.stop = optimizer, budget, blocks, state, stop
        self.args = run.args
        self.writer = SummaryWriter(run.out_dir) if accelerator.is_main_process else None
        self.perf = Throughput(state)
        # the loss is summed on the device (no sync per step) and read at log points
        loss_sum, self.steps_in_sum = state.pop("loss_window", [0.0, 0])
        self.loss_sum = torch.tensor(loss_sum, device=accelerator.device)
        self.steady_steps = 0

    def lr_at(self, step):
        """Linear warm-up, then cosine decay to min_lr_ratio x peak."""
        peak, total = self.args.lr, self.budget.total_steps
        warmup = max(1, int(self.args.warmup * total))
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return peak * (self.args.min_lr_ratio + (1 - self.args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def fit(self):
        s = self.state
        batches = batch_stream(self.blocks["train"], self.acc, self.budget.micro_batch, self.args.global_batch,
                               self.args.seed, s["micro_batches"])
        bar = tqdm(total=self.budget.total_steps, initial=s["step"], disable=not self.acc.is_main_process,
                   desc="train", mininterval=2)
        self.train_model.train()
        first = True
        with bar:
            while s["step"] < self.budget.total_steps:
                t0 = time.perf_counter()
                grad_norm, tokens = self._run_step(batches)
                stopping = self._end_of_step(grad_norm, bar, first)
                self.perf.step_done(time.perf_counter() - t0, tokens, first)
                bar.update()
                self.steady_steps += not first
                first = False
                if self._aside(stopping):
                    break
        self.perf.close(self.steady_steps)
        if self.writer:
            self.writer.flush()

    def _run_step(self, batches):
        """One optimizer step: its micro-batches (gradients all-reduced after the last only), clip, update."""
        s, n_micro = self.state, self.budget.micro_in_step(self.state["micro_batches"])
        for micro in range(n_micro):
            batch = next(batches)
            sync = micro == n_micro - 1
            with contextlib.nullcontext() if sync else self.acc.no_sync(self.model):
                loss = self.train_model(batch[:, :-1], batch[:, 1:])
                self.acc.backward(loss / n_micro)
            self.loss_sum += loss.detach() / n_micro
        grad_norm = self.acc.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(s["lr_step"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        s["lr_step"] += not self.acc.optimizer_step_was_skipped  # fp16: a skipped step does not advance the schedule
        s["step"] += 1
        s["micro_batches"] += n_micro
        s["tokens_seen"] += n_micro * self.budget.tokens_per_micro
        self.steps_in_sum += 1
        return grad_norm, n_micro * self.budget.tokens_per_micro

    def _end_of_step(self, grad_norm, bar, first):
        """The timed end of a step: logging and the stop decision (sync points), or an explicit sync
        where the step's GPU work must be finished before the clock stops (first step, before eval
        or checkpoint). True when a signal asked to stop."""
        s, args = self.state, self.args
        if s["step"] % args.log_every == 0 or s["step"] == self.budget.total_steps:
            self._log(grad_norm, bar)
        elif (first or self._eval_due() or self._ckpt_due()) and self.acc.device.type == "cuda":
            torch.cuda.synchronize()
        return self._stop_requested()

    def _eval_due(self):  # the final evaluation comes after the loop
        step = self.state["step"]
        return step % self.args.eval_every == 0 and step != self.budget.total_steps

    def _ckpt_due(self):
        step = self.state["step"]
        return bool(self.args.ckpt_every and step % self.args.ckpt_every == 0) or step == self.budget.total_steps

    def _aside(self, stopping):
        """Evaluation and checkpoints as due (untimed); True when the run stops here on a signal."""
        s, last = self.state, self.state["step"] == self.budget.total_steps
        if self._eval_due():
            val = evaluate(self.model, self.blocks["validation"], self.acc, self.budget.micro_batch,
                           self.args.val_batches)
            s["val_losses"].append([s["step"], val])
            if self.writer:
                self.writer.add_scalar("val/loss", val, s["step"])
        if stopping or self._ckpt_due():
            window = [self.loss_sum.item(), self.steps_in_sum]  # the losses since the last log point, resumed too
            save_checkpoint(self.acc, self.run.out_dir, {**s, "loss_window": window, "run": self.run.identity})
        if stopping and not last:
            if self.acc.is_main_process:
                print(f"\n{self.stop.signal or 'signal'}: checkpointed at step {s['step']}; run again with "
                      f"--out-dir {self.run.out_dir} to resume", file=sys.stderr)
            return True
        return False

    def _stop_requested(self):
        """Whether any process got a stop signal. With several processes the flag is all-reduced every
        step (a small sync point), so all stop after the same step, well within torchrun's 30 s grace."""
        flag = self.stop.signal is not None
        if self.acc.num_processes == 1:
            return flag
        return self.acc.reduce(torch.tensor(float(flag), device=self.acc.device), reduction="sum").item() > 0

    def _log(self, grad_norm, bar):
        """A CPU-GPU sync point, every log_every steps: the mean loss of the steps since the last one."""
        s = self.state
        mean_loss = self.acc.reduce(self.loss_sum / self.steps_in_sum, reduction="mean").item()
        self.loss_sum.zero_()
        self.steps_in_sum = 0
        if not math.isfinite(mean_loss):
            ckpt, _ = latest_checkpoint(self.run.out_dir)
            raise UserError(f"loss is {mean_loss} at step {s['step']}; stopped. Last good checkpoint: "
                            f"{ckpt or 'none'} (try a lower --lr)")
        s["losses"].append([s["step"], mean_loss])
        tps = self.perf.window_tokens_per_second()
        if tps:
            s["throughput"].append([s["step"], tps])
        if self.writer:
            scalars = {"train/loss": mean_loss, "train/lr": self.lr_at(s["lr_step"] - 1),
                       "train/grad_norm": float(grad_norm)}
            if tps:
                scalars["perf/tokens_per_second"] = tps
                scalars["perf/step_ms"] = self.budget.accum * self.budget.tokens_per_micro / tps * 1e3
                if self.run.peak:
                    scalars["perf/mfu"] = mfu(tps, self.run.flops_per_token, self.run.peak, self.acc.num_processes)
            if self.acc.device.type == "cuda":
                scalars.update(gpu_stats(self.acc.device))
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, s["step"])
        bar.set_postfix(loss=f"{mean_loss:.3f}", tok_s=f"{tps or 0:,.0f}", refresh=False)  # drawn by update()


# ----------------------------------------------------------------------------- the phases

@dataclass
class Run:
    """What is known about the run, filled in phase by phase; read by the Trainer and the metrics."""
    args: argparse.Namespace
    precision: str
    compile_mode: str
    world: int
    device_name: str
    out_dir: Path = None
    identity: dict = None  # what a resume must match (check_same_run)
    text: Path = None
    cfg: GPT2Config = None
    params: int = 0
    flops_per_token: float = 0.0
    peak: float | None = None  # the GPU's tensor-core FLOP/s, for MFU
    note: str = ""  # why an `auto` choice went the way it did, for the start-up line


def decide_device(args):
    """Device, precision and compile, decided once per process after its GPU is set: the Accelerator
    and the Run that records them."""
    cuda = torch.cuda.is_available()
    capability = (0, 0)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # before any CUDA context exists on GPU 0
        capability = torch.cuda.get_device_capability()
    device_type = "cuda" if cuda else "cpu"
    precision = resolve_precision(args.precision, device_type, capability, not cuda and cpu_has_bf16())
    compile_mode, note = resolve_compile(args.compile, device_type, capability)
    handlers = [GradScalerKwargs(init_scale=2.0**12)] if precision == "fp16" else []  # 2^16 overflows first steps
    # cpu=True where there is no GPU: only then does accelerate turn torchrun's processes into gloo ranks
    accelerator = Accelerator(mixed_precision={"fp32": "no"}.get(precision, precision), cpu=not cuda,
                              kwargs_handlers=handlers)
    if cuda and args.tf32 == "on":
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for whatever stays in fp32
    if compile_mode != "off":
        use_compile_cache(args.compile_cache)
    device_name = torch.cuda.get_device_name() if cuda else f"{files.cpu_name()}, CPU ({torch.get_num_threads()} threads)"
    run = Run(args, precision, compile_mode, accelerator.num_processes, device_name, note=note,
              peak=peak_flops(device_name, precision) if cuda else None)
    return accelerator, run


def open_run_dir(run, accelerator, stack):
    """Check the outputs, lock the run's folder (a finished run is never overwritten), and find the
    newest verified checkpoint."""
    args, ckpt = run.args, None
    out_dir = run.out_dir = args.out_dir or REPO / "runs" / "gpt" / time.strftime("%Y%m%d-%H%M%S")
    if accelerator.is_main_process:
        files.check_output_dir(out_dir, "--out-dir")
        if args.metrics_out:
            files.check_output(args.metrics_out, "--metrics-out")
        stack.enter_context(files.RunLock(out_dir))
        if (out_dir / "metrics.json").exists():
            raise UserError(f"{out_dir} holds a finished run (metrics.json); pick a new --out-dir")
        ckpt, skipped = latest_checkpoint(out_dir)
        for name, why in skipped:
            print(f"warning: skipping checkpoint {name}: {why}", file=sys.stderr)
        if ckpt and args.resume == "never":
            raise UserError(f"{out_dir} has checkpoint {ckpt.name} and --resume never; pick a new --out-dir")
    if accelerator.num_processes > 1:  # the main process's choice (its clock named the default folder)
        ckpt, run.out_dir = broadcast_object_list([ckpt, out_dir])
    return ckpt


def load_blocks(args, accelerator, text, tokenizer):
    """Text -> split -> token blocks, tokenised once on the main process (the others read the cache)."""
    with accelerator.main_process_first():
        splits = wos.load_splits(text, args.val_fraction, args.seed, args.cache_dir)
        return wos.tokenize_blocks(splits, tokenizer, args.seq_len + 1)


def build_model(run, tokenizer, accelerator, saved_run):
    """The model, its micro-batch and token budget, AdamW (decay on matrices only); fills in the
    Run's config, parameter count and FLOPs per token."""
    args = run.args
    run.cfg = model_config(args, tokenizer.get_vocab_size(), tokenizer.token_to_id(wos.EOT))
    model = GPT(run.cfg, args.attention).to(accelerator.device)
    run.params = sum(p.numel() for p in model.parameters())
    run.flops_per_token = flops_per_token(run.cfg, args.seq_len, run.params - run.cfg.n_positions * run.cfg.n_embd)
    if saved_run:  # a resume keeps the micro-batch it started with: the data position counts micro-batches
        micro, how = saved_run["micro_batch"], "as the checkpoint"
    elif args.micro_batch == "auto" and accelerator.device.type == "cuda":
        micro, how = probe_micro_batch(model, args, run.precision, accelerator.device, args.global_batch // run.world)
        micro = agree_on_micro_batch(accelerator, micro)
    elif args.micro_batch == "auto":  # CPU: the preset's, at most this process's share
        micro, how = fit_micro_batch(args.global_batch, run.world, args.preset_micro_batch), "preset"
    else:
        micro, how = args.micro_batch, "flag"
    budget = plan_budget(args.tokens, args.global_batch, micro, run.world, args.seq_len)
    run.identity["micro_batch"] = budget.micro_batch
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings decay; biases, norms don't
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                                  eps=1e-8, fused=args.fused_adamw == "on")
    return model, optimizer, budget, how


def run_identity(args, tokenizer, world):
    """What a checkpoint's run depends on (the micro-batch is added once chosen): a resume with
    anything else is refused before any work."""
    tokenizer_file = Path(args.tokenizer)
    return {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd, "seq_len": args.seq_len,
            "vocab_size": tokenizer.get_vocab_size(), "tokenizer": files.sha256_file(tokenizer_file)[:16]
            if tokenizer_file.is_file() else args.tokenizer, "tokens": args.tokens,
            "global_batch": args.global_batch, "world_size": world, "seed": args.seed}


def startup_line(run, tokenizer, budget, micro_how):
    args = run.args
    parts = [f"GPT-2 {run.params / 1e6:.1f}M params, vocab {tokenizer.get_vocab_size()} -> {run.cfg.vocab_size}",
             f"{run.device_name} x {run.world}", f"precision {run.precision}", f"compile {run.compile_mode}",
             f"attention {args.attention}", f"tf32 {args.tf32}", f"fused AdamW {args.fused_adamw}",
             f"batch {args.global_batch} x {args.seq_len} (micro {budget.micro_batch} [{micro_how}] x {run.world} x "
             f"accum {budget.accum})",
             f"{budget.total_steps} steps for {budget.total_micro * budget.tokens_per_micro:,} tokens"]
    return ", ".join(parts)


def final_metrics(run, state, stats, val_loss, t_start, tps):
    v, args = stats["validation"], run.args
    tail = [loss for _, loss in state["losses"][-5:]]  # the last step is always logged: never empty
    final_train_loss = sum(tail) / len(tail)
    steady = state["steady_seconds"] > 0
    return {
        "tokens_seen": state["tokens_seen"], "steps": state["step"], "final_train_loss": final_train_loss,
        "final_val_loss": val_loss,
        "val_bits_per_byte": val_loss / math.log(2) * (v["tokens"] + v["docs"]) / v["bytes"],
        "success": final_train_loss < SUCCESS_LOSS, "train_seconds": round(state["train_seconds"], 3),
        "compile_seconds": round(state["compile_seconds"], 3) if steady else None,
        "total_seconds": round(time.perf_counter() - t_start, 3), "tokens_per_second": tps,
        "mfu": mfu(tps, run.flops_per_token, run.peak, run.world), "precision": run.precision,
        "compile": run.compile_mode, "attention": args.attention, "world_size": run.world,
        "device_name": run.device_name, "params": run.params, "vocab_size": run.cfg.vocab_size,
        "tokenizer": args.tokenizer, "text": str(run.text), "preset": args.preset, "global_batch": args.global_batch,
        "micro_batch": run.identity["micro_batch"], "seq_len": args.seq_len, "resumed": bool(state.get("resumed")),
        "torch": torch.__version__, "command": "python gpt_train.py " + " ".join(args.argv),
        "loss_curve": state["losses"], "val_curve": state["val_losses"] + [[state["step"], val_loss]],
        "throughput_curve": state["throughput"],
    }


def train(args):
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stop = stack.enter_context(StopFlag())  # from the start: a signal during set-up must not kill the job
        stack.callback(AcceleratorState._reset_state, True)  # so that main() can run again in this process

        # ---- device decisions, run directory and inputs (checked before any work), data
        accelerator, run = decide_device(args)
        ckpt = open_run_dir(run, accelerator, stack)
        run.text = wos.resolve_text(args.text, download=not args.no_download and accelerator.is_main_process)
        tokenizer = wos.load_tokenizer(args.tokenizer)
        saved = json.loads((ckpt / "trainer_state.json").read_text()) if ckpt else None
        run.identity = run_identity(args, tokenizer, run.world)
        if saved:  # a resume must continue the same run
            check_same_run(saved["run"], run.identity)
        set_seed(args.seed)
        blocks, stats = load_blocks(args, accelerator, run.text, tokenizer)

        # ---- model, optimizer, budget
        model, optimizer, budget, micro_how = build_model(run, tokenizer, accelerator, saved and saved["run"])
        model, optimizer = accelerator.prepare(model, optimizer)
        train_model = compile_model(model, run.compile_mode)
        state = {"step": 0, "lr_step": 0, "micro_batches": 0, "tokens_seen": 0, "train_seconds": 0.0,
                 "steady_seconds": 0.0, "steady_tokens": 0, "compile_seconds": 0.0, "losses": [],
                 "val_losses": [], "throughput": []}
        if ckpt:
            accelerator.load_state(str(ckpt))
            state = {**state, **{k: v for k, v in saved.items() if k != "run"}, "resumed": True}
        if accelerator.is_main_process:
            print(startup_line(run, tokenizer, budget, micro_how) + (f"; {run.note}" if run.note else "")
                  + (f"; resuming at step {state['step']} from {ckpt}" if ckpt else ""))
            print(f"data: {run.text} ({stats['train']['docs']:,} train docs, {len(blocks['train']):,} blocks; "
                  f"{stats['validation']['docs']} validation docs); tokenizer {args.tokenizer}")
            if not ckpt:
                files.write_json(run.out_dir / "args.json", vars(args))

        # ---- the loop
        trainer = Trainer(run, accelerator, model, train_model, optimizer, budget, blocks, state, stop)
        trainer.fit()
        if state["step"] < budget.total_steps:
            raise SystemExit(STOP_EXIT_CODE)

        # ---- the end: validation, metrics
        val_loss = evaluate(model, blocks["validation"], accelerator, budget.micro_batch, args.val_batches)
        metrics = final_metrics(run, state, stats, val_loss, t_start, trainer.perf.tokens_per_second())
        if accelerator.is_main_process:
            trainer.writer.add_scalar("val/loss", val_loss, state["step"])
            trainer.writer.close()
            for path in [run.out_dir / "metrics.json"] + ([args.metrics_out] if args.metrics_out else []):
                files.write_json(path, metrics)
            print(summary_line(metrics))
        return metrics


def summary_line(m):
    compile_part = f", compile {m['compile_seconds']:.1f} s" if m["compile"] != "off" and m["compile_seconds"] else ""
    mfu_part = f", MFU {m['mfu']:.1%}" if m["mfu"] else ""
    verdict = f"success (< {SUCCESS_LOSS:g})" if m["success"] else f"NOT below {SUCCESS_LOSS:g}"
    return (f"{m['tokens_seen']:,} tokens in {m['train_seconds']:.1f} s ({m['tokens_per_second']:,.0f} tokens/s steady"
            f"{mfu_part}{compile_part}): train loss {m['final_train_loss']:.3f}, val loss {m['final_val_loss']:.3f} "
            f"({m['val_bits_per_byte']:.3f} bits/byte) -> {verdict}")


# ----------------------------------------------------------------------------- flags

def micro_batch_flag(text):
    if text == "auto":
        return text
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return int(text)


def finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--preset", choices=list(PRESETS), default="lab", help="model and batch shape (default: %(default)s)")
    add("--text", type=Path, default=None, help="X.txt, one document per line (default: data/WebOfScience/"
                                                "WOS46985/X.txt, downloaded if missing)")
    add("--tokenizer", default=None, help="tokenizer.json or 'gpt2' (default: data/tokenizer/tokenizer.json "
                                          "if present, else gpt2)")
    add("--out-dir", type=Path, default=None, help="checkpoints, TensorBoard, metrics of this run; an existing one "
                                                   "with a checkpoint is resumed (default: new runs/gpt/<time>/)")
    add("--resume", choices=["auto", "never"], default="auto", help="auto: continue from the newest verified "
                                                                    "checkpoint in --out-dir (default: %(default)s)")
    add("--tokens", type=int, default=12_000_000, help="training budget in tokens, all processes "
                                                       "(default: %(default)s)")
    for name in ("n_layer", "n_head", "n_embd", "seq_len", "global_batch"):
        add(f"--{name.replace('_', '-')}", type=int, default=None,
            help=f"override the preset (lab: {PRESETS['lab'][name]}, tiny: {PRESETS['tiny'][name]})")
    add("--micro-batch", type=micro_batch_flag, default="auto",
        help="sequences per process per forward pass, or auto: on a GPU the largest that fits (probed once per "
             f"GPU), on CPU the preset's (lab: {PRESETS['lab']['micro_batch']}, tiny: "
             f"{PRESETS['tiny']['micro_batch']}); gradients are accumulated to --global-batch (default: auto)")
    add("--lr", type=finite_float, default=None, help=f"peak learning rate (lab: {PRESETS['lab']['lr']}, "
                                                      f"tiny: {PRESETS['tiny']['lr']})")
    add("--min-lr-ratio", type=finite_float, default=0.1, help="cosine decay ends at lr x this (default: %(default)s)")
    add("--warmup", type=finite_float, default=0.1, help="warm-up, fraction of the steps (default: %(default)s)")
    add("--weight-decay", type=finite_float, default=0.1, help="on matrices only (default: %(default)s)")
    add("--grad-clip", type=finite_float, default=1.0, help="(default: %(default)s)")
    add("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto", help="(default: %(default)s)")
    add("--compile", choices=["auto", "regional", "whole", "off"], default="auto",
        help="torch.compile each transformer block (regional) or the whole model (default: %(default)s: "
             "regional on sm80+ GPUs, off on Turing and CPU)")
    add("--compile-cache", type=Path, default=CACHE_HOME / "torch-compile",
        help="inductor/Triton cache, kept across runs and nodes (default: %(default)s)")
    add("--attention", choices=["sdpa", "eager"], default="sdpa", help="(default: %(default)s)")
    add("--tf32", choices=["on", "off"], default="on", help="TF32 matmuls for fp32 work (default: %(default)s)")
    add("--fused-adamw", choices=["on", "off"], default="on", help="(default: %(default)s)")
    add("--seed", type=int, default=0, help="weights, data order, split (default: %(default)s)")
    add("--val-fraction", type=finite_float, default=0.005, help="held-out documents (default: %(default)s)")
    add("--eval-every", type=int, default=50, help="steps between validation losses (default: %(default)s)")
    add("--val-batches", type=int, default=20, help="micro-batches per validation (default: %(default)s)")
    add("--log-every", type=int, default=10, help="steps between logged points (default: %(default)s)")
    add("--ckpt-every", type=int, default=100, help="steps between checkpoints; 0 = only at the end and on "
                                                    "signals (default: %(default)s)")
    add("--cache-dir", type=Path, default=None, help="tokenised-data cache (default: data/cache)")
    add("--no-download", action="store_true", help="never try to download the WOS archive")
    add("--metrics-out", type=Path, default=None, help="write the final metrics here as JSON")
    args = p.parse_args(argv)
    preset = PRESETS[args.preset]
    for key in ("n_layer", "n_head", "n_embd", "seq_len", "global_batch", "lr"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    args.preset_micro_batch = preset["micro_batch"]
    args.tokenizer = args.tokenizer or wos.default_tokenizer()
    check_args(p, args)
    return args


def check_args(parser, args):
    if args.tokens <= 0:
        parser.error(f"--tokens must be > 0, got {args.tokens}")
    if min(args.n_layer, args.n_head, args.n_embd, args.seq_len, args.global_batch) <= 0:
        parser.error("model and batch sizes must be > 0")
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if args.preset == "lab" and args.seq_len > 1024:
        parser.error(f"--seq-len {args.seq_len} exceeds GPT-2's 1024 positions")
    if args.lr <= 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    for name in ("eval_every", "val_batches", "log_every"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")


def main(argv=None):
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    try:
        return train(args)
    except (UserError, wos.TextError, files.OutputError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
