"""Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.

    python tokenizer_train.py && python gpt_train.py          # one GPU (or CPU), own tokenizer
    accelerate launch --num_processes 4 gpt_train.py          # 4 GPUs, DDP
    torchrun --nproc_per_node 2 gpt_train.py --preset tiny    # 2 CPU processes (gloo)
    sbatch slurm/gpt.sh                                       # 1 GPU, checkpoints + requeue
    sbatch --nodes=2 slurm/gpt_multi.sh                       # N nodes x G GPUs
    python gpt_train.py --preset tiny --tokens 200000 --text X.txt          # CPU try-out, ~1 minute
    python gpt_train.py --profile ...                         # + one steady step under torch.profiler

The model is training/model.py: GPT2Config's architecture (hidden 768, 12 heads, 12 layers, 1024
positions) in ~100 lines, attention one SDPA call, nothing that training does not need. The step and
its accelerations (a why each) are training/step.py, which the acceleration ladder builds its rows with.

Reading order: training/model.py -> presets and flags -> training/step.py -> train_loop(), the loop
whole -> train(), the phases around it. The machinery (device decisions, token budget, checkpoints,
metrics, signals, the job's clock) is in training/, one module per concern. The metrics' end-to-end
time is `process_seconds` (the process, from its start as the OS records it), split into `phases`;
`train_seconds` is the timed loop.
"""
if __name__ == "__main__":  # first, before the slow imports: Slurm's warning or a scancel must not kill us unsaved
    from training.signals import catch_early
    catch_early()
from training.clock import Phases, process_seconds  # noqa: E402  (standard library only)

IMPORTS_STARTED = process_seconds()  # the imports below are seconds of the job too: they get a phase

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402

from data import wos  # noqa: E402
from data.blocks import token_blocks  # noqa: E402
from data.tokenizer import default_tokenizer, open_tokenizer  # noqa: E402
from training import CACHE_HOME, UserError, device, runfiles, sample, step  # noqa: E402
from training.batches import batch_stream, check_enough, evaluate  # noqa: E402
from training.budget import Budget, check_model_fits, choose_micro_batch, due, plan_budget  # noqa: E402
from training.checkpoints import (  # noqa: E402
    TrainState,
    check_same_run,
    continue_position,
    earlier_seconds,
    latest_checkpoint,
    load_state,
    open_run_dir,
    record_stop_clock,
    remove_checkpoints,
    restore,
    resume_advice,
    run_identity,
    save_checkpoint,
)
from training.final import save_final  # noqa: E402
from training.flags import Parser, int_or_auto, number, path_flag, path_or_name_flag, seed_flag  # noqa: E402
from training.metrics import (  # noqa: E402
    STOP_EXIT_CODE,
    LossWindow,
    Throughput,
    describe_run,
    final_metrics,
    startup_line,
    summary_line,
)
from training.model import GPT, model_config  # noqa: E402
from training.profile import profiled  # noqa: E402
from training.signals import StopAgreement, StopFlag, no_teardown_after_collectives  # noqa: E402

IMPORTS = (IMPORTS_STARTED, process_seconds())
REPO = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- presets and flags

PRESETS = {  # model shape, batch and peak learning rate; everything else is a flag
    "lab": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, global_batch=64, lr=1e-3),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, micro_batch=8, global_batch=16, lr=3e-3),
}
MIN_LR_RATIO = 0.1  # the cosine ends at 10% of the peak learning rate
MAX_SAMPLE_TOKENS = 1024  # the final samples: without a KV cache each token is a forward pass


