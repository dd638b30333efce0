"""Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.

    python tokenizer_train.py && python gpt_train.py          # one GPU (or CPU), own tokenizer
    accelerate launch --num_processes 4 gpt_train.py          # 4 GPUs, DDP
    torchrun --nproc_per_node 2 gpt_train.py --preset tiny    # 2 CPU processes (gloo)
    sbatch slurm/gpt.sh                                       # 1 GPU, checkpoints + requeue
    sbatch slurm/gpt_multi.sh                                 # N nodes x G GPUs
    python gpt_train.py --preset tiny --text ../shared/data/wos-standin/X.txt   # CPU smoke run

The model is GPT2Config's architecture (hidden 768, 12 heads, 12 layers, 1024 positions),
implemented below in ~70 lines so that attention is one SDPA call and nothing runs that
training does not need (benchmarks/gpt_bench.py measures it against transformers'
GPT2LMHeadModel). Every acceleration has a flag, `auto` picks what works on the device at hand,
and the choices are logged in one line at start.
"""
import argparse
import json
import math
import os
import signal
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from accelerate.utils import set_seed
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm
from transformers import GPT2Config

from data import wos

REPO = Path(__file__).resolve().parent
PRESETS = {  # model shape and batch; everything else is a flag
    "lab": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, global_batch=64, lr=1e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, micro_batch=8, global_batch=16, lr=3e-3),
}
PEAK_TFLOPS = {  # dense tensor-core peak per GPU (bf16/fp16 with fp32 accumulate, tf32) for MFU
    "H200": (989, 494), "H100 SXM": (989, 494), "H100 PCIe": (756, 378), "H100": (989, 494),
    "A100": (312, 156), "L40S": (362, 183), "A10": (125, 62), "V100": (125, 15.7), "2080 Ti": (53.8, 13.4),
}
STOP_EXIT_CODE = 3  # "checkpointed on a signal, resume me" (slurm/gpt.sh requeues on it)


class UserError(Exception):
    """Bad flags or data: reported as one line, never as a traceback."""


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


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 as GPT2Config describes it (pre-LayerNorm, tanh-GELU, tied embeddings), no dropout."""

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
            for proj in (block.attn.c_proj, block.mlp[2]):
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


def model_config(preset, vocab_size, eot_id):
    """GPT2Config of the preset, vocabulary padded to a multiple of 64 (tensor-core friendly shapes)."""
    padded = (vocab_size + 63) // 64 * 64
    return GPT2Config(vocab_size=padded, n_positions=preset["seq_len"], n_embd=preset["n_embd"],
                      n_layer=preset["n_layer"], n_head=preset["n_head"], activation_function="gelu_new",
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=eot_id, eos_token_id=eot_id)


def flops_per_token(cfg, seq_len, params):
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention (PaLM, appendix B)."""
    return 6 * params + 12 * cfg.n_layer * cfg.n_embd * seq_len


# ----------------------------------------------------------------------------- device decisions

def resolve_precision(requested, device_type, bf16_supported):
    """auto: bf16 where the hardware has it (sm80+ GPUs; CPUs with AVX512-BF16/AMX), fp16 + GradScaler
    on older GPUs (2080Ti: Turing, no bf16), fp32 on other CPUs (emulated bf16 is slow)."""
    if requested == "auto":
        if device_type == "cuda":
            return "bf16" if bf16_supported else "fp16"
        return "bf16" if bf16_supported else "fp32"
    if requested == "fp16" and device_type != "cuda":
        raise UserError("--precision fp16 needs a GPU (use bf16 or fp32 on CPU)")
    if requested == "bf16" and device_type == "cuda" and not bf16_supported:
        raise UserError("--precision bf16: this GPU has no bfloat16; use fp16")
    return requested


