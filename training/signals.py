"""Stop signals. gpt_train.py catches USR1/TERM from its first line (lifecycle.start(stops=True), before
torch's seconds of import), so that Slurm's warning or a scancel during start-up is remembered instead of
killing the job unsaved; the StopFlag then takes over for the whole run, and at exit USR1/TERM are ignored,
so that a TERM during the exit itself does not turn its code into 143."""
import atexit
import contextlib
import signal
import sys

PENDING = []  # signals that arrived before the StopFlag existed


def catch_early():
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: PENDING.append(signum))
    atexit.register(ignore_stops)  # registered first, so it runs last of the exit functions


def ignore_stops():
    """At exit: Python resets its handlers to the default (death) before tearing torch down, which
    takes a while; a TERM then (Slurm's, seen 0.3 s after USR1) would end a checkpointed run with 143,
    and gpt.sh requeues only on 3. SIG_IGN is the one setting that survives that reset."""
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def no_teardown_after_collectives(agreed=(0,)):
    """Around a script's main(): a process of a multi-process run (torchrun, accelerate launch) leaves
    without the interpreter's teardown, with main()'s exit code, once every rank is past its last
    collective. The backend's worker thread can still hold the last reference to a finished
    collective; when it drops it while Python finalizes, the thread dies taking the GIL and the
    process aborts ("terminate called without an active exception", exit -6), so torchrun and Slurm
    call a finished run failed; destroy_process_group does not prevent it (benchmarks/exit_bench.py
    counts the three ways of ending). One process leaves the same way: the teardown is time on the job's
    clock for nothing (training/clock.exit_quickly).
    `agreed`: the exit codes every rank reaches together (0, done; gpt_train adds STOP_EXIT_CODE); they
    end with a last barrier, so that no rank is gone while another is still in a collective."""
    code = 0
    try:
        yield
    except SystemExit as e:
        code = e.code
    from training.clock import exit_quickly
    dist = sys.modules.get("torch.distributed")  # not loaded: no process group to wait for
    several = dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if several and (code or 0) in agreed:
        dist.barrier()  # not after an error: the other ranks may never come (torchrun ends them)
    exit_quickly(code)  # sys.exit("error: ...")'s message printed, status 1


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
    """Whether every process stops after this step (called once per step by all of them).

    One process: its own flag. Several: the flag's all-reduce is enqueued every step and its result
    copied to pinned host memory behind an event; the next step reads that copy, which waits only for
    the previous step's GPU work, not for the step the GPU is still running (a read of this step's
    result would drain the pipeline every step). Every process reads the same value after the same
    step: the stop comes one step after the signal reached any of them, well within torchrun's 30 s
    grace. At a sync point of the loop (a log point, a checkpoint) this step's value is read at once."""

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
