"""The acceleration ladder's rows for gpt_bench.py: (name, settings), settings being training/step.py's
Accelerations plus the model ("hf": transformers' GPT2LMHeadModel, "own": training/model.py), its dropout and
the vocabulary. The last rung is gpt_train.py's default step, taken from its flags, not described again."""
from dataclasses import asdict, replace

import gpt_train
from training import device, step

GPT2_VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64


def default_step(cuda, capability, preset="lab"):
    """(Accelerations, Recipe) of `python gpt_train.py --preset PRESET` with its defaults on such a device."""
    args = gpt_train.parse_args(["--preset", preset])
    return step.resolve(args, device.decisions_for("cuda" if cuda else "cpu", capability, args.precision, args.compile))


def ladder(cuda, capability, vocab_size=16384):
    """The rungs from the naive baseline, one acceleration each, up to the default on this device; then, indented,
    the default without each, SDPA forced, the candidates, GPT-2's vocabulary, compiled (where inductor can)."""
    default, _ = default_step(cuda, capability)
    declared = [a for a in step.declared() if a.naive not in (None, getattr(default, a.name))]  # rungs of their own
    naive = replace(default, precision="fp32", tf32=False, attention="eager", compile="off",
                    **{a.name: a.naive for a in declared})
    rungs = [("naive: GPT2LMHeadModel, dropout 0.1, eager attention, fp32, AdamW",
              dict(model="hf", dropout=0.1, **asdict(naive))),
             ("+ dropout 0 (GPT-2 pretraining used 0.1; 12M tokens do not overfit)", dict(dropout=0.0)),
             ("+ SDPA attention (flash / memory-efficient kernel)", dict(attention=default.attention)),
             ("+ own GPT module from the same GPT2Config", dict(model="own"))]
    if default.tf32:
        rungs.append(("+ TF32 matmuls", dict(tf32=True)))
    if default.precision != "fp32":  # as gpt_train.py's --precision auto: only where the hardware has 16-bit math
        rungs.append((f"+ {default.precision} autocast" + (" + GradScaler" if default.precision == "fp16" else ""),
                      dict(precision=default.precision)))
    rungs += [(f"+ {a.label}", {a.name: getattr(default, a.name)}) for a in declared]
    rungs[-1] = (rungs[-1][0] + " (= gpt_train.py default)", rungs[-1][1])
    settings, out = {}, []
    for name, change in rungs:
        settings = {**settings, **change}
        out.append((name, dict(settings)))
    assert settings == dict(model="own", dropout=0.0, **asdict(default)), "the last rung must be gpt_train's step"
    for name, change in rungs[1:]:
        if set(change) != {"dropout"}:  # the own module has no dropout: rung 2 measures it
            what = name.removeprefix("+ ").split(" (")[0].split(",")[0]
            out.append((f"  default without {what}", {**settings, **{k: out[0][1][k] for k in change}}))
    out += [(f"  default, SDPA forced to its {b} backend", {**settings, "sdpa_backend": b}) for b in step.SDPA_BACKENDS]
    out += [(f"  candidate: {a.label}, {a.why} ({a.flag} {text})", {**settings, a.name: value})
            for a in step.declared() for text, value in a.values().items()
            if value not in (settings[a.name], a.naive)]  # not the default, not the naive row's
    if vocab_size != GPT2_VOCAB:
        out.append((f"  default with GPT-2's vocabulary ({GPT2_VOCAB:,} instead of {vocab_size:,})",
                     {**settings, "vocab_size": GPT2_VOCAB}))
    if cuda and device.compile_supported("cuda", capability):
        out.append(("  default + torch.compile, each block on its own (regional)", {**settings, "compile": "regional"}))
        out.append(("  default + whole-model torch.compile", {**settings, "compile": "whole"}))
    return out


def accelerations(settings):
    return step.Accelerations(**{k: v for k, v in settings.items() if k not in ("model", "dropout", "vocab_size")})


def reference(rows, i):
    """The row number that row i is judged against: the rung before it; the default (the last rung) for an
    indented row; None for row 1."""
    return min(i - 1, sum(not name.startswith(" ") for name, _ in rows)) or None


def unmeasured_first(rows):
    """The row numbers (1-based) in the order for a run that may be cut: the rows the report rests on (naive,
    default, leave-one-out), then the rest, the compiled rows last; each group in the ladder's order."""
    default = reference(rows, len(rows) + 1)

    def group(i):
        name, settings = rows[i - 1]
        return 2 if settings["compile"] != "off" else 0 if i in (1, default) or "default without" in name else 1
    return sorted(range(1, len(rows) + 1), key=group)
