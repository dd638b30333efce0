"""What every script shares about its outputs, run folders and flags: files written atomically, output
paths checked before any work, a lock on a run directory, content hashes, one-line user errors.
The rules live here, one each, for every script:

    write_atomic(path, data)   the one way the project writes a file: its own new file beside it (exclusive,
                               no-follow: a planted link is never opened), renamed over `path` (a link replaced)
    check_output(path, what, program)  ownership: no output inside another run's folder (run.owner), no file
                               replaced that `program` did not write (the mark write_atomic leaves on it)
    path_problem(path)         why a path flag's value cannot be used (a name too long, a looping or dangling link,
                               any OSError but not found): training/flags.py's path_flag, every path flag's type
    read_small(path, limit)    a small file of the project's own (owner, manifest): plain, no-follow, bounded

    UserError                  the base of every one-line user error (OutputError, TextError, ...)
    write_json(path, obj)      write_atomic of strict JSON; NaN/inf become null (any reader)
    check_outputs_not_inputs   before training: no output path is one of the run's inputs
    RunLock, claim_run_dir     one run per directory: new, empty or this program's, locked, a failed start undone;
                               run.lock and run.owner never followed (a link among them: the folder is not empty)
    set_aside_earlier_attempt  an unfinished attempt's files moved into earlier-attempt-<time>/, never mixed in
    new_run_name()             a default run folder's name: the time and a random suffix (runs started together)
    quiet_writer_thread()      TensorBoard's writer thread: a failed write stops the run in one line, not two tracebacks
    sha256_file(path)          what a checkpoint or a run depends on, by content
"""
import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from data.files import (
    NAME_MAX,
    OWNER_FILE,
    OutputError,
    UserError,
    check_output_dir,
    inside_another_run,
    path_problem,
    probe_folder,
    read_small,
    reason,
    sha256_file,
    strict,
)

__all__ = ['NAME_MAX', 'UserError', 'check_output_dir', 'path_problem', 'probe_folder', 'sha256_file', 'strict']


def write_json(path, obj):
    """Write obj as strict JSON with write_atomic: a reader never sees half a file."""
    write_atomic(path, (json.dumps(strict(obj), indent=2, allow_nan=False, default=str) + "\n").encode("utf-8"))


def write_atomic(path, data):
    """Write `data` (bytes, or a function writing into a binary file: torch.save) to `path` via the writer's
    own temporary file (create_exclusive: writers of one file at once never rename each other's halves) and
    a rename (a link at `path` is replaced, not written through); a path check_output claimed gets its mark.
    A failed write (a full disk) is one OutputError; no temporary file stays, the old file is as it was."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, fd = create_exclusive(path)
        with os.fdopen(fd, "wb") as f:
            data(f) if callable(data) else f.write(data)
        if os.path.abspath(path) in CLAIMED:
            mark(tmp, path, CLAIMED[os.path.abspath(path)])
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {reason(e)}") from None


def temporary_name(path):
    """<name>.<host>.<pid>.<thread>.<random>.tmp, the name cut so that the whole fits NAME_MAX."""
    suffix = f".{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp"
    return path.with_name(os.fsdecode(os.fsencode(path.name)[:NAME_MAX - len(os.fsencode(suffix))]) + suffix)


def create_exclusive(path, attempts=8):
    """(name, fd) of a new temporary file beside `path`, O_EXCL | O_NOFOLLOW: a file, folder or link already
    at the name (planted to redirect the write) is never opened; another name is drawn instead."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for _ in range(attempts):
        tmp = temporary_name(path)
        try:
            return tmp, os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"{attempts} temporary names beside it were taken")


# ----------------------------------------------------------------------------- output paths

MARK = "user.lab5.written-by"  # extended attribute: the program that wrote an output file (write_atomic)
CLAIMED = {}  # absolute output path -> the program whose check_output claimed it: what write_atomic marks
MARKS_FILE = ".lab5-written-by"  # where a file system keeps no user attributes (NFSv3): the marks of its folder
NO_XATTRS = (errno.ENOTSUP, errno.EOPNOTSUPP)