def cpu_has_bf16():
    """Native bf16 math (AVX512-BF16 or AMX, from /proc/cpuinfo); elsewhere bf16 autocast is emulated."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_compile(requested, device_type, capability):
    """auto: on for sm80+ GPUs. Off on Turing (sm75), which recent Triton no longer targets, and on
    CPU, where it measured no faster (benchmarks/gpt_bench.py) and costs a minute of compiling."""
    if requested != "auto":
        return requested == "on", ""
    if device_type == "cpu":
        return False, "torch.compile off on CPU (no gain measured; --compile on to force)"
    if capability < (8, 0):
        return False, f"torch.compile skipped: Triton does not target sm{capability[0]}{capability[1]}"
    return True, ""


def peak_flops(device_name, precision):
    for name, (half, tf32) in PEAK_TFLOPS.items():
        if name.lower() in device_name.lower().replace("-", " "):
            return (half if precision in ("bf16", "fp16") else tf32) * 1e12
    return None


def gpu_stats(device):
    stats = {"gpu/memory_allocated_GiB": torch.cuda.memory_allocated(device) / 2**30,
             "gpu/max_memory_allocated_GiB": torch.cuda.max_memory_allocated(device) / 2**30}
    try:  # NVML (nvidia-ml-py); without it only the allocator's numbers
        stats["gpu/utilization_percent"] = torch.cuda.utilization(device)
        stats["gpu/memory_used_GiB"] = torch.cuda.device_memory_used(device) / 2**30
    except Exception:
        pass
    return stats


# ----------------------------------------------------------------------------- data

def batch_stream(blocks, accelerator, micro_batch, seed, consumed):
    """This process's micro-batches, epoch after epoch, starting after the first `consumed`.

    Each epoch's order is fixed by (seed, epoch) (wos.epoch_loader), so the position is two
    integers and a resumed run sees exactly the batches an uninterrupted one would have.
    """
    cuda = accelerator.device.type == "cuda"

    def loader(epoch):  # sharded across processes by accelerate; pinned memory + async copies on GPU
        dl = wos.epoch_loader(blocks, micro_batch, seed, epoch, pin_memory=cuda, num_workers=2 if cuda else 0)
        return prepare_data_loader(dl, accelerator.device, num_processes=accelerator.num_processes,
                                   process_index=accelerator.process_index, put_on_device=True,
                                   rng_types=[], non_blocking=cuda)

    per_epoch = len(loader(0))
    if per_epoch == 0:
        raise UserError(f"{len(blocks)} training blocks are fewer than one micro-batch per process")
    epoch, skip = divmod(consumed, per_epoch)
    while True:
        yield from skip_first_batches(loader(epoch), skip) if skip else loader(epoch)
        epoch, skip = epoch + 1, 0


@torch.no_grad()
def evaluate(model, blocks, accelerator, micro_batch, max_batches):
    """Mean validation loss per token over the first max_batches micro-batches of each process's shard."""
    model.eval()
    loader = prepare_data_loader(wos.epoch_loader(blocks, micro_batch, seed=0, epoch=0, drop_last=False),
                                 accelerator.device, num_processes=accelerator.num_processes,
                                 process_index=accelerator.process_index, put_on_device=True, rng_types=[])
    total = torch.zeros(2, device=accelerator.device)
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

def latest_checkpoint(out_dir):
    done = sorted(out_dir.glob("ckpt-*[0-9]"))  # complete ones only: written as ckpt-N.tmp, then renamed
    return done[-1] if done else None


