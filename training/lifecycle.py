"""A script's life, the same in lenet5.py, tokenizer_train.py, gpt_train.py and training.sample:

    from training import lifecycle          # first, before the slow imports (the standard library only)
    lifecycle.start(__name__)               # the imports' start; a Ctrl-C while starting: one line, 130
    import torch ...                        # (gpt_train.py: start(__name__, stops=True): USR1/TERM remembered)

    def main(argv=None):
        phases = lifecycle.phases()         # the process's seconds from its start: startup, imports, then "inputs"
        args = parse_args(argv)
        with lifecycle.one_line_errors(lambda: "what is kept"):   # UserError: one line, 1; Ctrl-C: one line, 130
            ... metrics = phases.stamp(metrics) just before the last output ...

    if __name__ == "__main__":
        lifecycle.run(main)                 # leaves without the interpreter's teardown

Every script's metrics carry `process_seconds` (end to end) and `phases` (training/clock.py).
"""
import contextlib
import os
import signal
import sys
import threading

from training import signals
from training.clock import Phases, process_seconds

IMPORTS = [None, None]  # (start, end) of the first script's imports, in process_seconds()


def start(name, stops=False):
    """A script's first line, before its slow imports (torch takes seconds). Run as a program (`name` is
    "__main__"): with `stops`, Slurm's warning (USR1) or a scancel (TERM) during start-up is remembered for
    the StopFlag (training/signals.py) instead of killing the job unsaved; without, a Ctrl-C before main()
    is ready for it is one line and exit 130, nothing written yet, not an import traceback (a background job's
    ignored SIGINT stays ignored). training.sample, also imported by gpt_train.py, keeps the first start."""
    if IMPORTS[0] is None:
        IMPORTS[0] = process_seconds()
    if name != "__main__":
        return
    if stops:
        signals.catch_early()
    elif signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _while_starting)


def _while_starting(signum, frame):
    print("\ninterrupted (Ctrl-C) while starting: nothing was written", file=sys.stderr, flush=True)
    os._exit(130)


def phases():
    """The process's Phases (training/clock.py): the interpreter's start-up, the imports (up to the first call:
    main() runs right after them), then "inputs"."""
    if IMPORTS[1] is None:
        IMPORTS[1] = process_seconds()
    return Phases(IMPORTS if IMPORTS[0] is not None else None)


@contextlib.contextmanager
def one_line_errors(interrupted=None):
    """Around main()'s work: a UserError (any of the project's, from data/files.py) is `error: ...` on one line
    and exit 1; a Ctrl-C is "interrupted (Ctrl-C): " + interrupted() (what is kept, what to do) and exit 130
    (interrupted None: the script handles Ctrl-C itself, as gpt_train's StopFlag does). TensorBoard's writer
    thread keeps a failed write (a full disk) for the main thread, which stops the run in one line, then
    re-raises it: threading would print a second, long traceback; here it does not."""
    from data.files import UserError
    if signal.getsignal(signal.SIGINT) is _while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, the line below says it
    previous = threading.excepthook

    def hook(info):
        if not (isinstance(info.exc_value, OSError) and type(info.thread).__name__ == "_AsyncWriterThread"):
            previous(info)
    threading.excepthook = hook
    try:
        yield
    except UserError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"\ninterrupted (Ctrl-C): {interrupted()}", file=sys.stderr)
        sys.exit(130)
    finally:
        threading.excepthook = previous


def run(main, agreed=(0,)):
    """The `if __name__ == "__main__":` block: main(), then out without the interpreter's teardown (exit_quickly),
    after a last barrier where several processes end together with a code in `agreed` (training/signals.py's
    no_teardown_after_collectives says why)."""
    with signals.no_teardown_after_collectives(agreed):
        main()