def mark(tmp, path, program):
    """`program` wrote `tmp` (renamed to `path` next): its extended attribute, or, on a file system without them,
    a line in the folder's MARKS_FILE naming the file with its size and modification time (a later replacement
    by anything else no longer matches)."""
    try:
        os.setxattr(tmp, MARK, program.encode(), follow_symlinks=False)
    except OSError as e:
        if e.errno in NO_XATTRS:
            with contextlib.suppress(OSError, ValueError):
                marks = marks_of(path.parent)
                info = os.stat(tmp)
                marks[path.name] = [program, info.st_size, info.st_mtime_ns]
                write_atomic(path.parent / MARKS_FILE, json.dumps(marks).encode())


def marks_of(folder):
    try:
        marks = json.loads(read_small(Path(folder) / MARKS_FILE, 1 << 20))
    except (OSError, ValueError):
        return {}
    return marks if isinstance(marks, dict) else {}


def writer_of(path):
    """The program whose mark `path` carries, or None; OSError(ENOTSUP) read from the folder's MARKS_FILE."""
    try:
        return os.getxattr(path, MARK, follow_symlinks=False).decode(errors="replace")
    except OSError as e:
        if e.errno not in NO_XATTRS:
            return None
    info, entry = os.stat(path, follow_symlinks=False), marks_of(path.parent).get(path.name)
    return entry[0] if isinstance(entry, list) and entry[1:] == [info.st_size, info.st_mtime_ns] else None


def output_problem(path, what, program, own_run=None):
    """The ownership rule, for every output path: None, or why `program` may not write `path`.
    Refused: a path inside another run's folder (OWNER_FILE names it; `own_run`, this run's folder, is
    allowed), and an existing file that `program` did not write (no mark, another's mark, a link)."""
    path = Path(path)
    if path.name in BOOKKEEPING:  # another run's, or this run's own lock or owner: never an output
        return f"{what} {path}: {path.name} is a run folder's bookkeeping file; give another name"
    problem = inside_another_run(path, what, own_run)
    if problem or not os.path.lexists(path) or program is None:
        return problem
    if path.is_symlink() or not path.is_file():
        kind = "a symbolic link" if path.is_symlink() else "not a plain file"
        return f"{what} {path} exists and is {kind}; give a new file name (it was left as it is)"
    writer = writer_of(path)
    by = f"it was written by {writer}" if writer else "no mark of this project's"
    if writer != program:
        return (f"{what} {path} exists and {program} did not write it ({by}); give a new file name, or move "
                f"it away first (it was left as it is)")
    return None


def check_output(path, what, program=None, own_run=None):
    """Fail now, not after the work, if `path` (a file to be written) cannot or may not be: path_problem,
    output_problem (with `program`: the ownership rule whole, else only the run folders), its folder
    created and a probe file written and removed there. Then the path is `program`'s: write_atomic marks
    what it writes there."""
    path = Path(path)
    problem = path_problem(path)
    problem = (f"{what} {path}: {problem}" if problem else f"{what} {path} is a folder; give a file name"
               if path.is_dir() else output_problem(path, what, program, own_run))
    if problem:
        raise OutputError(problem)
    probe_folder(path.parent, f"{what} {path}")
    if program:
        CLAIMED[os.path.abspath(path)] = program


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


class RunLock:
    """An exclusive flock on DIR/run.lock, held while the run lives: a second run on the same directory (a
    double sbatch, a second terminal) stops at once. The kernel releases it when the process ends, however
    it ends. The lock is the file's inode, so the file is reused (open_lock_file), and its pid written in."""

    def __init__(self, directory):
        self.path = Path(directory) / "run.lock"
        self.fd = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = open_lock_file(self.path)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise OutputError(f"{self.path.parent} is in use by another run (pid {holder}); "
                              f"wait for it or pick another --out-dir") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the lock


def open_lock_file(path):
    """A file descriptor of the run lock `path`, made if missing (create_exclusive, then a hard link to the
    name: never through a link), opened no-follow; OutputError if it is a link, a folder, a device or a file
    with other names (hard links): not a lock this project made, so the pid can land nowhere else."""
    for _ in range(8):
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
            break
        except FileNotFoundError:
            tmp, fd = create_exclusive(path)
            try:
                os.link(tmp, path)  # fails, never follows, if the name was taken meanwhile
                break
            except FileExistsError:
                os.close(fd)
            finally:
                tmp.unlink()
        except OSError as e:
            raise OutputError(f"{path} is not a run lock ({reason(e)}): remove it, or pick another --out-dir") from None
    else:
        raise OutputError(f"{path} keeps changing: another program is making and removing it")
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        return fd
    os.close(fd)
    raise OutputError(f"{path} is not a run lock (not a plain file of one name): remove it, or pick another --out-dir")