def save_checkpoint(accelerator, out_dir, state, keep=2):
    """accelerate's save_state into ckpt-N.tmp, then an atomic rename: a killed write leaves no ckpt-N."""
    final = out_dir / f"ckpt-{state['step']:07d}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    # model, optimizer, GradScaler, every process's RNG states; torch.save format because safetensors
    # cannot hold the tied lm_head/wte weight and says so at every save
    accelerator.save_state(str(tmp), safe_serialization=False)
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        if final.exists():  # the same step saved before (a resumed run stopped again at once)
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(out_dir.glob("ckpt-*[0-9]"))[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


class StopFlag:
    """SIGUSR1/SIGTERM (Slurm's warning before the time limit, scancel, requeue) -> checkpoint, exit."""

    def __init__(self):
        self.signal = None
        self.previous = {sig: signal.signal(sig, self._set) for sig in (signal.SIGUSR1, signal.SIGTERM)}

    def _set(self, signum, frame):
        self.signal = signal.Signals(signum).name

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--preset", choices=list(PRESETS), default="lab", help="model and batch shape (default: %(default)s)")
    a("--text", type=Path, default=None, help="X.txt, one document per line (default: data/WebOfScience/"
                                              "WOS46985/X.txt, downloaded if missing)")
    a("--tokenizer", default=None, help="tokenizer.json or 'gpt2' (default: data/tokenizer/tokenizer.json "
                                        "if present, else gpt2)")
    a("--out-dir", type=Path, default=None, help="checkpoints, TensorBoard, metrics of this run; an existing one "
                                                 "with a checkpoint is resumed (default: new runs/gpt/<time>/)")
    a("--resume", choices=["auto", "never"], default="auto", help="auto: continue from the newest checkpoint "
                                                                  "in --out-dir (default: %(default)s)")
    a("--tokens", type=int, default=12_000_000, help="training budget in tokens, all processes "
                                                     "(default: %(default)s)")
    for name in ("n_layer", "n_head", "n_embd", "seq_len", "micro_batch", "global_batch"):
        a(f"--{name.replace('_', '-')}", type=int, default=None,
          help=f"override the preset (lab: {PRESETS['lab'][name]}, tiny: {PRESETS['tiny'][name]})")
    a("--lr", type=float, default=None, help=f"peak learning rate (lab: {PRESETS['lab']['lr']}, "
                                               f"tiny: {PRESETS['tiny']['lr']})")
    a("--min-lr-ratio", type=float, default=0.1, help="cosine decay ends at lr x this (default: %(default)s)")
    a("--warmup", type=float, default=0.1, help="warm-up, fraction of the steps (default: %(default)s)")
    a("--weight-decay", type=float, default=0.1, help="on matrices only (default: %(default)s)")
    a("--grad-clip", type=float, default=1.0, help="(default: %(default)s)")
    a("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto", help="(default: %(default)s)")
    a("--compile", choices=["auto", "on", "off"], default="auto", help="torch.compile (default: %(default)s)")
    a("--attention", choices=["sdpa", "eager"], default="sdpa", help="(default: %(default)s)")
    a("--tf32", choices=["on", "off"], default="on", help="TF32 matmuls for fp32 work (default: %(default)s)")
    a("--fused-adamw", choices=["on", "off"], default="on", help="(default: %(default)s)")
    a("--seed", type=int, default=0, help="weights, data order, split (default: %(default)s)")
    a("--val-fraction", type=float, default=0.005, help="held-out documents (default: %(default)s)")
    a("--eval-every", type=int, default=50, help="steps between validation losses (default: %(default)s)")
    a("--val-batches", type=int, default=20, help="micro-batches per validation (default: %(default)s)")
    a("--log-every", type=int, default=10, help="steps between logged points (default: %(default)s)")
    a("--ckpt-every", type=int, default=100, help="steps between checkpoints; 0 = only at the end and on "
                                                  "signals (default: %(default)s)")
    a("--cache-dir", type=Path, default=None, help="tokenised-data cache (default: data/cache)")
    a("--no-download", action="store_true", help="never try to download the WOS archive")
    a("--metrics-out", type=Path, default=None, help="write the final metrics here as JSON")
    args = p.parse_args(argv)
    preset = dict(PRESETS[args.preset])
    for key in list(preset):
        if getattr(args, key, None) is not None:
            preset[key] = getattr(args, key)
    args.shape = preset
    if args.tokens <= 0:
        p.error(f"--tokens must be > 0, got {args.tokens}")
    if min(preset[k] for k in ("n_layer", "n_head", "n_embd", "seq_len", "micro_batch", "global_batch")) <= 0:
        p.error("model and batch sizes must be > 0")
    if preset["n_embd"] % preset["n_head"]:
        p.error(f"--n-embd {preset['n_embd']} is not divisible by --n-head {preset['n_head']}")
    if args.preset == "lab" and preset["seq_len"] > 1024:
        p.error(f"--seq-len {preset['seq_len']} exceeds GPT-2's 1024 positions")
    for name in ("eval_every", "val_batches", "log_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return train(args)
    except (UserError, wos.TextError) as e:
        sys.exit(f"error: {e}")


def train(args):
    t_start = time.perf_counter()
    stop = StopFlag()  # from the start: a signal during data preparation must not kill the job unsaved
    try:
        return _train(args, stop, t_start)
    finally:
        stop.restore()
        # accelerate's state is a per-process singleton: reset it so that main() can run again in
        # the same process (tests, notebooks) with other settings
        AcceleratorState._reset_state(reset_partial_state=True)


def _train(args, stop, t_start):
    shape = args.shape
    cuda = torch.cuda.is_available()
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    compiled, compile_note = resolve_compile(args.compile, "cuda" if cuda else "cpu", capability)
    precision = resolve_precision(args.precision, "cuda" if cuda else "cpu",
                                  torch.cuda.is_bf16_supported() if cuda else cpu_has_bf16())
    # cpu=True where there is no GPU: only then does accelerate turn torchrun's processes into gloo ranks
    accelerator = Accelerator(mixed_precision={"fp32": "no"}.get(precision, precision), cpu=not cuda)
    device = accelerator.device
    if cuda and args.tf32 == "on":
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for whatever stays in fp32
    set_seed(args.seed)
    main_proc = accelerator.is_main_process

    # ---- data (tokenised once, on the main process first; the others then read the cache)
    text = wos.resolve_text(args.text, download=not args.no_download and main_proc)
    tok_spec = args.tokenizer or (str(wos.OWN_TOKENIZER) if wos.OWN_TOKENIZER.exists() else "gpt2")
    tokenizer = wos.load_tokenizer(tok_spec)
    with accelerator.main_process_first():
        splits = wos.load_splits(text, args.val_fraction, args.seed, args.cache_dir)
        blocks, stats = wos.tokenize_blocks(splits, tokenizer.backend_tokenizer, shape["seq_len"] + 1)

    # ---- run directory: resume if it holds a checkpoint, never overwrite a finished run
    out_dir = args.out_dir or REPO / "runs" / "gpt" / time.strftime("%Y%m%d-%H%M%S")
    if (out_dir / "metrics.json").exists():
        raise UserError(f"{out_dir} holds a finished run (metrics.json); pick a new --out-dir")
    ckpt = latest_checkpoint(out_dir) if out_dir.exists() else None
    if ckpt and args.resume == "never":
        raise UserError(f"{out_dir} has checkpoint {ckpt.name} and --resume never; pick a new --out-dir")
    accelerator.wait_for_everyone()
    if main_proc:
        out_dir.mkdir(parents=True, exist_ok=True)

    # ---- model, optimizer
    cfg = model_config(shape, len(tokenizer), tokenizer.convert_tokens_to_ids(wos.EOT))
    model = GPT(cfg, args.attention)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings decay; biases, norms don't
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=shape["lr"], betas=(0.9, 0.95),
                                  eps=1e-8, fused=args.fused_adamw == "on")
    model, optimizer = accelerator.prepare(model, optimizer)
    train_model = torch.compile(model) if compiled else model

    world = accelerator.num_processes
    per_step = shape["micro_batch"] * world
    if shape["global_batch"] % per_step:
        raise UserError(f"--global-batch {shape['global_batch']} is not a multiple of micro-batch "
                        f"{shape['micro_batch']} x {world} processes")
    accum = shape["global_batch"] // per_step
    tokens_per_micro = per_step * shape["seq_len"]  # all processes together
    total_micro = math.ceil(args.tokens / tokens_per_micro)  # the budget, rounded up to whole micro-batches
    total_steps = math.ceil(total_micro / accum)  # the last step may accumulate fewer micro-batches
    warmup = max(1, int(args.warmup * total_steps))

    def lr_at(step):  # linear warm-up, cosine decay to min_lr_ratio x peak
        if step < warmup:
            return shape["lr"] * (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return shape["lr"] * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    state = {"step": 0, "micro_batches": 0, "tokens_seen": 0, "train_seconds": 0.0, "losses": []}
    if ckpt:
        accelerator.load_state(str(ckpt))
        state = json.loads((ckpt / "trainer_state.json").read_text())
    device_name = torch.cuda.get_device_name(device) if cuda else f"cpu ({torch.get_num_threads()} threads)"
    peak = peak_flops(device_name, precision) if cuda else None
    fpt = flops_per_token(cfg, shape["seq_len"], params - cfg.n_positions * cfg.n_embd)
    if main_proc:
        print(f"GPT-2 {params / 1e6:.1f}M params, vocab {len(tokenizer)} -> {cfg.vocab_size}, {device_name} x {world}, "
              f"precision {precision}, compile {'on' if compiled else 'off'}, attention {args.attention}, "
              f"tf32 {args.tf32}, fused AdamW {args.fused_adamw}; batch {shape['global_batch']} x {shape['seq_len']} "
              f"(micro {shape['micro_batch']} x {world} x accum {accum}), {total_steps} steps for "
              f"{total_micro * tokens_per_micro:,} tokens" + (f"; {compile_note}" if compile_note else "")
              + (f"; resuming at step {state['step']} from {ckpt}" if ckpt else ""))
        print(f"data: {text} ({stats['train']['docs']:,} train docs, {len(blocks['train']):,} blocks; "
              f"{stats['validation']['docs']} validation docs); tokenizer {tok_spec}")
    writer = SummaryWriter(out_dir) if main_proc else None
    if main_proc and not ckpt:
        (out_dir / "args.json").write_text(json.dumps({k: str(v) if isinstance(v, Path) else v
                                                       for k, v in vars(args).items()}, indent=2, default=str))

    # ---- the loop
    batches = batch_stream(blocks["train"], accelerator, shape["micro_batch"], args.seed, state["micro_batches"])
    bar = tqdm(total=total_steps, initial=state["step"], disable=not main_proc, desc="train", mininterval=2)
    loss_sum = torch.zeros((), device=device)  # summed on the device: no host sync inside a step
    steps_in_sum, t_log, tokens_log = 0, time.perf_counter(), state["tokens_seen"]
    train_model.train()
    try:
        while state["step"] < total_steps:
            t0 = time.perf_counter()
            n_micro = min(accum, total_micro - state["micro_batches"])  # fewer only in the very last step
            for micro in range(n_micro):
                batch = next(batches)
                sync = micro == n_micro - 1  # all-reduce the gradients only after the last micro-batch
                with nullcontext() if sync else accelerator.no_sync(model):
                    loss = train_model(batch[:, :-1], batch[:, 1:])
                    accelerator.backward(loss / n_micro)
                loss_sum += loss.detach() / n_micro
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(state["step"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["micro_batches"] += n_micro
            state["tokens_seen"] += n_micro * tokens_per_micro
            steps_in_sum += 1
            bar.update(1)
            last = state["step"] == total_steps
            stopping = False
            if state["step"] % args.log_every == 0 or last:
                # A CPU-GPU sync point, only every log_every steps. The stop flag travels with the loss
                # so that all processes stop after the same step (a signal reaches each at its own time).
                reduced = accelerator.reduce(torch.stack([loss_sum / steps_in_sum,
                                                          torch.tensor(float(bool(stop.signal)), device=device)]),
                                             reduction="sum")
                mean_loss, stopping = reduced[0].item() / world, reduced[1].item() > 0
                loss_sum.zero_()
                steps_in_sum = 0
                if not math.isfinite(mean_loss):
                    raise UserError(f"loss is {mean_loss} at step {state['step']}; stopped. Last good checkpoint: "
                                    f"{latest_checkpoint(out_dir) or 'none'} (try a lower --lr)")
                now = time.perf_counter()
                tps = (state["tokens_seen"] - tokens_log) / (now - t_log)
                t_log, tokens_log = now, state["tokens_seen"]
                state["losses"].append([state["step"], mean_loss])
                if main_proc:
                    scalars = {"train/loss": mean_loss, "train/lr": lr_at(state["step"] - 1),
                               "train/grad_norm": float(grad_norm), "perf/tokens_per_second": tps,
                               "perf/step_ms": (now - t0) * 1e3, **(gpu_stats(device) if cuda else {})}
                    if peak:
                        scalars["perf/mfu"] = fpt * tps / peak
                    for k, v in scalars.items():
                        writer.add_scalar(k, v, state["step"])
                    bar.set_postfix(loss=f"{mean_loss:.3f}", tok_s=f"{tps:,.0f}")
            t_aside = time.perf_counter()  # evaluation and checkpoints are not training: kept out of tokens/s
            state["train_seconds"] += t_aside - t0
            if state["step"] % args.eval_every == 0 and not last:
                val = evaluate(train_model, blocks["validation"], accelerator, shape["micro_batch"], args.val_batches)
                if main_proc:
                    writer.add_scalar("val/loss", val, state["step"])
            if stopping or last or (args.ckpt_every and state["step"] % args.ckpt_every == 0):
                save_checkpoint(accelerator, out_dir, state)
            t_log += time.perf_counter() - t_aside
            if stopping and not last:
                if main_proc:
                    print(f"\n{stop.signal or 'signal'}: checkpointed at step {state['step']}; "
                          f"run again with --out-dir {out_dir} to resume", file=sys.stderr)
                raise SystemExit(STOP_EXIT_CODE)
    finally:
        bar.close()

    # ---- the end: validation, metrics
    val_loss = evaluate(train_model, blocks["validation"], accelerator, shape["micro_batch"], args.val_batches)
    v = stats["validation"]
    tail = [loss for _, loss in state["losses"][-5:]]  # the last step is always logged: never empty
    final_train_loss = sum(tail) / len(tail)
    tps = state["tokens_seen"] / state["train_seconds"]
    metrics = {
        "tokens_seen": state["tokens_seen"], "steps": state["step"], "final_train_loss": final_train_loss,
        "final_val_loss": val_loss,
        "val_bits_per_byte": val_loss / math.log(2) * (v["tokens"] + v["docs"]) / v["bytes"],
        "success": final_train_loss < 7, "train_seconds": round(state["train_seconds"], 3),
        "total_seconds": round(time.perf_counter() - t_start, 3), "tokens_per_second": tps,
        "mfu": fpt * tps / peak if peak else None, "precision": precision, "compile": compiled,
        "attention": args.attention, "world_size": world, "device_name": device_name, "params": params,
        "vocab_size": cfg.vocab_size, "tokenizer": tok_spec, "text": str(text), "preset": args.preset,
        "global_batch": shape["global_batch"], "seq_len": shape["seq_len"], "resumed": bool(ckpt),
        "loss_curve": state["losses"],
    }
    if main_proc:
        writer.add_scalar("val/loss", val_loss, state["step"])
        writer.close()
        for path in [out_dir / "metrics.json"] + ([args.metrics_out] if args.metrics_out else []):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(metrics, indent=2) + "\n")
            tmp.replace(path)
        print(f"{state['tokens_seen']:,} tokens in {state['train_seconds']:.1f} s ({tps:,.0f} tokens/s"
              + (f", MFU {metrics['mfu']:.1%}" if metrics["mfu"] else "") + f"): train loss {final_train_loss:.3f}, "
              f"val loss {val_loss:.3f} ({metrics['val_bits_per_byte']:.3f} bits/byte) -> "
              + ("success (< 7)" if metrics["success"] else "NOT below 7"))
    return metrics


if __name__ == "__main__":
    main()
