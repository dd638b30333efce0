"""Run folders and output files, one home, the same rules for every script. A run folder is new, empty or an
unfinished run of the same program's: checked for who else may write it (data/files.check_folder, the one folder
check), flock'd (run.lock) and marked (run.owner) while the run lives, finished once it holds metrics.json and never
written again. An existing output file is replaced only with --force, and only if it is of the kind the scripts
write; no output lands inside another run's folder.

    check_output, check_outputs_not_inputs   an output file, before any work
    open_run (claim_run_dir, RunLock)        a run folder made or reopened, locked and marked
    set_aside_earlier_attempt                an unfinished attempt's files moved apart
    open_run_dir                             gpt_train's: its outputs, its folder, the checkpoint to resume from
"""
import contextlib
import fcntl
import io
import json
import os
import secrets
import sys
import time
import zipfile
from pathlib import Path

from data.files import check_folder, make_folder, path_problem, read_small, write_atomic, writers_problem
from training.errors import OutputError

LOCK_FILE = "run.lock"
OWNER_FILE = "run.owner"  # names the program whose run the folder holds
BOOKKEEPING = {LOCK_FILE, OWNER_FILE}  # what a start writes before any work; alone, they hold nothing
FINISHED = "metrics.json"
WRITTEN_KINDS = {"JSON": "a JSON object", "torch.save": "a torch.save archive", "PDF": "a PDF"}


def output_problem(path, what, own_run=None):
    """Why `path` may not be written, or None: path_problem(), or a folder above it (links, `..` resolved) holds a
    run not `own_run`."""
    if problem := path_problem(path):
        return f"{what} {path}: {problem}"
    run = next((f for f in Path(os.path.realpath(path)).parents if os.path.lexists(f / OWNER_FILE)), None)
    if run and not (own_run and os.path.realpath(run) == os.path.realpath(own_run)):
        return (f"{what} {path} is inside {run}, the folder of another run ({OWNER_FILE}): its files are that "
                f"run's only record; give a path outside it (nothing was written)")
    return None


def check_output(path, what, force=False, own_run=None, kind="JSON"):
    """Fail now, not after the work, if output `path` may not be written (the module's rule; `kind`: its content)."""
    path = Path(path)
    if problem := output_problem(path, what, own_run):
        raise OutputError(problem)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; give a file name")
    if os.path.lexists(path):
        if written_kind(path) != kind:
            raise OutputError(f"{what} {path} exists and is "
                              f"{'a symbolic link' if path.is_symlink() else 'not ' + WRITTEN_KINDS[kind]}, not a "
                              f"file this program writes; give a new file name, or move it away first (it was left "
                              f"as it is)")
        if not force:
            raise OutputError(f"{what} {path} exists; pass --force to replace it, or give a new file name")
    if problem := writers_problem(path):  # a file in /tmp is safe from others (its sticky bit); a folder is not
        raise OutputError(f"{what} {path} {problem}: they could replace it; give a folder of your own")
    make_folder(path.parent, what)


def written_kind(path):
    """The kind of file the scripts write `path` is (WRITTEN_KINDS), or None (notes, a .docx, a link, a FIFO)."""
    with contextlib.suppress(OSError, ValueError):
        data = read_small(path, 256 << 20)
        if data.startswith(b"%PDF-"):  # the report's
            return "PDF"
        with contextlib.suppress(zipfile.BadZipFile):  # torch.save's zip holds <name>/data.pkl, a .docx does not
            if any(n.endswith("/data.pkl") for n in zipfile.ZipFile(io.BytesIO(data)).namelist()):
                return "torch.save"
        return "JSON" if isinstance(json.loads(data), dict) else None
    return None


def check_outputs_not_inputs(outputs, inputs):
    """Refuse an output ({flag: path or None}) that would overwrite an input or another output, compared
    resolved (links, `..`, hard links); an existing file inside an input folder (a tokenizer folder) counts."""
    seen = {flag: (Path(p), Path(p).resolve(), "an input") for flag, p in inputs.items() if p is not None}
    for flag, path in ((f, p) for f, p in outputs.items() if p is not None):
        out = Path(path).resolve()
        for other, (given, there, role) in seen.items():
            inside = role == "an input" and there in out.parents and out.exists()
            if out == there or inside or (out.exists() and there.exists() and os.path.samefile(out, there)):
                raise OutputError(f"{flag} {path} would overwrite {other} {given} ({role}): give another path")
        seen[flag] = (Path(path), out, "an output too")


