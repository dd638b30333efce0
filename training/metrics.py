"""What a GPT run reports: TensorBoard scalars, the final metrics, the start-up and summary lines."""
import math

import torch

from training.device import flops_per_token, gpu_stats, mfu, sdpa_backend

SUCCESS_LOSS = 7.0  # the lab's goal: a training loss below 7 (report/make_report.py draws this line)
STOP_EXIT_CODE = 3  # "checkpointed on a signal, resume me" (slurm/gpt.sh requeues on it)


def final_metrics(state, val_loss, v, tokens_per_second, info):
    """What the run measured (`v`: the validation split's counts); `info` gives the MFU."""
    tail = [loss for _, loss in state.losses[-5:]]  # the last step is always logged: never empty
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


def scalars(info, budget, loss, grad_norm, lr, tps, dev):
    """A log point's TensorBoard scalars: loss, gradient norm, LR; throughput and MFU once steady; GPU use."""
    out = {"loss/train": loss, "train/grad_norm": float(grad_norm), "train/lr": lr}
    if tps:
        out["perf/tokens_per_second"] = tps
        out["perf/step_ms"] = budget.accum * budget.tokens_per_micro / tps * 1e3
        if info["peak"]:
            out["perf/mfu"] = mfu(tps, info["flops_per_token"], info["peak"], info["world_size"])
    if dev.type == "cuda":
        out.update(gpu_stats(dev))
    return out


def startup_line(info, budget, micro_source, tokenizer_vocab):
    """Every decision of the run (info: what gpt_train.py records) in two lines, each short enough for a log."""
    return ", ".join([
        f"GPT-2 {info['params'] / 1e6:.1f}M params, vocab {tokenizer_vocab} -> {info['vocab_size']}",
        f"{info['device_name']} x {info['world_size']}", f"precision {info['precision']}",
        f"compile {info['compile']}", f"attention {info['attention']}", f"tf32 {info['tf32']}",
        f"fused AdamW {info['fused_adamw']}\n"
        f"batch {info['global_batch']} x {info['seq_len']} (micro {budget.micro_batch} [{micro_source}] x "
        f"{info['world_size']} x accum {budget.accum})",
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
            f"{mfu_part}{compile_part}): train loss {m['final_train_loss']:.3f}, val loss {m['final_val_loss']:.3f} "
            f"-> {verdict}{SUCCESS_LOSS:g} (val {m['val_bits_per_byte']:.3f} bits/byte, comparable across "
            f"vocabularies; the loss is not)")


def describe_run(args, argv, decisions, train_step, text, corpus, budget):
    """The run as the metrics record it, each acceleration too; `corpus`: the text's identity by content."""
    model, world = train_step.accelerator.unwrap_model(train_step.model), train_step.accelerator.num_processes
    cfg, params = model.cfg, sum(p.numel() for p in model.parameters())
    return {"accelerations": vars(train_step.accelerations), "precision": decisions.precision,
            "compile": decisions.compile_mode, "attention": model.attention,
            "sdpa_backend": (sdpa_backend(cfg, decisions.precision, next(model.parameters()).device)
                             if model.attention == "sdpa" else None),
            "tf32": "on" if decisions.tf32 else "off", "fused_adamw": args.fused_adamw, "world_size": world,
            "device_name": decisions.name, "params": params, "vocab_size": cfg.vocab_size, "tokenizer": args.tokenizer,
            "text": str(text), "corpus": corpus, "preset": args.preset, "global_batch": args.global_batch,
            "micro_batch": budget.micro_batch, "seq_len": args.seq_len,
            "command": "python gpt_train.py " + " ".join(argv), "peak": decisions.peak,
            "flops_per_token": flops_per_token(cfg, args.seq_len, params - cfg.n_positions * cfg.n_embd)}

