"""Files the scripts share: strict JSON written atomically, output paths checked before any work,
a lock on a run directory, and content hashes.

    write_json(path, obj)      own tmp file + rename; NaN/inf become null (strict JSON, any reader)
    check_output(path, what)   before training: the path can be written, or one clear error
    RunLock(dir)               one run per directory; the kernel drops the lock when a process dies
    sha256_file(path)          what a checkpoint or a run depends on, by content
    cpu_name()                 the processor, for the hardware every measurement names
"""
import fcntl
import hashlib
import json
import math
import os
import socket
import tempfile
import threading
from pathlib import Path


class OutputError(Exception):
    """An output path that cannot be written: reported as one line before any work starts."""


def strict(obj):
    """obj with every non-finite float replaced by None, so json.dumps(allow_nan=False) accepts it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def write_json(path, obj):
    """Write obj as strict JSON via a temporary file and a rename: a reader never sees half a file.
    The temporary name is the writer's own (host, process, thread), so writers of one file at once
    (the processes of a multi-GPU job) do not rename each other's halves; the last rename wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(strict(obj), indent=2, allow_nan=False, default=str) + "\n")
    tmp.replace(path)


def check_output(path, what):
    """Fail now, not after the work, if `path` (a file to be written) cannot be: its folder is created
    and a probe file written and removed there."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise OutputError(f"{what} {path} cannot be written ({e.strerror or e})") from e


def check_output_dir(path, what):
    """The same for a folder the run will fill."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder")
    check_output(path / "probe", what)


class RunLock:
    """An exclusive flock on DIR/run.lock, held while the run lives: a second run on the same
    directory (a double sbatch, a second terminal) stops at once. The kernel releases it when
    the process ends, however it ends, so a killed run never leaves a stale lock."""

    def __init__(self, directory):
        self.path = Path(directory) / "run.lock"
        self.file = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "?"
            self.file.close()
            raise OutputError(f"{self.path.parent} is in use by another run (pid {holder}); "
                              f"wait for it or pick another --out-dir") from None
        self.file.truncate(0)
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc):
        self.file.close()  # closing releases the lock


def sha256_file(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cpu_name():
    """The processor's model name (from /proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
