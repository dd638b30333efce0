"""Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.

    python tokenizer_train.py && python gpt_train.py          # one GPU (or CPU), own tokenizer
    accelerate launch --num_processes 4 gpt_train.py          # 4 GPUs, DDP
    torchrun --nproc_per_node 2 gpt_train.py --preset tiny    # 2 CPU processes (gloo)
    sbatch slurm/gpt.sh                                       # 1 GPU, checkpoints + requeue
    sbatch --nodes=2 slurm/gpt_multi.sh                       # N nodes x G GPUs
    python gpt_train.py --preset tiny --tokens 200000 --text X.txt          # CPU try-out, ~1 minute

The model is training/model.py: GPT2Config's architecture (hidden 768, 12 heads, 12 layers, 1024
positions) in ~100 lines, attention one SDPA call, nothing that training does not need. Every
acceleration has a flag or a line below; `auto` picks what works on the device.

Reading order: training/model.py -> presets and flags -> the accelerations (one block, a why each) ->
train_loop(), the loop whole -> train(), the phases around it. The machinery (device decisions,
token budget, checkpoints, metrics, signals) is in training/, one module per concern.
"""
if __name__ == "__main__":  # first, before the slow imports: Slurm's warning or a scancel must not kill us unsaved
    from training.signals import catch_early
    catch_early()

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import GradScalerKwargs, set_seed
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from data import wos
from data.tokenizer import default_tokenizer, open_tokenizer
from training import CACHE_HOME, UserError, device, runfiles, sample
from training.batches import batch_stream, validate
from training.budget import Budget, choose_micro_batch, due, plan_budget
from training.checkpoints import (
    TrainState,
    check_same_run,
    continue_position,
    load_state,
    open_run_dir,
    remove_checkpoints,
    restore,
    run_identity,
    save_checkpoint,
)
from training.final import save_final
from training.metrics import (
    STOP_EXIT_CODE,
    LossWindow,
    Throughput,
    describe_run,
    final_metrics,
    log_point,
    startup_line,
    summary_line,
)
from training.model import GPT, model_config
from training.signals import StopAgreement, StopFlag, no_teardown_after_collectives

REPO = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- presets and flags

PRESETS = {  # model shape, batch and peak learning rate; everything else is a flag
    "lab": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, global_batch=64, lr=1e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, micro_batch=8, global_batch=16, lr=3e-3),
}
MIN_LR_RATIO = 0.1  # the cosine ends at 10% of the peak learning rate


def positive_int_or_auto(text):
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


