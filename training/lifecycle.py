"""A script's life and its clock: `start(__name__)` before the slow imports, `phases()` and `one_line_errors()` in
main(), `run(main)` under `__main__`; process_seconds() counts from the process's start as the OS records it (what
`time` and Slurm show); gpt_train's stop signals (StopFlag, StopAgreement). The standard library only."""
import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from datetime import timedelta

try:  # (a clock, this process's start on it): Linux's /proc/self/stat field 22, in ticks since boot
    with open("/proc/self/stat") as _stat:
        _fields = _stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    CLOCK, START = time.CLOCK_BOOTTIME, int(_fields[19]) / os.sysconf("SC_CLK_TCK")
except (OSError, AttributeError, ValueError, IndexError):  # macOS: this module's import (not the interpreter's)
    CLOCK, START = time.CLOCK_MONOTONIC, time.clock_gettime(time.CLOCK_MONOTONIC)
IMPORTS = [None, None]  # (start, end) of the first script's imports, in process_seconds()
PENDING = []  # stop signals that arrived before the StopFlag existed


def process_seconds():
    return time.clock_gettime(CLOCK) - START


class Phases:
    """`switch(name)` ends the current phase and starts `name`; `with phases.of(name):` a nested one. `imports`:
    (start, end) of a script's imports: "startup" ends at the start, "imports" at the end, then "inputs" runs."""

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
        """Into TensorBoard: a scalar per phase."""
        for name, seconds in self.record()[0].items():
            writer.add_scalar(f"phases/{name}_seconds", seconds, step)

    def stamp(self, metrics):
        """`metrics` with the process's seconds and where they went: taken just before the last output."""
        spent, now = self.record()
        return {**metrics, "process_seconds": now, "phases": spent}

    def record(self):
        """({phase: seconds} up to now, in the order the phases first ran; the process's seconds)."""
        self.switch(self.current)
        return {k: round(v, 3) for k, v in self.seconds.items()}, round(self.since, 3)


def start(name, stops=False):
    """As a program: a Ctrl-C before main() is one line and 130; bars on a terminal only; `stops`: USR1/TERM kept."""
    if IMPORTS[0] is None:
        IMPORTS[0] = process_seconds()
    if name != "__main__":
        return
    # no progress bars in a file (a Slurm log: their '\r' redraws make one endless line; log_line()s instead), nor in
    # torchrun's other processes: tqdm's own switch, read at its import, for every library's bars
    if not sys.stderr.isatty() or os.environ.get("RANK", "0") != "0":
        os.environ.setdefault("TQDM_DISABLE", "1")
        sys.stdout.reconfigure(line_buffering=True)  # each line in the file as it is printed, as stderr's
    if stops:  # Slurm's warning or a scancel before the StopFlag exists: kept for it
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: PENDING.append(signum))
            # at exit (registered first: run last) Python has reset its handlers before torch's teardown: a TERM
            # then (Slurm's, 0.3 s after USR1) would turn a checkpointed run's 3 (gpt.sh requeues on it) into 143
            atexit.register(signal.signal, sig, signal.SIG_IGN)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _while_starting)


def log_line(bar, step, total, values, seconds_left):
    """A log point: on a terminal in the bar (if any); elsewhere (start(): no bars) a line of its own,
    `step 120/184 | loss 5.930 | 412,000 tok/s | ETA 0:00:41`."""
    if sys.stderr.isatty():
        return bar and bar.set_postfix_str(", ".join(values), refresh=False)  # drawn by the bar's next update
    eta = "?" if seconds_left is None else timedelta(seconds=round(seconds_left))  # None: no pace known yet
    print(" | ".join([f"step {step:,}/{total:,}", *values, f"ETA {eta}"]))


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
    """A UserError is `error: ...` on one line and exit 1; a Ctrl-C one line ending in interrupted() (what is kept)
    and exit 130 (None: the StopFlag's). TensorBoard's writer thread's failed write: the main thread's line only."""
    from training.errors import UserError
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
    except (KeyboardInterrupt, Exception) as e:  # Exception: a Ctrl-C that Python wrapped (ctrl_c_within)
        if interrupted is None or not ctrl_c_within(e):
            raise
        print(f"\ninterrupted (Ctrl-C): {interrupted()}", file=sys.stderr)
        sys.exit(130)
    finally:
        threading.excepthook = previous


def ctrl_c_within(error):
    """A Ctrl-C that Python wrapped: raised in a class body being created (an import torch makes lazily), it
    surfaces as RuntimeError("Error calling __set_name__ ...") caused by the KeyboardInterrupt."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class StopFlag:
    """USR1/TERM/Ctrl-C: finish the step, checkpoint, exit STOP_EXIT_CODE; a second Ctrl-C aborts at once."""
    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

    def __enter__(self):
        self.signal = signal.Signals(PENDING[0]).name if PENDING else None
        self.previous = {sig: signal.signal(sig, self._set) for sig in self.SIGNALS}
        return self

    def _set(self, signum, frame):
        if signum == signal.SIGINT:
            if self.signal == "SIGINT":
                raise KeyboardInterrupt
            print("\nCtrl-C: checkpointing after this step (Ctrl-C again aborts without saving)", file=sys.stderr)
        self.signal = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class StopAgreement:
    """Whether every process stops after this step. The flag's all-reduce is read one step late (no drained
    pipeline every step): all stop one step after the signal reached any; at a sync point, at once."""

    def __init__(self, accelerator, stop):
        self.accelerator, self.stop, self.pending = accelerator, stop, None

    def __call__(self, at_sync_point):
        import torch  # here, not at the top: this module is imported before torch
        flag = self.stop.signal is not None
        if self.accelerator.num_processes == 1:
            return flag
        device = self.accelerator.device
        # torch.full: a fill kernel; torch.tensor([...], device=cuda) would copy from the host and sync
        reduced = self.accelerator.reduce(torch.full((1,), float(flag), device=device), reduction="sum")
        if at_sync_point:
            self.pending = None
            return reduced.item() > 0
        previous, event = self.pending, torch.cuda.Event() if device.type == "cuda" else None
        self.pending = (reduced.to("cpu", non_blocking=True), event)  # from a GPU: into pinned memory, no sync
        if event:
            event.record()
        if previous is None:
            return False
        if previous[1]:
            previous[1].synchronize()  # the previous step's work: done, or nearly
        return previous[0].item() > 0


@contextlib.contextmanager
def no_teardown_after_collectives(agreed=(0,)):
    """Exit with the block's code, without the interpreter's teardown: a collective released by a worker thread
    then aborts a finished rank (exit -6; measured: report/results/exit_bench_cpu.json). `agreed`: codes all
    ranks reach together."""
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
