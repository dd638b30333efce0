"""The machinery behind the scripts, one module per concern; the scripts keep what a reader comes for
(gpt_train.py its loop, lenet5.py its model and loop). UserError: errors; the file helpers and the one folder
check (who else may write it): data/files.py.

    lifecycle   a script's life: prologue, one-line errors, Ctrl-C and Slurm's signals, the clock and its phases
    rundir      run folders (made private, one run each, locked; finished = metrics.json), the output rule (--force)
    flags       the argparse Parser (one-line errors) and range-checked flag types; gpt_flags: GPT's presets
    device      precision, TF32 and compile per device; peak FLOP/s and MFU; check_env: is this environment ready
    model       GPT-2 with GPT2LMHeadModel's names, its chunked loss; step: one optimizer step, its accelerations
    budget      the token budget in whole micro-batches, the micro-batch probe, this rank's batches, evaluation
    metrics     the loop's instruments (step clock, loss window, fp16 skips), TensorBoard scalars, the summaries
    checkpoints save / verify / resume; final: final/ (a transformers model folder), generation; sample: its CLI
    lenet       what LeNet-5's two engines share; lenet_lightning: --engine lightning (the handout's bonus)
"""
import os
from pathlib import Path

# shared on a cluster; an empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says
_XDG = os.environ.get("XDG_CACHE_HOME", "")
CACHE_HOME = (Path(_XDG) if os.path.isabs(_XDG) else Path.home() / ".cache") / "lab5"