def build_parser():
    p = runfiles.ArgumentParser(description=__doc__.split("\n")[0],  # no abbreviations; errors in one line
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add, lab, tiny = p.add_argument, PRESETS["lab"], PRESETS["tiny"]
    add("--preset", choices=list(PRESETS), default="lab", help="model and batch shape")
    add("--text", type=runfiles.path_flag, default=None,
        help="X.txt, one document per line; None: data/WebOfScience/WOS46985/X.txt, downloaded if missing")
    add("--tokenizer", type=runfiles.path_or_name_flag, default=default_tokenizer(),
        help="tokenizer.json or 'gpt2'; the default is data/tokenizer/tokenizer.json once tokenizer_train.py made it")
    add("--out-dir", type=runfiles.path_flag, default=None, help="checkpoints, TensorBoard, metrics of this run: a "
        "new or empty folder, or one of gpt_train.py's (with a checkpoint: resumed); None: a new runs/gpt/<time>-<id>/")
    add("--tokens", type=int, default=12_000_000, help="training budget in tokens, all processes")
    for name in ("n_layer", "n_head", "n_embd", "seq_len", "global_batch"):
        add(f"--{name.replace('_', '-')}", type=int, default=lab[name], help=f"(tiny preset: {tiny[name]})")
    add("--micro-batch", type=positive_int_or_auto, default="auto",
        help="sequences per process per forward pass, or auto: on a GPU the largest that fits (probed once per "
             f"GPU), on CPU the preset's (lab: {lab['micro_batch']}, tiny: {tiny['micro_batch']}); gradients are "
             "accumulated to --global-batch; a resume may change it (the same global batch is the same run)")
    add("--lr", type=finite_float, default=lab["lr"], help=f"peak learning rate (tiny preset: {tiny['lr']})")
    add("--warmup", type=finite_float, default=0.1, help="warm-up, fraction of the steps")
    add("--weight-decay", type=finite_float, default=0.1, help="on matrices only")
    add("--grad-clip", type=finite_float, default=1.0, help="gradient norm clipped to this")
    add("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto", help="auto: see training/device.py")
    add("--compile", choices=["auto", "regional", "whole", "off"], default="auto",
        help="torch.compile each transformer block (regional) or the whole model (sm70+ GPUs, CPU); auto: off, "
             "since a 12M-token run does not repay a cold compile (training/device.py)")
    add("--compile-cache", type=runfiles.path_flag, default=CACHE_HOME / "torch-compile",
        help="inductor/Triton cache, kept across runs and nodes")
    add("--fused-adamw", choices=["on", "off"], default="on", help="the whole AdamW update in one kernel")
    add("--loss", choices=["plain", "chunked"], default="plain", help="chunked: a speed candidate, training/lm_loss.py")
    add("--seed", type=int, default=0, help="weights, data order, split")
    add("--val-fraction", type=finite_float, default=0.005, help="held-out documents")
    add("--eval-every", type=int, default=50, help="steps between validation losses")
    add("--val-batches", type=int, default=20, help="micro-batches per validation")
    add("--log-every", type=int, default=10, help="steps between logged points")
    add("--sample-tokens", type=int, default=48, help="continuing fixed prompts at each validation; 0: none")
    add("--ckpt-every", type=int, default=100, help="steps between checkpoints; 0 = only on signals")
    add("--keep-checkpoints", action="store_true", help="keep the optimizer checkpoints of a finished run, and "
        "write one after its last step (else only final/ stays: a transformers model folder)")
    add("--cache-dir", type=runfiles.path_flag, default=None,
        help="tokenised-data cache; None: the repository's data/cache (LAB5_DATA or not)")
    add("--no-download", action="store_true", help="never try to download the WOS archive")
    add("--metrics-out", type=runfiles.path_flag, default=None, help="write the final metrics here as JSON")
    return p


def parse_args(argv):
    """The flags, defaults from the chosen preset (a first pass reads --preset)."""
    p = build_parser()
    preset = PRESETS[p.parse_known_args(argv)[0].preset]
    p.set_defaults(**{k: v for k, v in preset.items() if k != "micro_batch"})
    args = p.parse_args(argv)
    if args.tokens <= 0:
        p.error(f"--tokens must be > 0, got {args.tokens}")
    if min(args.n_layer, args.n_head, args.n_embd, args.seq_len, args.global_batch) <= 0:
        p.error("model and batch sizes must be > 0")
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if args.preset == "lab" and args.seq_len > 1024:
        p.error(f"--seq-len {args.seq_len} exceeds GPT-2's 1024 positions")
    if not 0 <= args.seed < 2**32:  # numpy's seed range
        p.error(f"--seed must be in [0, 2^32), got {args.seed}")
    for name, ok, rule in ARG_RULES:
        if not ok(getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} must be {rule}, got {getattr(args, name)}")
    return args


ARG_RULES = [  # (flag, check, what it must be): a value outside these trains nothing sensible
    ("lr", lambda v: v > 0, "> 0"), ("grad_clip", lambda v: v > 0, "> 0 (0 clips every gradient to nothing)"),
    ("warmup", lambda v: 0 <= v < 1, "in [0, 1), a fraction of the steps"), ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("val_fraction", lambda v: 0 < v < 0.5, "in (0, 0.5)"), ("eval_every", lambda v: v > 0, "> 0"),
    ("val_batches", lambda v: v > 0, "> 0"), ("log_every", lambda v: v > 0, "> 0"),
    ("ckpt_every", lambda v: v >= 0, ">= 0 (0: only on signals)"), ("sample_tokens", lambda v: v >= 0, ">= 0")]


# ----------------------------------------------------------------------------- the accelerations
# One line of why each; where `auto` decides, training/device.py says how, per device.
#   precision      16-bit matmuls run on tensor cores (~4x fp32 on a 2080Ti) and move half the bytes;
#                  bf16 keeps fp32's exponent range, fp16 needs loss scaling (GradScaler)
#   TF32           what stays in fp32 runs on tensor cores too, with a 10-bit mantissa (sm80+)
#   SDPA           attention in one fused kernel, no T x T matrix in memory (flash or cuDNN attention in
#                  16 bits on sm80+, memory-efficient otherwise; the metrics name the one that ran)
#   torch.compile  fuses the elementwise work around the matmuls, cuts Python overhead; off by default
#                  (--compile regional): in 12M tokens the cold compile costs more than it saves
#   fused AdamW    the whole update (moments, bias correction, step) in one kernel that reads each
#                  parameter once, where the default multi-tensor (foreach) path makes several passes
#   micro-batch    the largest that fits (training/budget.py), gradients accumulated to the global
#                  batch and all-reduced once per optimizer step (no_sync in train_loop)
#   pinned memory  batches copied to the GPU asynchronously; no loader workers: the token blocks are
#                  already tensors in memory, so there is nothing for a worker to prepare

def make_accelerator(decisions):
    """accelerate's Accelerator with this device's precision; TF32 on a GPU."""
    fp16 = decisions.precision == "fp16"
    handlers = [GradScalerKwargs(init_scale=2.0**12)] if fp16 else []  # 2^16 overflows at first
    # cpu=True where there is no GPU: only then does accelerate turn torchrun's processes into gloo ranks
    accelerator = Accelerator(mixed_precision={"fp32": "no"}.get(decisions.precision, decisions.precision),
                              cpu=not decisions.cuda,  # 16-bit all-reduce below
                              kwargs_handlers=handlers + device.ddp_handlers(decisions.precision))
    if decisions.cuda:
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for whatever stays in fp32
    return accelerator


def apply_accelerations(model, args, accelerator, decisions):
    """(the model for checkpoints and evaluation, the compiled one for training steps, the optimizer).
    AdamW decays matrices and embeddings only, fused into one kernel; DDP through accelerate."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases and LayerNorms do not decay
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                                  eps=1e-8, fused=args.fused_adamw == "on")
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, device.compile_model(model, decisions.compile_mode), optimizer


# ----------------------------------------------------------------------------- the loop

@dataclass(frozen=True)
class Setup:
    """What the loop works with, built once by set_up()."""
    args: argparse.Namespace
    accelerator: Accelerator
    model: nn.Module  # DDP-wrapped with several processes: checkpoints and evaluation use it
    train_model: nn.Module  # the same module, compiled: the training steps call it
    optimizer: torch.optim.Optimizer
    budget: Budget
    blocks: dict  # "train" / "validation" token blocks
    out_dir: Path
    identity: dict  # what a resume must match
    info: dict  # the run's description: device, precision, params... (start-up line, metrics)
    tokenizer: object  # the run's tokenizers.Tokenizer: saved into final/ beside the weights
    writer: SummaryWriter | None  # TensorBoard, on the main process
    sampler: sample.Sampler | None  # continuations of fixed validation prompts, on the main process


def train_loop(setup, state, stop):
    """Optimizer steps until the budget is spent or a signal stops the run: the timed step, then
    evaluation and checkpoints as due, outside the timing. Returns the Throughput."""
    accelerator, model, budget, args = setup.accelerator, setup.model, setup.budget, setup.args
    batches = batch_stream(setup.blocks["train"], accelerator, budget.micro_batch, args.global_batch, args.seed,
                           state.micro_batches)
    losses, perf = LossWindow(state.loss_window, accelerator.device), Throughput(state)
    skips, stop_agreed = device.SkippedSteps(accelerator.scaler), StopAgreement(accelerator, stop)
    setup.train_model.train()
    with tqdm(total=budget.total_steps, initial=state.step, disable=not accelerator.is_main_process, desc="train",
              mininterval=2) as bar:
        while state.step < budget.total_steps:
            t0, first = time.perf_counter(), perf.first_step_seconds is None  # ---- timed: one optimizer step
            n_micro = budget.micro_in_step(state.micro_batches)
            for i in range(n_micro):  # gradients accumulate; DDP all-reduces them after the last one only
                batch = next(batches)
                with contextlib.nullcontext() if i == n_micro - 1 else accelerator.no_sync(model):
                    loss = setup.train_model(batch[:, :-1], batch[:, 1:])
                    accelerator.backward(loss / n_micro)  # fp16: the loss is scaled here (GradScaler)
                losses.add(loss.detach() / n_micro)  # on the device: no sync
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.grad_clip)  # fp16: unscaled first
            lr = lr_at(state.lr_step, args.lr, budget.total_steps, args.warmup)
            for group in setup.optimizer.param_groups:
                group["lr"] = lr
            setup.optimizer.step()  # fp16: skipped when the gradients overflowed
            setup.optimizer.zero_grad(set_to_none=True)
            state.lr_step += not skips.last_skipped()  # a skipped step does not advance the schedule
            tokens = n_micro * budget.tokens_per_micro
            state.step, state.micro_batches, state.tokens_seen = (state.step + 1, state.micro_batches + n_micro,
                                                                  state.tokens_seen + tokens)
            losses.steps += 1
            logged, eval_due, ckpt_due, last = due(state.step, args, budget.total_steps)
            if logged:  # sync point: the loss is read
                log_point(setup, state, losses.mean(accelerator), perf, grad_norm, bar, lr)
            elif (first or eval_due or ckpt_due) and accelerator.device.type == "cuda":
                torch.cuda.synchronize()  # sync point: the step's GPU work is done before the clock stops
            stopping = stop_agreed(at_sync_point=logged or first or eval_due or ckpt_due)  # else the last step's
            perf.step_done(time.perf_counter() - t0, tokens)
            bar.update()
            if eval_due:  # ---- untimed: evaluation, checkpoints
                state.val_losses.append([state.step, validate(setup, state.step)])
            if stopping or ckpt_due:
                state.loss_window = losses.saved()  # a resume continues this log point's mean
                save_checkpoint(accelerator, setup.out_dir, state, setup.identity)
            if stopping and not last:  # accelerator.print: on the main process only
                accelerator.print(f"\n{stop.signal or 'signal'}: checkpointed at step {state.step}; run again with "
                                  f"--out-dir {setup.out_dir} to resume", file=sys.stderr)
                break
    perf.close()
    return perf


def lr_at(step, peak, total, warmup_fraction):
    """Linear warm-up, then cosine decay to MIN_LR_RATIO x peak."""
    warmup = max(1, int(warmup_fraction * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------- the phases

def set_up(args, argv, stack):
    """Device decisions, the run directory and inputs (checked before any work), the data, the model
    and its accelerations; a resume's state. Returns (Setup, TrainState, corpus statistics)."""
    decisions = device.decide(args.precision, args.compile)
    if decisions.compile_mode != "off":
        device.use_compile_cache(args.compile_cache)  # checked writable now, not at the first step
    accelerator = make_accelerator(decisions)
    out_dir, ckpt = open_run_dir(args.out_dir or REPO / "runs" / "gpt" / runfiles.new_run_name(),
                                 args.metrics_out, accelerator, stack,
                                 inputs={"--text": args.text, "--tokenizer": args.tokenizer})  # never overwritten
    text = wos.resolve_text(args.text, download=not args.no_download and accelerator.is_main_process)
    tok = open_tokenizer(args.tokenizer)  # a tokenizer.json, a folder, or "gpt2" found locally
    state, saved_identity = load_state(ckpt) if ckpt else (TrainState(), {})
    corpus = wos.corpus_identity(text)  # what the text is, by content: the run's identity and its metrics
    identity = run_identity(args, tok, corpus["sha256"], decisions.precision, accelerator.num_processes)
    check_same_run(saved_identity, identity)  # a resume must continue the same run: one line naming what differs
    set_seed(args.seed)
    with accelerator.main_process_first():  # tokenised once on the main process; the others read the cache
        splits = wos.load_splits(text, args.val_fraction, args.seed, args.cache_dir, sha256=corpus["sha256"])
        blocks, stats = wos.tokenize_blocks(splits, tok.tokenizer, wos.tokens_per_block(args.seq_len))
    cfg = model_config(tok.vocab_size, tok.eot, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                       n_positions=args.seq_len)
    model = GPT(cfg, loss=args.loss).to(accelerator.device)
    micro, micro_source = choose_micro_batch(args.micro_batch, model, accelerator, decisions.precision,
                                             args.global_batch, PRESETS[args.preset]["micro_batch"],
                                             saved_identity.get("micro_batch"))
    unit = continue_position(state, saved_identity, micro)  # another micro-batch than the checkpoint's: recounted
    budget = plan_budget(args.tokens, args.global_batch, micro, accelerator.num_processes, args.seq_len, unit)
    info = describe_run(args, argv, decisions, model, text, corpus, budget, accelerator.num_processes)
    model, train_model, optimizer = apply_accelerations(model, args, accelerator, decisions)
    if ckpt:
        restore(accelerator, ckpt)  # a damaged file: one line naming it
    if accelerator.is_main_process:
        print(startup_line(info, budget, micro_source, tok.vocab_size) +
              (f"; {decisions.note}" if decisions.note else "") +
              (f"; resuming at step {state.step} from {ckpt}" if ckpt else ""))
        print(f"data: {text} ({stats['train']['docs']:,} train docs, {len(blocks['train']):,} blocks; "
              f"{stats['validation']['docs']} validation docs); tokenizer {args.tokenizer}")
        if not ckpt:
            runfiles.write_json(out_dir / "args.json", {**vars(args), "argv": argv})
    writer, sampler = ((SummaryWriter(out_dir), sample.Sampler(tok.tokenizer, blocks["validation"], args.sample_tokens))
                       if accelerator.is_main_process else (None, None))
    return (Setup(args, accelerator, model, train_model, optimizer, budget, blocks, out_dir,
                  {**identity, "micro_batch": budget.micro_batch, "budget_micro_batch": budget.val_unit}, info,
                  tok.tokenizer, writer, sampler), state, stats)


def train(args, argv, stop):
    """The phases: set-up, the loop, then the final validation and the metrics."""
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        setup, state, stats = set_up(args, argv, stack)
        perf = train_loop(setup, state, stop)
        if setup.writer:
            setup.writer.flush()
        if state.step < setup.budget.total_steps:  # stopped by a signal, checkpointed
            raise SystemExit(STOP_EXIT_CODE)
        val_loss = validate(setup, state.step)
        info = {k: v for k, v in setup.info.items() if k not in ("peak", "flops_per_token", "tf32", "fused_adamw")}
        metrics = {**final_metrics(state, val_loss, stats["validation"], perf.tokens_per_second(),
                                   time.perf_counter() - t_start, setup.info), **info,
                   "samples": setup.sampler and setup.sampler.last}  # the final continuations
        save_final(setup.accelerator, setup.model, setup.out_dir, setup.tokenizer)  # for sampling; untimed
        if setup.accelerator.is_main_process:
            setup.writer.close()
            for path in [setup.out_dir / "metrics.json"] + ([args.metrics_out] if args.metrics_out else []):
                runfiles.write_json(path, metrics)
            print(summary_line(metrics))
        if not args.keep_checkpoints:  # the run is finished (metrics.json): its final weights are what stays
            remove_checkpoints(setup.accelerator, setup.out_dir)
        return metrics


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    args = parse_args(argv)
    try:
        with StopFlag() as stop:  # from the start: a signal during set-up must not kill the job
            return train(args, argv, stop)
    except UserError as e:  # TextError, OutputError too
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    with no_teardown_after_collectives(agreed=(0, STOP_EXIT_CODE)):  # a finished rank must not abort at exit
        main()
