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
    """Before the slow imports. Run as a program: with `stops`, USR1/TERM during start-up are remembered for the
    StopFlag (training/signals.py), not fatal; a Ctrl-C before main() is one line and 130, not an import
    traceback (a background job's ignored SIGINT stays ignored). The first script's start counts (gpt_train.py
    imports training.sample)."""
    if IMPORTS[0] is None:
        IMPORTS[0] = process_seconds()
    if name != "__main__":
        return
    if stops:
        signals.catch_early()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _while_starting)


def _while_starting(signum, frame):
    print("\ninterrupted (Ctrl-C) while starting: nothing was written", file=sys.stderr, flush=True)
    os._exit(130)


def phases():
    """The process's Phases (training/clock.py): start-up, the imports (up to main()'s first line), "inputs"."""
    if IMPORTS[1] is None:
        IMPORTS[1] = process_seconds()
    return Phases(IMPORTS if IMPORTS[0] is not None else None)


@contextlib.contextmanager
def one_line_errors(interrupted=None):
    """Around main()'s work: a UserError is `error: ...` on one line and exit 1; a Ctrl-C is one line ending in
    interrupted() (what is kept) and exit 130 (None: gpt_train's StopFlag handles it). TensorBoard's writer
    thread re-raises the failed write the main thread stops on: not printed a second time, as a traceback."""
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
    """main(), then out without the interpreter's teardown (signals.no_teardown_after_collectives says why)."""
    with signals.no_teardown_after_collectives(agreed):
        main()