def build_parser():
    p = Parser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add, lab, tiny = p.add_argument, PRESETS["lab"], PRESETS["tiny"]
    positive, fraction = number(int, 1), number(float, 0, 1, high_open=True)
    add("--preset", choices=list(PRESETS), default="lab", help="model and batch shape")
    add("--text", type=path_flag, default=None,
        help="X.txt, one document per line; None: data/WebOfScience/WOS46985/X.txt, downloaded if missing")
    add("--tokenizer", type=path_or_name_flag, default=default_tokenizer(),
        help="tokenizer.json or 'gpt2'; the default is data/tokenizer/tokenizer.json once tokenizer_train.py made it")
    add("--out-dir", type=path_flag, default=None, help="checkpoints, TensorBoard, metrics of this run: a "
        "new or empty folder, or one of gpt_train.py's (with a checkpoint: resumed); None: a new runs/gpt/<time>-<id>/")
    add("--tokens", type=number(int, 1, 10**13), default=12_000_000, help="training budget in tokens, all processes")
    for name in ("n_layer", "n_head", "n_embd", "seq_len", "global_batch"):
        add(f"--{name.replace('_', '-')}", type=positive, default=lab[name], help=f"(tiny preset: {tiny[name]})")
    add("--micro-batch", type=int_or_auto(), default="auto",
        help="sequences per process per forward pass, or auto: on a GPU the largest that fits (probed once per "
             f"GPU), on CPU the preset's (lab: {lab['micro_batch']}, tiny: {tiny['micro_batch']}); gradients are "
             "accumulated to --global-batch; a resume may change it (the same global batch is the same run)")
    add("--lr", type=number(float, 0, low_open=True), default=lab["lr"],
        help=f"peak learning rate (tiny preset: {tiny['lr']})")
    add("--warmup", type=fraction, default=0.1, help="warm-up, fraction of the steps")
    add("--weight-decay", type=number(float, 0), default=0.1, help="on matrices only")
    add("--grad-clip", type=number(float, 0, low_open=True, why=" (0 clips every gradient to nothing)"), default=1.0,
        help="gradient norm clipped to this")
    add("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto", help="auto: see training/device.py")
    add("--compile", choices=["auto", "regional", "whole", "off"], default="auto",
        help="torch.compile each transformer block (regional) or the whole model (sm70+ GPUs, CPU); auto: off, "
             "since a 12M-token run does not repay a cold compile (training/device.py)")
    add("--compile-cache", type=path_flag, default=CACHE_HOME / "torch-compile",
        help="inductor/Triton cache, kept across runs and nodes")
    add("--fused-adamw", choices=["on", "off"], default="on", help="the whole AdamW update in one kernel")
    add("--loss", choices=["plain", "chunked"], default="plain", help="chunked: a speed candidate, training/lm_loss.py")
    add("--seed", type=seed_flag, default=0, help="weights, data order, split")
    add("--val-fraction", type=number(float, 0, 0.5, True, True), default=0.005, help="held-out documents")
    add("--eval-every", type=positive, default=50, help="steps between validation losses")
    add("--val-batches", type=positive, default=20, help="micro-batches per validation")
    add("--log-every", type=positive, default=10, help="steps between logged points")
    add("--sample-tokens", type=number(int, 0, MAX_SAMPLE_TOKENS), default=48,
        help="continuing fixed validation prompts once training is done (TensorBoard text, the metrics); 0: none")
    add("--ckpt-every", type=number(int, 0, why=" (0: only on signals)"), default=100,
        help="steps between checkpoints; 0 = only on signals")
    add("--keep-checkpoints", action="store_true", help="keep the optimizer checkpoints of a finished run, and "
        "write one after its last step (else only final/ stays: a transformers model folder)")
    add("--cache-dir", type=path_flag, default=None,
        help="tokenised-data cache; None: the repository's data/cache (LAB5_DATA or not)")
    add("--no-download", action="store_true", help="never try to download the WOS archive")
    add("--profile", action="store_true", help="record one steady step with torch.profiler: profile.json (time "
        "by matmul, attention, elementwise, loss, optimizer, ...), the metrics' `profile`, TensorBoard's profiler")
    add("--metrics-out", type=path_flag, default=None, help="write the final metrics here as JSON")
    return p


def parse_args(argv):
    """The flags, defaults from the chosen preset (a first pass reads --preset)."""
    p = build_parser()
    preset = PRESETS[p.parse_known_args(argv)[0].preset]
    p.set_defaults(**{k: v for k, v in preset.items() if k != "micro_batch"})
    args = p.parse_args(argv)
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if args.preset == "lab" and args.seq_len > 1024:
        p.error(f"--seq-len {args.seq_len} exceeds GPT-2's 1024 positions")
    return args


# ----------------------------------------------------------------------------- the loop

@dataclass(frozen=True)
class Setup:
    """What the loop works with, built once by set_up()."""
    args: argparse.Namespace
    step: step.Step  # the accelerator, the model (DDP-wrapped with several processes), its compiled form, AdamW
    budget: Budget
    blocks: dict  # "train" / "validation" token blocks
    out_dir: Path
    identity: dict  # what a resume must match
    info: dict  # the run's description: device, precision, params... (start-up line, metrics)
    tokenizer: object  # the run's tokenizers.Tokenizer: saved into final/ beside the weights
    writer: SummaryWriter | None  # TensorBoard, on the main process
    phases: Phases  # where the process's seconds go
    earlier_seconds: float  # process seconds of the run's earlier processes (a resume), up to their exit


