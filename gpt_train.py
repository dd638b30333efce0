"""Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.

    python tokenizer_train.py && python gpt_train.py          # one GPU (or CPU), own tokenizer
    accelerate launch --num_processes 4 gpt_train.py          # 4 GPUs, DDP
    torchrun --nproc_per_node 2 gpt_train.py --preset tiny    # 2 CPU processes (gloo)
    sbatch slurm/gpt.sh                                       # 1 GPU, checkpoints + requeue
    sbatch --nodes=2 slurm/gpt_multi.sh                       # N nodes x G GPUs
    python gpt_train.py --preset tiny --tokens 200000 --text X.txt          # CPU try-out, ~1 minute

Reading order: training/model.py -> training/step.py (one optimizer step, a why per acceleration) ->
train_loop() below, then set_up() and finish(); flags: training/flags.py, instruments: training/metrics.py."""
from training import lifecycle  # first, before the slow imports: the standard library only

lifecycle.start(__name__, stops=True)  # Slurm's warning (USR1) or a scancel (TERM) while starting: remembered

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from data import REPO, files, wos
from data.tokenizer import open_tokenizer
from data.wos import Packing, token_blocks
from training import checkpoints, device, errors, metrics, rundir, step
from training.budget import (
    Budget,
    batch_stream,
    check_enough,
    check_model_fits,
    choose_micro_batch,
    due,
    evaluate,
    plan_budget,
)
from training.errors import UserError
from training.final import final_samples, save_final
from training.flags import PRESETS, parse_gpt_args
from training.lifecycle import Phases, StopAgreement, StopFlag, process_seconds
from training.model import GPT, model_config

MIN_LR_RATIO = 0.1  # the cosine ends at 10% of the peak learning rate


# ----------------------------------------------------------------------------- the loop

@dataclass
class Setup:
    """What the loop works with, built once by set_up()."""
    args: argparse.Namespace
    train_step: step.TrainStep  # the accelerator, the model (DDP-wrapped with several processes), compiled, AdamW
    budget: Budget
    blocks: dict  # "train" / "validation" token blocks
    out_dir: Path
    identity: dict  # what a resume must match
    info: dict  # the run's description: device, precision, params... (start-up line, metrics)
    tokenizer: object  # the run's tokenizers.Tokenizer: saved into final/ beside the weights
    writer: SummaryWriter | None  # TensorBoard, on the main process (announce() opens it)
    phases: Phases  # where the process's seconds go
    earlier_seconds: float  # process seconds of the run's earlier processes (a resume), up to their exit


def train_loop(setup, state, stop):
    """Optimizer steps until the budget is spent or a signal stops the run; evaluations, checkpoints as due."""
    args, budget, train_step = setup.args, setup.budget, setup.train_step
    accelerator = train_step.accelerator
    batches = batch_stream(setup.blocks["train"], accelerator, budget.micro_batch, args.global_batch,
                           args.seed, state.micro_batches)
    perf, losses = metrics.Throughput(state), metrics.LossWindow(state.loss_window, accelerator.device)
    skips, agreement = metrics.SkippedSteps(accelerator.scaler), StopAgreement(accelerator, stop)
    stopping = False  # a signal: every process stops after the same step, checkpointed (main() says so)
    with tqdm(total=budget.total_steps, initial=state.step, desc="train", mininterval=2) as bar:  # see lifecycle.start
        while state.step < budget.total_steps and not stopping:
            n_micro = budget.micro_in_step(state.micro_batches)
            lr = lr_at(state.lr_step, args.lr, budget.total_steps, args.warmup)
            t0 = time.perf_counter()  # the step's clock
            grad_norm = train_step(batches, n_micro, lr, losses.add)  # forward, backward, clip, optimizer step
            losses.steps += 1
            tokens = n_micro * budget.tokens_per_micro
            state.step += 1
            state.lr_step += not skips.last_skipped()  # an fp16 step skipped by the scaler does not advance the LR
            state.micro_batches += n_micro
            state.tokens_seen += tokens
            log_due, eval_due, ckpt_due = due(state.step, args, budget.total_steps)
            untimed_follows = perf.first_step_seconds is None or eval_due or ckpt_due
            if log_due:
                mean_loss = losses.mean(accelerator)  # over all processes: a sync point (the loss is read)
            elif accelerator.device.type == "cuda" and untimed_follows:
                torch.cuda.synchronize()  # sync point: the untimed work after it must not absorb the step's kernels
            stopping = agreement(at_sync_point=log_due or untimed_follows)  # else read one step late: no sync
            perf.step_done(time.perf_counter() - t0, tokens)  # the step's clock stops
            if log_due:
                point = {"loss/train": mean_loss, "train/grad_norm": grad_norm, "train/lr": lr}
                log_point(setup, state, point, perf.window_tokens_per_second(), bar)
            bar.update()
            if eval_due:
                state.val_losses.append([state.step, validate(setup, state.step)])
            if stopping or ckpt_due:
                with setup.phases.of("checkpoints"):
                    save_checkpoint(setup, state, losses)
    perf.close()  # this process's compile seconds into the run's


