"""A script's life and its clock, the same in lenet5.py, tokenizer_train.py, gpt_train.py and training.sample:
`start(__name__)` on its first lines, before the slow imports; in main(), `phases()` and `with one_line_errors(...)`
around the work; under `__main__`, `run(main)`. The standard library only: imported before torch.

The clock is what `time` and Slurm's Elapsed show: process_seconds() counts from the process's start as the OS
records it (the interpreter's start-up and the imports count; a clock started in main() misses them), and Phases
splits those seconds into named phases that sum to it. Every script's metrics carry both."""
import contextlib
import os
import signal
import sys
import threading
import time

from training import signals


def _started():
    """(a clock, this process's start on it): Linux records the start in clock ticks since boot (/proc/self/stat,
    field 22) on CLOCK_BOOTTIME. Elsewhere (macOS): this module's import, which misses the interpreter's start-up."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return time.CLOCK_BOOTTIME, int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        return time.CLOCK_MONOTONIC, time.clock_gettime(time.CLOCK_MONOTONIC)


CLOCK, START = _started()
IMPORTS = [None, None]  # (start, end) of the first script's imports, in process_seconds()


def process_seconds():
    return time.clock_gettime(CLOCK) - START


class Phases:
    """`switch(name)` ends the current phase and starts `name`; `with phases.of(name):` runs a nested phase and
    returns to the one it interrupted. `imports`: (start, end) of a script's imports in process_seconds():
    "startup" (the interpreter's own) ends at the start, "imports" at the end, then "inputs" runs."""

    def __init__(self, imports=None):
        started, done = imports or (0.0, 0.0)
        self.seconds = {"startup": started, "imports": done - started} if imports else {}
        self.current, self.since = ("inputs", done) if imports else ("startup", 0.0)

    def switch(self, name):
        now = process_seconds()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.since
        self.current, self.since = name, now
        return self

    @contextlib.contextmanager
    def of(self, name):
        previous = self.current
        self.switch(name)
        try:
            yield
        finally:
            self.switch(previous)

    def log(self, writer, step):
        """Into TensorBoard: a scalar per phase and a table (the text tab)."""
        spent, now = self.record()
        for name, seconds in spent.items():
            writer.add_scalar(f"phases/{name}_seconds", seconds, step)
        writer.add_text("phases", "| phase | seconds |\n|---|---|\n" +
                        "".join(f"| {k} | {v:.2f} |\n" for k, v in spent.items()) + f"| process | {now:.2f} |", step)

    def stamp(self, metrics):
        """`metrics` with the process's seconds and where they went: taken just before the last output."""
        spent, now = self.record()
        return {**metrics, "process_seconds": now, "phases": spent}

    def record(self):
        """({phase: seconds} up to now, in the order the phases first ran; the process's seconds)."""
        self.switch(self.current)
        return {k: round(v, 3) for k, v in self.seconds.items()}, round(self.since, 3)


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


@contextlib.contextmanager
def no_teardown_after_collectives(agreed=(0,)):
    """Leave with the block's exit code without the interpreter's teardown. In a multi-process run the backend's
    worker thread can hold the last reference to a finished collective; dropped while Python finalizes, the process
    aborts (exit -6) and torchrun calls a finished run failed, whatever destroy_process_group does
    (benchmarks/exit_bench.py). One process: torch's teardown costs ~0.3-0.7 s of a 2-core VM's process time for
    nothing. `agreed`: the exit codes every rank reaches together (0; gpt_train's STOP_EXIT_CODE), after a barrier."""
    code = 0
    try:
        yield
    except SystemExit as e:
        code = e.code
    dist = sys.modules.get("torch.distributed")  # not loaded: no process group to wait for
    several = dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if several and (code or 0) in agreed:
        dist.barrier()  # not after an error: the other ranks may never come (torchrun ends them)
    if isinstance(code, str):  # sys.exit("error: ...") as Python would: the message, status 1
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def run(main, agreed=(0,)):
    with no_teardown_after_collectives(agreed):
        main()
