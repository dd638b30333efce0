"""What a GPT run measures and reports: the loop's instruments (the steady steps' clock, the loss window, fp16's
skipped steps), TensorBoard scalars, the final metrics, the start-up and summary lines; scope(): the step's parts
named for a profile (benchmarks/step_profile.py)."""
import contextlib
import math

import torch

from training.device import flops_per_token, gpu_stats, mfu, sdpa_backend

SUCCESS_LOSS = 7.0  # the lab's goal: a training loss below 7 (report/make_report.py draws this line)
STOP_EXIT_CODE = 3  # "checkpointed on a signal, resume me" (slurm/gpt.sh requeues on it)
FINAL_POINTS = 5  # final_train_loss: the mean of the last logged points (one point's window is noisy)


def final_metrics(state, val_loss, v, tokens_per_second, info):
    """What the run measured (`v`: the validation split's counts); `info` gives the MFU."""
    tail = [loss for _, loss in state.losses[-FINAL_POINTS:]]  # the last step is always logged: never empty
    final_train_loss = sum(tail) / len(tail)
    bits_per_byte = val_loss / math.log(2) * (v["tokens"] + v["docs"]) / v["bytes"]  # comparable across vocabularies
    return {
        "tokens_seen": state.tokens_seen, "steps": state.step, "final_train_loss": final_train_loss,
        "final_val_loss": val_loss, "val_bits_per_byte": bits_per_byte, "success": final_train_loss < SUCCESS_LOSS,
        "train_seconds": round(state.train_seconds, 3), "tokens_per_second": tokens_per_second,
        "compile_seconds": round(state.compile_seconds, 3) if state.steady_seconds > 0 else None,
        "mfu": mfu(tokens_per_second, info["flops_per_token"], info["peak"], info["world_size"]),
        "skipped_steps": state.step - state.lr_step,  # fp16: steps GradScaler skipped (overflow); else 0
        "resumed": state.resumed, "torch": torch.__version__, "loss_curve": state.losses,
        "val_curve": state.val_losses + [[state.step, val_loss]], "throughput_curve": state.throughput}


def scalars(info, budget, point, tps, dev):
    """A log point's TensorBoard scalars: `point`'s (loss, gradient norm, LR); throughput and MFU once steady;
    GPU use."""
    out = {k: float(v) for k, v in point.items()}
    if tps:
        out["perf/tokens_per_second"] = tps
        out["perf/step_ms"] = budget.accum * budget.tokens_per_micro / tps * 1e3
        if info["peak"]:
            out["perf/mfu"] = mfu(tps, info["flops_per_token"], info["peak"], info["world_size"])
    if dev.type == "cuda":
        out.update(gpu_stats(dev))
    return out


def startup_line(info, budget, tokenizer_vocab):
    """Every decision of the run (info: what gpt_train.py records) in two lines, each short enough for a log."""
    fused = " (fused)" if info["optimizer_settings"].get("fused") else ""
    return ", ".join([
        f"GPT-2 {info['params'] / 1e6:.1f}M params, vocab {tokenizer_vocab} -> {info['vocab_size']}",
        f"{info['device_name']} x {info['world_size']}", f"precision {info['precision']}",
        f"compile {info['compile']}", f"attention {info['attention']}", f"tf32 {info['tf32']}",
        f"{info['optimizer']} lr {info['optimizer_settings']['lr']:g}{fused}\n"
        f"batch {info['global_batch']} x {info['seq_len']} (micro {budget.micro_batch} "
        f"[{info['micro_batch_source']}] x {info['world_size']} x accum {budget.accum})",
        f"{budget.total_steps} steps for {budget.total_micro * budget.tokens_per_micro:,} tokens"])


def summary_line(m):
    """The run in one line: the loop's time and the process's (end to end), throughput, losses, verdict."""
    compile_part = f", compile {m['compile_seconds']:.1f} s" if m["compile"] != "off" and m["compile_seconds"] else ""
    mfu_part = f", MFU {m['mfu']:.1%}" if m["mfu"] else ""
    verdict = "success: train loss < " if m["success"] else "NOT a success: train loss >= "
    total = m.get("process_seconds_total", m["process_seconds"])  # a resumed run: all its processes, as its loop
    here = f" over all its processes, this one {m['process_seconds']:.1f} s" if total > m["process_seconds"] else ""
    return (f"{m['tokens_seen']:,} tokens in {m['train_seconds']:.1f} s of training loop, "
            f"{total:.1f} s end to end{here} ({m['tokens_per_second']:,.0f} tokens/s steady"
            f"{mfu_part}{compile_part}): train loss {m['final_train_loss']:.3f} (the mean of the last "
            f"{min(FINAL_POINTS, len(m['loss_curve']))} logged points), val loss {m['final_val_loss']:.3f} "
            f"-> {verdict}{SUCCESS_LOSS:g} (val {m['val_bits_per_byte']:.3f} bits/byte, comparable across "
            f"vocabularies; the loss is not)")


def describe_run(args, decisions, train_step, budget, facts):
    """The run as the metrics record it, each acceleration too; `facts`: what set-up found (the text, its identity
    by content, the command, where the micro-batch came from)."""
    model, world = train_step.accelerator.unwrap_model(train_step.model), train_step.accelerator.num_processes
    cfg, params = model.cfg, sum(p.numel() for p in model.parameters())
    optimizer, asked = train_step.optimizer_settings(), dict(vars(train_step.accelerations))
    if optimizer["name"] != "AdamW":  # fused AdamW: a setting of AdamW's only
        asked["fused_adamw"] = None
    return {"accelerations": asked, "optimizer": optimizer.pop("name"), "optimizer_settings": optimizer,
            "precision": decisions.precision, "compile": decisions.compile_mode, "attention": model.attention,
            "sdpa_backend": (sdpa_backend(cfg, decisions.precision, next(model.parameters()).device)
                             if model.attention == "sdpa" else None),
            "tf32": "on" if decisions.tf32 else "off", "world_size": world,
            "device_name": decisions.name, "params": params, "vocab_size": cfg.vocab_size, "tokenizer": args.tokenizer,
            "preset": args.preset, "global_batch": args.global_batch, "micro_batch": budget.micro_batch,
            "seq_len": args.seq_len, "peak": decisions.peak, **facts,
            "flops_per_token": flops_per_token(cfg, args.seq_len, params - cfg.n_positions * cfg.n_embd)}


class Throughput:
    """The timed loop's seconds: tokens/s of the steady steps; the first step's extra time is compile_seconds."""

    def __init__(self, state):
        self.state = state  # train_seconds, steady_seconds, steady_tokens, compile_seconds: survive resumes
        self.first_step_seconds = None
        self.steady_steps, self.steady_seconds_here = 0, 0.0  # this process's, since it started
        self.compile_seconds_here = 0.0  # this process's part of compile_seconds (its phases split it out)
        self.window = [0.0, 0]  # steady seconds, tokens since the last log point

    def step_done(self, seconds, tokens):
        self.state.train_seconds += seconds
        if self.first_step_seconds is None:
            self.first_step_seconds = seconds
        else:
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


def scope(name):
    """A named part of the step (training/step.py's "data", "optimizer") in a profile, only while one is taken."""
    if not torch.autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"lab5.{name}")
