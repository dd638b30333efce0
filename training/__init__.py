"""The machinery behind the scripts, one module per concern; gpt_train.py keeps the accelerations and
the loop, which is what a reader comes for.

    runfiles.py     every script's: UserError, strict JSON written atomically, output and run-folder checks, flags

    signals.py      USR1/TERM/Ctrl-C: caught from the script's first line, the StopFlag, its agreement
    device.py       precision and compile decisions per device; compile cache; peak FLOP/s and MFU
    budget.py       the token budget in whole micro-batches; micro-batch plan, GPU probe, agreement
    batches.py      this process's batches, resumable at (epoch, batch); the validation loss and samples
    lm_loss.py      the chunked cross-entropy (--loss chunked): the fp32 logits never whole
    sample.py       continuations of fixed validation prompts; `python -m training.sample RUN_DIR --prompt ...`
    checkpoints.py  the typed TrainState; save / verify / latest; run identity; the run directory; final weights
    metrics.py      throughput, the final metrics, the start-up and summary lines, SUCCESS_LOSS
    check_env.py    `python -m training.check_env`: is this environment ready for the lab
"""
import os
from pathlib import Path

# shared on a cluster; an empty or relative XDG_CACHE_HOME is ignored, as the XDG spec says (it would put the
# cache under whatever folder the script runs in: the repository)
_XDG = os.environ.get("XDG_CACHE_HOME", "")
CACHE_HOME = (Path(_XDG) if os.path.isabs(_XDG) else Path.home() / ".cache") / "lab5"


from training.runfiles import UserError  # noqa: E402,F401  the one base of one-line errors: import it from here