def train_loop(setup, state, stop):
    """Optimizer steps until the budget is spent or a signal stops the run: the timed step, then
    evaluation and checkpoints as due, outside the timing. Returns (the Throughput, the step's profile)."""
    run, budget, args = setup.step, setup.budget, setup.args
    accelerator = run.accelerator
    batches = batch_stream(setup.blocks["train"], accelerator, budget.micro_batch, args.global_batch, args.seed,
                           state.micro_batches)
    losses, perf, profile = LossWindow(state.loss_window, accelerator.device), Throughput(state), None
    skips, stop_agreed = device.SkippedSteps(accelerator.scaler), StopAgreement(accelerator, stop)
    profile_at = min(state.step + 1, budget.total_steps - 1) if args.profile else -1  # a steady step: not the first
    run.train_model.train()
    with tqdm(total=budget.total_steps, initial=state.step, disable=not accelerator.is_main_process, desc="train",
              mininterval=2) as bar:
        while state.step < budget.total_steps:
            t0, first = time.perf_counter(), perf.first_step_seconds is None  # ---- timed: one optimizer step
            n_micro = budget.micro_in_step(state.micro_batches)
            lr = lr_at(state.lr_step, args.lr, budget.total_steps, args.warmup)
            one_step = functools.partial(run.run, batches, n_micro, lr, losses.add)
            if state.step == profile_at:  # the profiler's overhead: this step is kept out of tokens/s
                grad_norm, profile = profiled(one_step, accelerator.device, setup.out_dir / "profile")
                profile["step"] = state.step + 1  # the step profiled, not the last one run
            else:
                grad_norm = one_step()
            state.lr_step += not skips.last_skipped()  # an fp16 step skipped by the scaler does not advance the LR
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
            perf.step_done(time.perf_counter() - t0, tokens, steady=state.step - 1 != profile_at)
            bar.update()
            if eval_due:  # ---- untimed: evaluation, checkpoints
                with setup.phases.of("evaluation"):
                    state.val_losses.append([state.step, validate(setup, state.step)])
            if stopping or ckpt_due:
                with setup.phases.of("checkpoints"):
                    state.loss_window = losses.saved(accelerator)  # a resume continues this log point's mean
                    state.process_seconds = setup.earlier_seconds + process_seconds()
                    save_checkpoint(accelerator, setup.out_dir, state, setup.identity)
            if stopping and not last:  # accelerator.print: on the main process only
                accelerator.print(f"\n{stop.signal or 'signal'}: checkpointed at step {state.step}; run again with "
                                  f"--out-dir {setup.out_dir} to resume", file=sys.stderr)
                break
    perf.close()
    return perf, profile


