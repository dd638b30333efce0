"""The acceleration ladder's rows for benchmarks/gpt_bench.py: (name, settings) each, and the order in
which a run whose time may be cut measures them.

Settings: model ("hf" | "own"), dropout, attention ("eager" | "sdpa"), precision, compile ("off" |
"regional" | "whole"), fused, tf32; beyond those, vocab_size, loss and sdpa_backend (a forced SDPA
kernel), which build() and measure() read with defaults.
"""
import torch

import training.device

GPT2_VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}  # torch.nn.attention.SDPBackend's members, by the rows' short names


def ladder(cuda, capability, with_compile=False, vocab_size=16384):
    """The rungs from the naive baseline, each extending the previous one's settings up to gpt_train.py's
    default on this device; then, indented, the alternatives: the default minus each acceleration
    (leave-one-out), with SDPA forced to each backend, with a chunked loss, with GPT-2's vocabulary,
    and compiled (regional, whole model) where inductor can compile for the device."""
    device_type = "cuda" if cuda else "cpu"
    half = training.device.resolve_precision("auto", device_type, capability, training.device.cpu_has_bf16())
    rungs = [("naive: GPT2LMHeadModel, dropout 0.1, eager attention, fp32, AdamW",
              dict(model="hf", dropout=0.1, attention="eager", precision="fp32", compile="off", fused=False,
                   tf32=False)),
             ("+ dropout 0 (GPT-2 pretraining used 0.1; 12M tokens do not overfit)", dict(dropout=0.0)),
             ("+ SDPA attention (flash / memory-efficient kernel)", dict(attention="sdpa")),
             ("+ own GPT module from the same GPT2Config", dict(model="own"))]
    if cuda:
        rungs.append(("+ TF32 matmuls", dict(tf32=True)))
    if half != "fp32":  # as gpt_train.py's --precision auto: only where the hardware has 16-bit math
        rungs.append((f"+ {half} autocast" + (" + GradScaler" if half == "fp16" else ""), dict(precision=half)))
    rungs.append(("+ fused AdamW (= gpt_train.py default)", dict(fused=True)))
    settings, out = {}, []
    for name, change in rungs:
        settings = {**settings, **change}
        out.append((name, dict(settings)))
    naive = out[0][1]
    for name, change in rungs[1:]:  # leave-one-out: the default minus one acceleration
        if set(change) == {"dropout"}:
            continue  # the own module has no dropout: rung 2 measures it
        what = name.removeprefix("+ ").split(" (")[0].split(",")[0]
        out.append((f"  default without {what}", {**settings, **{k: naive[k] for k in change}}))
    out += [(f"  default, SDPA forced to its {b} backend", {**settings, "sdpa_backend": b}) for b in SDPA_BACKENDS]
    out.append(("  candidate: chunked loss, no full fp32 logits (--loss chunked)", {**settings, "loss": "chunked"}))
    if vocab_size != GPT2_VOCAB:
        out.append((f"  default with GPT-2's vocabulary ({GPT2_VOCAB:,} instead of {vocab_size:,})",
                     {**settings, "vocab_size": GPT2_VOCAB}))
    if (cuda and training.device.compile_supported(device_type, capability)) or with_compile:
        out.append(("  default + torch.compile, each block on its own (regional)", {**settings, "compile": "regional"}))
        out.append(("  default + whole-model torch.compile", {**settings, "compile": "whole"}))
    return out


def unmeasured_first(rows):
    """Groups of row numbers (1-based), what the GPU results still lack first: the default with its
    leave-one-out rows (bf16 against fp32 among them), the SDPA backends, the chunked loss, GPT-2's
    vocabulary, then the rungs already measured, the compiled rows last (each pays a compile)."""
    def kind(name, settings):
        if settings["compile"] != "off":
            return 5
        if name.startswith("  default without") or name.endswith("(= gpt_train.py default)"):
            return 0
        if "sdpa_backend" in settings:
            return 1
        if settings.get("loss") == "chunked":
            return 2
        if "vocab_size" in settings:
            return 3
        return 4
    groups = {}
    for i, (name, settings) in enumerate(rows, 1):
        groups.setdefault(kind(name, settings), []).append(i)
    return [groups[k] for k in sorted(groups)]


def sdpa_context(settings):
    """SDPA restricted to the row's forced backend, else torch's own choice. A backend this torch does
    not have (CUDNN_ATTENTION before 2.5) is an error of that row, not of the run."""
    from contextlib import nullcontext
    forced = settings.get("sdpa_backend")
    if not forced:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    member = getattr(SDPBackend, SDPA_BACKENDS[forced], None)
    if member is None:
        raise RuntimeError(f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[forced]}")
    return sdpa_kernel([member])