BOOKKEEPING = {"run.lock", OWNER_FILE}  # what a start writes before any work; alone, they hold nothing


def new_run_name():
    """The time and a random suffix: two runs started in the same second (a job array) get two folders."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_dir_problem(path, program, what="--out-dir", reuse=True):
    """None if `path` may hold a run of `program` (new, empty but for BOOKKEEPING, or, with `reuse` (a
    resume), its OWNER_FILE names `program`), else why not: also a path path_problem() refuses, and a
    folder inside another run's. Only listings and the owner file are read: nothing is written."""
    path = Path(path)
    problem = path_problem(path) or inside_another_run(path, what)
    if problem:
        return problem if problem.startswith(what) else f"{what} {path}: {problem}"
    if not path.exists():
        return None
    if not path.is_dir():
        return f"{what} {path} is a file, not a folder"
    if bookkeeping_only(path):
        return None
    owner = read_owner(path)
    if owner == program and reuse:
        return None
    whose = (f"a run of {program} already (runs are never overwritten)" if owner == program else
             f"a run of {owner}" if owner else f"files that are not a run of {program} (no {OWNER_FILE})")
    return f"{what} {path} is not empty: it holds {whose}; give a new or empty folder (nothing was written)"


def bookkeeping_only(path):
    """Whether folder `path` holds nothing but BOOKKEEPING, each a plain file: a link named run.lock or
    run.owner (planted to redirect a write) is not this project's, and makes the folder not empty."""
    with os.scandir(path) as entries:
        return all(e.name in BOOKKEEPING and e.is_file(follow_symlinks=False) for e in entries)


def read_owner(path):
    """The program folder `path`'s OWNER_FILE names (read_small), else None."""
    try:
        return read_small(path / OWNER_FILE, 256).decode(errors="replace").strip() or None
    except (OSError, ValueError):
        return None


def claim_run_dir(path, program, stack, what="--out-dir", reuse=True):
    """Take `path` for a run of `program` until `stack` closes: refused in one OutputError, before anything
    is written, unless run_dir_problem() allows it; then created, written probe-checked, locked (RunLock)
    and marked (OWNER_FILE, by write_atomic). When `stack` closes, a folder that still holds nothing but
    BOOKKEEPING (a start that failed before any work) is removed if this call made it, so the retry finds
    it as it was."""
    path = Path(path)
    problem = run_dir_problem(path, program, what, reuse)
    if problem:
        raise OutputError(problem)
    fresh = not path.exists()
    check_output_dir(path, what)
    stack.enter_context(RunLock(path))
    stack.callback(remove_if_unused, path, fresh)  # only once locked: another run's lock file is never touched
    if read_owner(path) != program:
        write_atomic(path / OWNER_FILE, f"{program}\n".encode())
    return path


def remove_if_unused(path, made_here):
    """A run folder that holds only BOOKKEEPING: its files go, and the folder too if this run made it."""
    try:
        if not bookkeeping_only(path):
            return
        for name in BOOKKEEPING:
            (path / name).unlink(missing_ok=True)
        if made_here:
            path.rmdir()
    except OSError:  # already gone, or not ours to clean: nothing to undo
        pass


def set_aside_earlier_attempt(out_dir, why):
    """What an earlier attempt left in a run folder of ours that this run will not continue (its args.json,
    TensorBoard events, a checkpoint that does not verify) goes into earlier-attempt-<time>/: this run's
    curves and arguments are its own, and TensorBoard shows the old ones as a run of their own."""
    left = [p for p in out_dir.iterdir() if p.name not in BOOKKEEPING and not p.name.startswith("earlier-attempt-")]
    if not left:
        return None
    aside = out_dir / f"earlier-attempt-{new_run_name()}"
    aside.mkdir()
    for path in left:
        os.replace(path, aside / path.name)
    print(f"note: {out_dir} held an earlier attempt ({why}); its files are kept in {aside.name}/", file=sys.stderr)
    return aside


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
