"""gpt_train.py's stop signals: USR1/TERM (Slurm's warning, a scancel) remembered from its first line, before
torch's import (lifecycle.start(stops=True)); the StopFlag for the run, its agreement across ranks."""
import atexit
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
