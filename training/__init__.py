"""The machinery behind the scripts, one module per concern; the scripts keep what a reader comes for
(gpt_train.py its loop, lenet5.py its model and loop). The file basics (UserError, atomic strict JSON,
bounded reads) are data/files.py, on the floor below.

Every script's:
    lifecycle.py    a script's life: its prologue, one-line errors, Ctrl-C, no teardown at exit
    clock.py        the job's clock: process_seconds from the process's start, and its phases
    runfiles.py     run folders (one run each, locked; finished = metrics.json) and the output rule (--force)
    flags.py        the argparse Parser (one-line errors) and the range-checked flag types
    device.py       precision, TF32 and compile decisions per device; compile cache; peak FLOP/s and MFU
    check_env.py    `python -m training.check_env`: is this environment ready for the lab

GPT-2 (gpt_train.py):
    gpt_flags.py    the presets and flags
    model.py        GPT-2 with GPT2LMHeadModel's names (GPTConfig), a KV cache for sampling
    step.py         one optimizer step and its accelerations, one home for gpt_train and the ladder
    watch.py        the loop's instruments: the step's clock, loss window, fp16 skips, profiled step, stop agreement
    profile.py      one step under torch.profiler, grouped (matmul, attention, ..., idle)
    signals.py      USR1/TERM/Ctrl-C: caught from the script's first line, the StopFlag, its agreement
    budget.py       the token budget in whole micro-batches; micro-batch plan, GPU probe; will the model fit
    batches.py      this process's batches, resumable at (epoch, batch); the validation loss
    lm_loss.py      the chunked cross-entropy (--loss chunked): the fp32 logits never whole
    checkpoints.py  the typed TrainState; save / verify / latest; run identity; the run directory
    final.py        final/, a transformers model folder: written once, read back checked
    sample.py       the fixed prompts' continuations at the end; `python -m training.sample RUN_DIR --prompt ...`
    metrics.py      TensorBoard scalars, the final metrics, the start-up and summary lines, SUCCESS_LOSS

LeNet-5 (lenet5.py):
    lenet.py            what both engines share: the LeNetRun record, the schedule, per-epoch logging
    lenet_lightning.py  --engine lightning (the handout's bonus)
"""
import os
from pathlib import Path

# shared on a cluster; an empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says (it would put the
# cache under whatever folder the script runs in: the repository)
_XDG = os.environ.get("XDG_CACHE_HOME", "")
CACHE_HOME = (Path(_XDG) if os.path.isabs(_XDG) else Path.home() / ".cache") / "lab5"


from data.files import UserError  # the one base of one-line errors (data/files.py): importable from here too