@contextlib.contextmanager
def RunLock(directory):
    """An exclusive flock on DIR/run.lock while the run lives (a double sbatch stops at once; the kernel releases
    it however the process ends). DIR is checked first (check_folder): no one else can plant a file there."""
    path = Path(directory) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise OutputError(f"{path.parent} is in use by another run (pid {holder}); wait for it or pick "
                              f"another --out-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def new_run_name():
    """The time and a random suffix: two runs started in the same second (a job array) get two folders."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_dir_problem(path, program, reuse=True):
    """None if `path` may hold `program`'s run (new, only BOOKKEEPING, or with `reuse` marked as its), else why not."""
    if problem := output_problem(path, "--out-dir"):
        return problem
    if not path.exists() or path.is_dir() and bookkeeping_only(path):
        return None
    if not path.is_dir():
        return f"--out-dir {path} is a file, not a folder"
    if (owner := read_owner(path)) == program and reuse:
        return None
    whose = (f"a finished run of {program} (metrics.json: runs are never overwritten)" if owner == program else
             f"a run of {owner}" if owner else f"files that are not a run of {program} (no {OWNER_FILE})")
    return f"--out-dir {path} is not empty: it holds {whose}; give a new or empty folder (nothing was written)"


def bookkeeping_only(path):
    """Whether folder `path` holds nothing but BOOKKEEPING, each a plain file (a planted link is not ours)."""
    with os.scandir(path) as entries:
        return all(e.name in BOOKKEEPING and e.is_file(follow_symlinks=False) for e in entries)


def read_owner(path):
    """The program folder `path`'s OWNER_FILE names, else None (a link, a device: read_small refuses it)."""
    with contextlib.suppress(OSError, ValueError):
        return read_small(path / OWNER_FILE, 256).decode(errors="replace").strip() or None
    return None


def claim_run_dir(path, program, stack, reuse=True):
    """Take `path` for a run of `program` until `stack` closes, if run_dir_problem() allows it: checked (no one
    else may write it: its metrics.json could be theirs), made, locked and marked. A start that fails before any
    work leaves the folder as it found it."""
    if problem := run_dir_problem(path, program, reuse):
        raise OutputError(problem)
    fresh = not path.exists()
    check_folder(path, "--out-dir")
    stack.enter_context(RunLock(path))
    stack.callback(remove_if_unused, path, fresh)  # only once locked: another run's lock file is never touched
    if read_owner(path) != program:
        write_atomic(path / OWNER_FILE, f"{program}\n".encode())


def remove_if_unused(path, made_here):
    """A run folder that holds only BOOKKEEPING: its files go, and the folder too if this run made it."""
    with contextlib.suppress(OSError):  # already gone, or not ours to clean: nothing to undo
        if bookkeeping_only(path):
            for name in BOOKKEEPING:
                (path / name).unlink(missing_ok=True)
            if made_here:
                path.rmdir()


def open_run(path, program, stack):
    """claim_run_dir() unless `path` holds a finished run; whether an unfinished attempt is left (resume, set aside)."""
    claim_run_dir(path, program, stack, reuse=not os.path.lexists(path / FINISHED))
    if os.path.lexists(path / FINISHED):  # finished between the check and the lock: the other run's last write
        raise OutputError(f"--out-dir {path} holds a run of {program} that has just finished (metrics.json); "
                          f"give a new folder")
    return any(p.name not in BOOKKEEPING for p in path.iterdir())


def set_aside_earlier_attempt(out_dir, why):
    """An earlier attempt's files into earlier-attempt-<time>/: this run's curves are its own, the old ones apart."""
    left = [p for p in out_dir.iterdir() if p.name not in BOOKKEEPING and not p.name.startswith("earlier-attempt-")]
    if left:
        aside = out_dir / f"earlier-attempt-{new_run_name()}"
        aside.mkdir()
        for path in left:
            os.replace(path, aside / path.name)
        print(f"note: {out_dir} held an earlier attempt ({why}); its files are kept in {aside.name}/", file=sys.stderr)


def open_run_dir(out_dir, args, accelerator, stack):
    """gpt_train's run folder -> (out_dir, checkpoint or None): it and --metrics-out checked, the folder opened
    (open_run), the newest checkpoint that verifies found, an attempt without one set aside; the main process's
    answer."""
    from accelerate.utils import broadcast_object_list  # here: lenet5.py and check_env never load accelerate

    from training.checkpoints import latest_checkpoint
    ckpt, metrics_out = None, args.metrics_out
    if accelerator.is_main_process:
        outputs = {"--out-dir": out_dir}
        for name in ("metrics.json", "args.json", "final", "final.tmp", "final/model.safetensors", "final/config.json"):
            # --metrics-out may be the run's own metrics.json: counted once
            if name != "metrics.json" or not metrics_out or (out_dir / name).resolve() != Path(metrics_out).resolve():
                outputs[f"--out-dir's {name}"] = out_dir / name
        check_outputs_not_inputs({**outputs, "--metrics-out": metrics_out},  # last: a clash names it first
                                 {k: v for k, v in {"--text": args.text, "--tokenizer": args.tokenizer}.items()
                                  if v and Path(v).exists()})
        if metrics_out:
            check_output(metrics_out, "--metrics-out", args.force, own_run=out_dir)
        if open_run(out_dir, "gpt_train.py", stack):
            ckpt, skipped = latest_checkpoint(out_dir)
            for name, why in skipped:
                print(f"warning: skipping checkpoint {name}: {why}", file=sys.stderr)
            if ckpt is None:
                set_aside_earlier_attempt(out_dir, "no checkpoint to resume from")
    if accelerator.num_processes > 1:  # the main process's choice (its clock named the default folder)
        ckpt, out_dir = broadcast_object_list([ckpt, out_dir])
    return out_dir, ckpt
