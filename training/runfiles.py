"""What every script shares about its outputs, run folders and flags: strict JSON written atomically,
output paths checked before any work, a lock on a run directory, content hashes, one-line user errors.

    UserError                  the base of every one-line user error (OutputError, TextError, ...)
    write_json(path, obj)      own tmp file + rename; NaN/inf become null (strict JSON, any reader)
    check_output(path, what)   before training: the path can be written, or one clear error
    check_outputs_not_inputs   before training: no output path is one of the run's inputs
    RunLock(dir)               one run per directory; the kernel drops the lock when a process dies
    claim_run_dir(dir, program)  a run directory: new, empty or this program's; locked; a failed start undone
    new_run_name()             a default run folder's name: the time and a random suffix (runs started together)
    path_flag, seed_flag       argparse types: an empty path is refused (not the current folder); a seed in range
    quiet_writer_thread()      TensorBoard's writer thread: a failed write stops the run in one line, not two tracebacks
    sha256_file(path)          what a checkpoint or a run depends on, by content
    cpu_name()                 the processor, for the hardware every measurement names
"""
import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import socket
import tempfile
import threading
import time
from pathlib import Path


def reason(error):
    """An OSError's reason without its errno prefix ("No space left on device"); any other error as it reads."""
    return getattr(error, "strerror", None) or error


class UserError(Exception):
    """What a user can get wrong (flags, data, paths): every script's main() prints it as one line
    on stderr and exits non-zero, never a traceback. Each concern subclasses it for its own name."""


class OutputError(UserError):
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
    The temporary name is the writer's own (host, process, thread, random), so writers of one file at
    once (the processes of a multi-GPU job) do not rename each other's halves; the last rename wins.
    A write that fails (a full disk) is one OutputError naming the path, and leaves no temporary file."""
    path = Path(path)
    data = (json.dumps(strict(obj), indent=2, allow_nan=False, default=str) + "\n").encode("utf-8")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = create_exclusive(path)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {reason(e)}") from None


def create_exclusive(path, attempts=8):
    """(name, fd) of a new temporary file beside `path`, created with O_EXCL | O_NOFOLLOW: a file or a
    symlink already at the name (planted there to redirect the write) is never opened, another name is
    drawn instead."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for _ in range(attempts):
        tmp = temporary_name(path)
        try:
            return tmp, os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"{attempts} temporary names beside it were taken")


def temporary_name(path):
    return path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}."
                          f"{secrets.token_hex(4)}.tmp")


def check_outputs_not_inputs(outputs, inputs):
    """Refuse, before any work, an output that would overwrite an input or another output.
    `outputs`, `inputs`: {flag: path or None}. Paths are compared resolved (symlinks, `..`; hard links
    of existing files too); an existing file inside an input folder (a tokenizer folder) counts."""
    seen = {flag: (Path(p), Path(p).resolve(), "an input") for flag, p in inputs.items() if p is not None}
    for flag, path in ((f, p) for f, p in outputs.items() if p is not None):
        out = Path(path).resolve()
        for other, (given, there, role) in seen.items():
            inside = role == "an input" and there in out.parents and out.exists()
            if out == there or inside or same_file(out, there):
                raise OutputError(f"{flag} {path} would overwrite {other} {given} ({role}): give another path")
        seen[flag] = (Path(path), out, "an output too")


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def check_output(path, what):
    """Fail now, not after the work, if `path` (a file to be written) cannot be: its folder is created
    and a probe file written and removed there."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; give a file name")
    probe_folder(path.parent, f"{what} {path}")


def check_output_dir(path, what):
    """The same for a folder the run will fill (a read-only cache folder: one line, not a filelock traceback)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder")
    probe_folder(path, f"{what} {path}")


def probe_folder(folder, named):
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise OutputError(f"{named} cannot be written ({reason(e)})") from None


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


OWNER_FILE = "run.owner"  # names the program that made a run directory: only it may use the folder again
BOOKKEEPING = {"run.lock", OWNER_FILE}  # what a start writes before any work; alone, they hold nothing


def path_flag(text):
    """A path flag's value; an empty one (`--out-dir=`, a shell variable left unset) would mean the current
    folder, so it is refused instead."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder or file name (an empty value would mean "
                                         "the current folder)")
    return Path(text)


def seed_flag(text):
    """A seed flag's value: in [0, 2^32), the range every generator here (torch, numpy, datasets) takes."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"a seed must be in [0, 2^32), got {text}")
    return value


def new_run_name():
    """The time and a random suffix: two runs started in the same second (a job array) get two folders."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_dir_problem(path, program, what="--out-dir", reuse=True):
    """None if `path` may hold a run of `program` (new, empty but for BOOKKEEPING, or, with `reuse` (a
    resume), its OWNER_FILE names `program`), else why not. Only the folder's listing and owner file are
    read: nothing is written."""
    path = Path(path)
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{what} {path} is a file, not a folder"
    if not {p.name for p in path.iterdir()} - BOOKKEEPING:
        return None
    try:
        owner = (path / OWNER_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        owner = None
    if owner == program and reuse:
        return None
    whose = (f"a run of {program} already (runs are never overwritten)" if owner == program else
             f"a run of {owner}" if owner else f"files that are not a run of {program} (no {OWNER_FILE})")
    return f"{what} {path} is not empty: it holds {whose}; give a new or empty folder (nothing was written)"


def claim_run_dir(path, program, stack, what="--out-dir", reuse=True):
    """Take `path` for a run of `program` until `stack` closes: refused in one OutputError, before anything
    is written, unless run_dir_problem() allows it; then created, written probe-checked, locked (RunLock)
    and marked (OWNER_FILE). When `stack` closes, a folder that still holds nothing but BOOKKEEPING (a
    start that failed before any work) is removed if this call made it, so the retry finds it as it was."""
    path = Path(path)
    problem = run_dir_problem(path, program, what, reuse)
    if problem:
        raise OutputError(problem)
    fresh = not path.exists()
    check_output_dir(path, what)
    stack.enter_context(RunLock(path))
    stack.callback(remove_if_unused, path, fresh)  # only once locked: another run's lock file is never touched
    if not (path / OWNER_FILE).is_file() or (path / OWNER_FILE).read_text().strip() != program:
        (path / OWNER_FILE).write_text(program + "\n")
    return path


def remove_if_unused(path, made_here):
    """A run folder that holds only BOOKKEEPING: its files go, and the folder too if this run made it."""
    try:
        if {p.name for p in path.iterdir()} - BOOKKEEPING:
            return
        for name in BOOKKEEPING:
            (path / name).unlink(missing_ok=True)
        if made_here:
            path.rmdir()
    except OSError:  # already gone, or not ours to clean: nothing to undo
        pass


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


@contextlib.contextmanager
def quiet_writer_thread():
    """TensorBoard's writer thread keeps a failed write (a full disk) for the main thread, which stops
    the run in one line, and then re-raises it, so threading would print a second, long traceback."""
    previous = threading.excepthook

    def hook(info):
        if not (isinstance(info.exc_value, OSError) and type(info.thread).__name__ == "_AsyncWriterThread"):
            previous(info)
    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous
