"""A script's life, the same in lenet5.py, tokenizer_train.py, gpt_train.py and training.sample: `start(__name__)`
on its first lines, before the slow imports; in main(), `phases()` (the process's clock, training/clock.py) and
`with one_line_errors(...)` around the work; under `__main__`, `run(main)`. The standard library only."""
import contextlib
import os
import signal
import sys
import threading

from training import signals
from training.clock import Phases, process_seconds

IMPORTS = [None, None]  # (start, end) of the first script's imports, in process_seconds()


def start(name, stops=False):
    """Before the slow imports; the first script's start counts (gpt_train.py imports training.sample). Run as a
    program: a Ctrl-C before main() is one line and 130, not an import traceback (a background job's ignored
    SIGINT stays ignored); with `stops`, USR1/TERM are remembered for the StopFlag (training/signals.py)."""
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
    """The process's Phases: start-up, the imports (up to main()'s first line), then "inputs"."""
    if IMPORTS[1] is None:
        IMPORTS[1] = process_seconds()
    return Phases(IMPORTS if IMPORTS[0] is not None else None)


@contextlib.contextmanager
def one_line_errors(interrupted=None):
    """A UserError is `error: ...` on one line and exit 1; a Ctrl-C is one line ending in interrupted() (what is
    kept) and exit 130 (None: gpt_train's StopFlag handles it). The failed write that TensorBoard's writer thread
    re-raises is the main thread's one line: not printed a second time, as a traceback."""
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
