"""Stop signals: USR1/TERM (Slurm's warning, a scancel) remembered from gpt_train.py's first line, before torch's
import (lifecycle.start(stops=True)); the StopFlag for the run, its agreement across ranks; the exit."""
import atexit
import contextlib
import os
import signal
import sys

PENDING = []  # signals that arrived before the StopFlag existed


def catch_early():
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: PENDING.append(signum))
    atexit.register(ignore_stops)  # registered first, so it runs last of the exit functions


def ignore_stops():
    """At exit Python resets its handlers to death before torch's slow teardown; a TERM then (Slurm's, 0.3 s
    after USR1) would turn a checkpointed run's 3 (gpt.sh requeues on it) into 143. SIG_IGN survives the reset."""
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def no_teardown_after_collectives(agreed=(0,)):
    """Around a script's main(): leave with main()'s exit code without the interpreter's teardown. In a
    multi-process run the backend's worker thread can hold the last reference to a finished collective; dropped
    while Python finalizes, the process aborts (exit -6) and torchrun calls a finished run failed, whatever
    destroy_process_group does (benchmarks/exit_bench.py). One process: torch's teardown costs ~0.3-0.7 s of a
    2-core VM's process time for nothing. `agreed`: the exit codes every rank reaches together (0; gpt_train's
    STOP_EXIT_CODE), after a last barrier."""
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


class StopFlag:
    """USR1/TERM (Slurm's warning before the time limit, scancel) and Ctrl-C: finish the step,
    checkpoint, exit with STOP_EXIT_CODE. A second Ctrl-C aborts at once."""
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
    """Whether every process stops after this step (called once per step by all). Several processes: the flag's
    all-reduce is enqueued every step, copied to pinned memory behind an event and read the next step, which
    waits for that step's GPU work only: all stop one step after the signal reached any; at a sync point (a log,
    a checkpoint) it is read at once."""

    def __init__(self, accelerator, stop):
        self.accelerator, self.stop, self.pending = accelerator, stop, None

    def __call__(self, at_sync_point):
        import torch  # here, not at the top: this module is imported before torch, to catch signals early
        flag = self.stop.signal is not None
        if self.accelerator.num_processes == 1:
            return flag
        device = self.accelerator.device
        # torch.full: a fill kernel; torch.tensor([...], device=cuda) would copy from the host and sync
        reduced = self.accelerator.reduce(torch.full((1,), float(flag), device=device), reduction="sum")
        if at_sync_point:
            self.pending = None
            return reduced.item() > 0
        previous, self.pending = self.pending, (reduced, None)
        if device.type == "cuda":
            host = torch.empty(1, pin_memory=True)
            host.copy_(reduced, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending = (host, event)
        if previous is None:
            return False
        value, event = previous
        if event is not None:
            event.synchronize()  # the previous step's work: done, or nearly
        return value.item() > 0
