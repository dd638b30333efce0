"""The job's clock: what `time` and Slurm's Elapsed show, and where its seconds went. process_seconds() counts
from the process's start as the OS records it (the interpreter's start-up and the imports count; a clock started
in main() misses them); Phases splits those seconds into named phases that sum to it. Every script's metrics
carry both (`process_seconds`, `phases`). The standard library only: imported before torch."""
import contextlib
import os
import time


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
