"""The machinery behind the scripts, one module per concern; the scripts keep what a reader comes for
(gpt_train.py its loop, lenet5.py its model and loop).

Every script's:
    runfiles.py     UserError, strict JSON written atomically, output and run-folder checks, path flags
    flags.py        the argparse Parser (one-line errors) and the range-checked flag types
    clock.py        the job's clock: process_seconds from the process's start, and its phases
    device.py       precision and compile decisions per device; compile cache; peak FLOP/s and MFU
    check_env.py    `python -m training.check_env`: is this environment ready for the lab

GPT-2 (gpt_train.py):
    model.py        GPT-2 in ~130 lines with GPT2Config's names (GPTConfig), a KV cache for sampling
    step.py         the training step and its accelerations, one home for gpt_train and the ladder
    profile.py      one step under torch.profiler, grouped (matmul, attention, ..., idle)
    signals.py      USR1/TERM/Ctrl-C: caught from the script's first line, the StopFlag, its agreement
    budget.py       the token budget in whole micro-batches; micro-batch plan, GPU probe; will the model fit
    batches.py      this process's batches, resumable at (epoch, batch); the validation loss
    lm_loss.py      the chunked cross-entropy (--loss chunked): the fp32 logits never whole
    checkpoints.py  the typed TrainState; save / verify / latest; run identity; the run directory
    final.py        final/, a transformers model folder: written once, read back checked
    sample.py       the fixed prompts' continuations at the end; `python -m training.sample RUN_DIR --prompt ...`
    metrics.py      throughput, the final metrics, the start-up and summary lines, SUCCESS_LOSS

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


from training.runfiles import UserError  # noqa: E402,F401  the one base of one-line errors: import it from here