def lr_at(step, peak, total, warmup_fraction):
    """Linear warm-up, then cosine decay to MIN_LR_RATIO x peak."""
    warmup = max(1, int(warmup_fraction * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def log_point(setup, state, mean_loss, perf, grad_norm, bar, lr):
    """Every log_every steps and at the end: the loss curve, throughput, TensorBoard, the bar."""
    if not math.isfinite(mean_loss):
        ckpt, _ = latest_checkpoint(setup.out_dir)
        raise UserError(f"loss is {mean_loss} at step {state.step}; stopped. Last good checkpoint: "
                        f"{ckpt or 'none'} (try a lower --lr)")
    state.losses.append([state.step, mean_loss])
    tps = perf.window_tokens_per_second()
    if tps:
        state.throughput.append([state.step, tps])
    if setup.writer:
        info, budget = setup.info, setup.budget
        scalars = {"train/loss": mean_loss, "train/grad_norm": float(grad_norm), "train/lr": lr}
        if tps:
            scalars["perf/tokens_per_second"] = tps
            scalars["perf/step_ms"] = budget.accum * budget.tokens_per_micro / tps * 1e3
            if info["peak"]:
                scalars["perf/mfu"] = device.mfu(tps, info["flops_per_token"], info["peak"], info["world_size"])
        if setup.step.accelerator.device.type == "cuda":
            scalars.update(device.gpu_stats(setup.step.accelerator.device))
        for k, v in scalars.items():
            setup.writer.add_scalar(k, v, state.step)
    bar.set_postfix(loss=f"{mean_loss:.3f}", tok_s=f"{tps or 0:,.0f}", refresh=False)  # drawn by update()


def validate(setup, at_step):
    """The validation loss (every process takes part), logged to TensorBoard; outside the timed loop."""
    run = setup.step
    val = evaluate(run.model, setup.blocks["validation"], run.accelerator, setup.budget.micro_batch,
                   setup.args.val_batches, setup.budget.val_unit)
    if setup.writer:
        setup.writer.add_scalar("val/loss", val, at_step)
    return val


# ----------------------------------------------------------------------------- the phases

def set_up(args, argv, stack, phases):
    """Device decisions, the run directory and inputs (checked before any work), the data, the model
    and its step; a resume's state. Returns (Setup, TrainState, corpus statistics)."""
    decisions = device.decide(args.precision, args.compile)
    if decisions.compile_mode != "off":
        device.use_compile_cache(args.compile_cache)  # checked writable now, not at the first step
    acc, recipe = step.resolve(args, decisions)
    accelerator = step.make_accelerator(acc)
    out_dir, ckpt = open_run_dir(args.out_dir or REPO / "runs" / "gpt" / runfiles.new_run_name(),
                                 args.metrics_out, accelerator, stack,
                                 inputs={"--text": args.text, "--tokenizer": args.tokenizer})  # never overwritten
    if args.profile and accelerator.is_main_process:  # the trace's folder, written by C++ that only logs a failure
        runfiles.probe_folder(out_dir / "profile", f"--profile's trace folder {out_dir / 'profile'}")
    text = wos.resolve_text(args.text, download=not args.no_download and accelerator.is_main_process)
    tok = open_tokenizer(args.tokenizer)  # a tokenizer.json, a folder, or "gpt2" found locally
    check_model_fits(args, tok.vocab_size, accelerator.device)  # an impossible shape: one line, before the data
    state, saved_identity = load_state(ckpt) if ckpt else (TrainState(), {})

    phases.switch("data")
    corpus = wos.corpus_identity(text)  # what the text is, by content: the run's identity and its metrics
    identity = run_identity(args, tok, corpus["sha256"], decisions.precision, accelerator.num_processes)
    check_same_run(saved_identity, identity)  # a resume must continue the same run: one line naming what differs
    set_seed(args.seed)
    with accelerator.main_process_first():  # tokenised once on the main process; the others read the cache
        blocks, stats = token_blocks(text, corpus["sha256"], tok.tokenizer, wos.tokens_per_block(args.seq_len),
                                     args.val_fraction, args.seed, args.cache_dir)
    check_enough(blocks["train"], args.global_batch)

    phases.switch("model")
    cfg = model_config(tok.vocab_size, tok.eot, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                       n_positions=args.seq_len)
    with accelerator.device:  # weights made where they train: on a GPU no CPU init and no 0.5 GB host-to-device copy
        model = GPT(cfg, attention=acc.attention, loss=acc.loss)
    micro, micro_source = choose_micro_batch(args.micro_batch, model, accelerator, decisions.precision,
                                             args.global_batch, PRESETS[args.preset]["micro_batch"],
                                             saved_identity.get("micro_batch"))
    unit = continue_position(state, saved_identity, micro)  # another micro-batch than the checkpoint's: recounted
    budget = plan_budget(args.tokens, args.global_batch, micro, accelerator.num_processes, args.seq_len, unit)
    info = describe_run(args, argv, decisions, model, text, corpus, budget, accelerator.num_processes)
    run = step.build(model, acc, recipe, accelerator)
    if ckpt:
        restore(accelerator, ckpt)  # a damaged file: one line naming it
    writer = None
    if accelerator.is_main_process:
        print(startup_line(info, budget, micro_source, tok.vocab_size) +
              (f"; {decisions.note}" if decisions.note else "") +
              (f"; resuming at step {state.step} from {ckpt}" if ckpt else ""))
        print(f"data: {text} ({stats['train']['docs']:,} train docs, {len(blocks['train']):,} blocks; "
              f"{stats['validation']['docs']} validation docs); tokenizer {args.tokenizer}; run folder {out_dir}")
        if not ckpt:
            runfiles.write_json(out_dir / "args.json", {**vars(args), "argv": argv})
        writer = SummaryWriter(out_dir, purge_step=state.step if ckpt else None)  # a resume: later points redone
    identity = {**identity, "micro_batch": budget.micro_batch, "budget_micro_batch": budget.val_unit}
    setup = Setup(args, run, budget, blocks, out_dir, identity, info, tok.tokenizer, writer, phases,
                  earlier_seconds(out_dir, state) if ckpt else 0.0)
    return setup, state, stats


def train(args, argv, stop, phases):
    """The phases: set-up, the loop, the final validation; then the metrics first (a full disk at final/
    keeps them), final/, the samples, and the metrics again with the whole process's time."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(runfiles.quiet_writer_thread())  # its failure is the main thread's one line
        setup, state, stats = set_up(args, argv, stack, phases)
        phases.switch("loop")
        try:
            perf, profile = train_loop(setup, state, stop)
        except OSError as e:  # TensorBoard's writer on a full disk (a checkpoint's failure says its own line)
            raise UserError(f"writing TensorBoard events in {setup.out_dir} failed ({runfiles.reason(e)}) after "
                            f"step {state.step}; {resume_advice(setup.out_dir)}") from None
        if profile and setup.writer:  # the main process's step (each process profiles its own)
            profile = {**profile, "device_name": setup.info["device_name"]}
            runfiles.write_json(setup.out_dir / "profile.json", profile)
        if state.step < setup.budget.total_steps:  # stopped by a signal, checkpointed
            if setup.step.accelerator.is_main_process:
                try:  # the checkpoint is saved: a failure here must not turn exit 3 (requeue) into 1
                    record_stop_clock(setup.out_dir, state.step, setup.earlier_seconds + process_seconds())
                except (OSError, UserError) as e:
                    print(f"warning: {e}; the next process counts this one's seconds up to its checkpoint",
                          file=sys.stderr)
            raise SystemExit(STOP_EXIT_CODE)
        phases.switch("evaluation")
        val_loss = validate(setup, state.step)
        phases.switch("final_save")
        main = setup.step.accelerator.is_main_process
        info = {k: v for k, v in setup.info.items() if k not in ("peak", "flops_per_token", "tf32", "fused_adamw")}
        metrics = {**final_metrics(state, val_loss, stats["validation"], perf.tokens_per_second(), setup.info),
                   **info, "profile": profile}
        if main:
            write_metrics(args, setup.out_dir, with_clock(metrics, setup, phases, perf))
        save_final(setup.step.accelerator, setup.step.model, setup.out_dir, setup.tokenizer, metrics_kept=True)
        phases.switch("sampling")
        if main and args.sample_tokens:
            metrics["samples"] = sample.final_samples(setup.step, setup.tokenizer, setup.blocks["validation"],
                                                      args.sample_tokens, setup.writer, state.step, val_loss, stop)
        phases.switch("teardown")
        if main:
            close_writer(setup, phases, state.step, profile)
        if not args.keep_checkpoints:  # the run is finished (metrics.json): its final weights are what stays
            remove_checkpoints(setup.step.accelerator, setup.out_dir)
        if main:
            metrics = with_clock(metrics, setup, phases, perf)
            write_metrics(args, setup.out_dir, metrics)  # the last output: the process's time is taken just before
            print(summary_line(metrics))
        return metrics


def with_clock(metrics, setup, phases, perf):
    """The metrics with the job's clock: this process's seconds, the run's over all its processes, and where
    they went (a compiled run's first-step compile split out of the loop)."""
    spent, now = phases.record()
    if setup.info["compile"] != "off" and perf.compile_seconds_here:
        spent = {**spent, "loop": round(spent["loop"] - perf.compile_seconds_here, 3),
                 "compile": round(perf.compile_seconds_here, 3)}
    return {**metrics, "process_seconds": now, "process_seconds_total": round(setup.earlier_seconds + now, 3),
            "phases": spent}


def write_metrics(args, out_dir, metrics):
    for path in [out_dir / "metrics.json"] + ([args.metrics_out] if args.metrics_out else []):
        runfiles.write_json(path, metrics)


def close_writer(setup, phases, at_step, profile):
    """The phases into TensorBoard, then its file closed; the run is saved by now, so a failing disk here
    costs the last events only, said in a warning."""
    try:
        phases.log(setup.writer, at_step)
        for name, seconds in (profile or {}).get("groups", {}).items():
            setup.writer.add_scalar(f"profile/{name}_seconds", seconds, at_step)
        setup.writer.close()
    except OSError as e:
        print(f"warning: TensorBoard's last events could not be written in {setup.out_dir} ({runfiles.reason(e)}); "
              f"the metrics and final/ are saved", file=sys.stderr)


def main(argv=None):
    phases = Phases(IMPORTS)  # the interpreter's start-up and the imports, then "inputs"
    argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    args = parse_args(argv)
    try:
        with StopFlag() as stop:  # from the start: a signal during set-up must not kill the job
            return train(args, argv, stop, phases)
    except UserError as e:  # TextError, OutputError too
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    with no_teardown_after_collectives(agreed=(0, STOP_EXIT_CODE)):  # a finished rank must not abort at exit
        main()