def lr_at(step, peak, total, warmup_fraction):
    """Linear warm-up, then cosine decay to MIN_LR_RATIO x peak."""
    warmup = max(1, int(warmup_fraction * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def log_point(setup, state, point, tps, bar):
    """Every --log-every steps and at the end: the loss curve, throughput, TensorBoard, the bar or a line."""
    mean_loss = point["loss/train"]  # over the steps since the last log point
    if not math.isfinite(mean_loss):
        ckpt, _ = checkpoints.latest_checkpoint(setup.out_dir)
        raise UserError(f"loss is {mean_loss} at step {state.step}; stopped. Last good checkpoint: "
                        f"{ckpt or 'none'} (try a lower --lr)")
    state.losses.append([state.step, mean_loss])
    if tps:
        state.throughput.append([state.step, tps])
    if setup.writer:  # the main process
        for k, v in metrics.scalars(setup.info, setup.budget, point, tps, setup.train_step.accelerator.device).items():
            setup.writer.add_scalar(k, v, state.step)
        tokens_left = (setup.budget.total_micro - state.micro_batches) * setup.budget.tokens_per_micro
        values = [f"loss {mean_loss:.3f}", f"{tps or 0:,.0f} tok/s"]  # then the ETA, at the steady pace so far
        lifecycle.log_line(bar, state.step, setup.budget.total_steps, values,
                           tokens_left * state.steady_seconds / state.steady_tokens if state.steady_tokens else None)


def validate(setup, at_step):
    """The validation loss (every process takes part), logged to TensorBoard; outside the timed loop."""
    with setup.phases.of("evaluation"):
        val = evaluate(setup.train_step.model, setup.blocks["validation"], setup.train_step.accelerator,
                       setup.budget.micro_batch, setup.args.val_batches, setup.budget.val_unit)
    if setup.writer:
        setup.writer.add_scalar("loss/val", val, at_step)
    return val


def save_checkpoint(setup, state, losses):
    accelerator = setup.train_step.accelerator
    state.loss_window = losses.saved(accelerator)  # a resume continues this log point's mean
    state.process_seconds = setup.earlier_seconds + process_seconds()
    checkpoints.save_checkpoint(accelerator, setup.out_dir, state, setup.identity)


# ----------------------------------------------------------------------------- the phases

def set_up(args, argv, stack, phases):
    """Devices, the run folder and inputs (checked before any work), data, model -> (Setup, TrainState, stats)."""
    decisions = device.decide(args.precision, args.compile)
    if decisions.compile_mode != "off":
        device.use_compile_cache(args.compile_cache)  # checked writable now, not at the first step
    accelerations, recipe = step.resolve(args, decisions)
    accelerator = step.make_accelerator(accelerations)
    out_dir, ckpt = rundir.open_run_dir(args.out_dir or REPO / "runs" / "gpt" / rundir.new_run_name(), args,
                                        accelerator, stack)
    text = wos.resolve_text(args.text, download=not args.no_download and accelerator.is_main_process)
    tok = open_tokenizer(args.tokenizer)  # a tokenizer.json, a folder, or "gpt2" found locally
    check_model_fits(args, tok.vocab_size, accelerator.device)  # an impossible shape: one line, before the data
    state, saved = checkpoints.load_state(ckpt) if ckpt else (checkpoints.TrainState(), {})

    phases.switch("data")
    corpus = wos.read_corpus(text, args.accept_invalid_utf8)  # read once: the documents and what they are
    identity = checkpoints.run_identity(args, tok, corpus.identity["sha256"], decisions.precision,
                                        accelerator.num_processes)
    checkpoints.check_same_run(saved, identity)  # a resume continues the same run: one line naming what differs
    set_seed(args.seed)
    with accelerator.main_process_first():  # tokenised once on the main process; the others read the cache
        packing = Packing(wos.tokens_per_block(args.seq_len), args.val_fraction, args.seed, args.cache_dir)
        blocks, stats = token_blocks(corpus, tok.tokenizer, packing, tokenizer_hash=tok.sha256)
    check_enough(blocks["train"], args.global_batch)

    phases.switch("model")
    train_step, budget, micro_source = build_step(args, tok, accelerator, (accelerations, recipe), state, saved)
    if ckpt:
        checkpoints.restore(accelerator, ckpt)  # a damaged file: one line naming it
    info = metrics.describe_run(args, decisions, train_step, budget, {
        "text": str(text), "corpus": corpus.identity, "command": "python gpt_train.py " + " ".join(argv),
        "micro_batch_source": micro_source})
    identity = {**identity, "micro_batch": budget.micro_batch, "budget_micro_batch": budget.val_unit}
    earlier = state.process_seconds if ckpt else 0.0  # the stopped processes up to their checkpoint
    setup = Setup(args, train_step, budget, blocks, out_dir, identity, info, tok.tokenizer, None, phases, earlier)
    if accelerator.is_main_process:
        if not ckpt:
            files.write_json(out_dir / "args.json", {**vars(args), "argv": argv})
        announce(setup, state, stats, ckpt, decisions.note)
    return setup, state, stats


def build_step(args, tok, accelerator, plan, state, saved):
    """The model made on its device, the micro-batch that fits, the token budget, the TrainStep for `plan`
    (step.resolve's accelerations and recipe)."""
    accelerations, recipe = plan
    cfg = model_config(tok.vocab_size, tok.eot, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                       n_positions=args.seq_len)
    with accelerator.device:  # weights made where they train: on a GPU no CPU init and no 0.5 GB host-to-device copy
        model = step.change_model(GPT(cfg, attention=accelerations.attention), accelerations)
    micro, micro_source = choose_micro_batch(args, model, accelerator, accelerations,
                                             PRESETS[args.preset]["micro_batch"], saved.get("micro_batch"))
    unit = checkpoints.continue_position(state, saved, micro)  # another micro-batch than the checkpoint's: recounted
    budget = plan_budget(args.tokens, args.global_batch, micro, accelerator.num_processes, args.seq_len, unit)
    return step.build(model, accelerations, recipe, accelerator), budget, micro_source


def announce(setup, state, stats, ckpt, note):
    """The main process's start-up lines; the TensorBoard writer opened."""
    print(metrics.startup_line(setup.info, setup.budget, setup.tokenizer.get_vocab_size()) +
          (f"; {note}" if note else "") + (f"; resuming at step {state.step} from {ckpt}" if ckpt else ""))
    print(f"data: {setup.info['text']} ({stats['train']['docs']:,} train docs, {len(setup.blocks['train']):,} "
          f"blocks; {stats['validation']['docs']} validation docs); tokenizer {setup.args.tokenizer}; run folder "
          f"{setup.out_dir}")
    setup.writer = SummaryWriter(setup.out_dir, purge_step=state.step if ckpt else None)  # a resume: points redone


def finish(setup, state, stats, stop):
    """Validation, final/, samples, then metrics.json (the run is finished once its weights are saved), then the
    checkpoints go: a kill at any moment leaves a run the same command resumes, or one that has its weights."""
    args, phases, train_step = setup.args, setup.phases, setup.train_step
    main = train_step.accelerator.is_main_process
    val_loss = validate(setup, state.step)
    phases.switch("final_save")
    info = {k: v for k, v in setup.info.items() if k not in ("peak", "flops_per_token", "tf32")}
    results = {**metrics.final_metrics(state, val_loss, stats["validation"], setup.info), **info}
    save_final(train_step.accelerator, train_step.model, setup.out_dir, setup.tokenizer,
               keep_metrics=lambda: write_metrics(setup, results))
    phases.switch("sampling")
    if main and args.sample_tokens:
        results["samples"] = samples = final_samples(train_step, setup.tokenizer, setup.blocks["validation"],
                                                     args.sample_tokens, stop)
        for kind in ("greedy", "sampled") if samples else ():  # TensorBoard's text tab
            setup.writer.add_text(f"samples/{kind}", "\n\n".join(f"*{c['prompt']}* **→** {c[kind]}"
                                                                 for c in samples["continuations"]), state.step)
    phases.switch("teardown")
    if main:  # the phases into TensorBoard; the weights are saved by now: a failing disk here is a warning
        try:
            phases.log(setup.writer, state.step)
            setup.writer.close()
        except OSError as e:
            print(f"warning: TensorBoard's last events could not be written in {setup.out_dir} "
                  f"({errors.reason(e)}); final/ is saved", file=sys.stderr)
        results = write_metrics(setup, results)  # the last output: the process's time is taken just before
        print(metrics.summary_line(results))
    if not args.keep_checkpoints:  # the run is finished (metrics.json): its final weights are what stays
        checkpoints.remove_checkpoints(train_step.accelerator, setup.out_dir)
    return results


def write_metrics(setup, results):
    """metrics.json and --metrics-out with the job's clock (compile_seconds: the part of the loop compiling)."""
    spent, now = setup.phases.record()
    results = {**results, "process_seconds": now, "process_seconds_total": round(setup.earlier_seconds + now, 3),
               "phases": spent}
    for path in [setup.out_dir / "metrics.json"] + ([setup.args.metrics_out] if setup.args.metrics_out else []):
        files.write_json(path, results)
    return results


def main(argv=None):
    phases = lifecycle.phases()
    argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    args = parse_gpt_args(argv)
    # the StopFlag from the start: a signal in set-up must not kill the job
    with lifecycle.one_line_errors(), StopFlag() as stop, contextlib.ExitStack() as stack:
        setup, state, stats = set_up(args, argv, stack, phases)
        phases.switch("loop")
        try:
            train_loop(setup, state, stop)
        except OSError as e:  # TensorBoard's writer on a full disk (a checkpoint's failure says its own line)
            raise UserError(f"writing TensorBoard events in {setup.out_dir} failed ({errors.reason(e)}) after "
                            f"step {state.step}; {checkpoints.resume_advice(setup.out_dir)}") from None
        if state.step < setup.budget.total_steps:  # stopped by a signal, checkpointed: exit 3
            setup.train_step.accelerator.print(f"\n{stop.signal or 'signal'}: checkpointed at step {state.step}; "
                                               f"run again with --out-dir {setup.out_dir} to resume", file=sys.stderr)
            raise SystemExit(metrics.STOP_EXIT_CODE)
        return finish(setup, state, stats, stop)


if __name__ == "__main__":
    lifecycle.run(main, agreed=(0, metrics.STOP_EXIT_CODE))  # a finished rank must not abort at exit
