"""The lowest floor: what data/ and training/ share about files. Every write is atomic (write_atomic: a
tempfile.mkstemp file beside the target, then os.replace), every JSON file strict, every folder written checked for
who else may write it (check_folder: a token cache, a run folder, a compile cache). Run folders: training/rundir.py."""
import contextlib
import grp
import hashlib
import json
import math
import os
import pwd
import stat
import tempfile
from pathlib import Path

from training.errors import OutputError, reason

NAME_MAX = 255  # bytes in one file name on every file system this runs on (ext4, xfs, NFS, Lustre)
UMASK = os.umask(0o022)  # read at import (setting it is the only way to read it) and put back at once
os.umask(UMASK)
MANIFEST = "manifest.json"


def strict(obj):
    """obj with every non-finite float replaced by None, so json.dumps(allow_nan=False) accepts it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    return [strict(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


def write_json(path, obj):
    write_atomic(path, (json.dumps(strict(obj), indent=2, allow_nan=False, default=str) + "\n").encode("utf-8"))


def write_atomic(path, data):
    """`data` (bytes, or a function writing a binary file) renamed over `path` (a link there is replaced): one
    OutputError on failure, the old file as it was."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")  # a short name: never too long
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(OSError):  # a file system without modes (CIFS) keeps its own
                os.fchmod(fd, 0o666 & ~UMASK)  # as open() would make it, not mkstemp's owner-only 0600
            data(f) if callable(data) else f.write(data)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save's writer reports a full disk as a RuntimeError
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {reason(e)}") from None


def read_small(path, limit, follow=False):
    """A small file of the project's own, opened no-follow (unless `follow`) and non-blocking: a planted link,
    FIFO, device or file over `limit` bytes is an OSError or ValueError, never read whole."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a plain file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} holds over {limit:,} bytes")
    return data


def path_problem(path):
    """None if `path` can be used (it exists, or does not yet), else why not: a name over NAME_MAX (a missing
    folder above it hides that until the write), a looping or dangling link, any OSError but "not found"."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"a name of {len(os.fsencode(part))} bytes ({part[:16]}...); a file name has at most {NAME_MAX}"
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # not there (yet), or a file where a folder should be
        if os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
    except (OSError, ValueError) as e:  # too long a path, a loop of links, no permission, a NUL byte
        return reason(e)
    return None


def check_folder(path, what):
    """Make folder `path` and write a file there, after refusing it in one OutputError if files there could be
    anyone's: the folder (links resolved) another user's or writable by others, or a folder above it that another
    user owns, or that others may write without the sticky bit (they could swap it), up to the first of the user's.
    Folders made here are made without write for group and others, whatever the umask."""
    refuse_shared(path, what)
    make_folder(path, what)


def refuse_shared(path, what):
    """check_folder's refusal without making anything (make_report's --out, made only once a build writes)."""
    if problem := path_problem(path):
        raise OutputError(f"{what} {path}: {problem}")
    if problem := writers_problem(path):
        raise OutputError(f"{what} {path} {problem}: files there could be anyone's; give a folder of your own")


def make_folder(path, what):
    """`path` made (without write for group and others) and a file written there: a read-only folder is one
    OutputError before any work."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():  # mkdir would say "File exists"
        raise OutputError(f"{what} {path} cannot be written ({folder} is a file, not a folder)")
    try:
        for missing in reversed([f for f in (folder, *folder.parents) if not f.exists()]):
            missing.mkdir(mode=0o755, exist_ok=True)  # the umask can only take bits away: never group/other write
        tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-").close()  # made, then removed
    except OSError as e:
        raise OutputError(f"{what} {path} cannot be written ({reason(e)})") from None


def writers_problem(path):
    """Why another user may write into `path` (see check_folder; a file: its folder's as a folder above it), or
    None."""
    real = Path(os.path.realpath(path))
    for folder in filter(os.path.exists, (real, *real.parents)):  # one not made yet: made by check_folder
        info = os.stat(folder)
        why = shared_problem(folder, info)
        if folder == real and (why or info.st_uid != os.geteuid()):
            return why or "is another user's"
        if info.st_uid not in (0, os.geteuid()) and info.st_mode & stat.S_IWUSR:
            return f"is inside {folder}, another user's"
        if why and not info.st_mode & stat.S_ISVTX:  # without the sticky bit others may rename what is inside
            return f"is inside {folder}, which {why}"
        if info.st_uid == os.geteuid() and folder != real:  # the first parent of the user's: what is inside stays
            return None
    return None


def shared_problem(folder, info):
    """'is writable by others (mode ...)' if others, or a group not the owner's private one, may write `folder` (umask
    002's own group is fine); with an ACL the group bits are its mask: anyone it names may write."""
    acl = False
    with contextlib.suppress(OSError):  # a file system without extended attributes has no ACL
        acl = "system.posix_acl_access" in os.listxattr(folder)
    if os.statvfs(folder).f_flag & os.ST_RDONLY:  # a read-only mount: no one writes there, whatever its mode
        return None
    if info.st_mode & stat.S_IWOTH or info.st_mode & stat.S_IWGRP and (acl or not own_group(info)):
        return f"is writable by others (mode {info.st_mode & 0o7777:o}: {'setfacl -b, ' * acl}chmod go-w)"
    return None


def own_group(info):
    """Whether a file's group is its owner's private group: named as the owner, no other member (listed, or by
    its primary group)."""
    with contextlib.suppress(KeyError):
        owner, group = pwd.getpwuid(info.st_uid).pw_name, grp.getgrgid(info.st_gid)
        others = {u.pw_name for u in pwd.getpwall() if u.pw_gid == group.gr_gid} | set(group.gr_mem)
        return group.gr_name == owner and others <= {owner}
    return False


def sha256_file(path, chunk=1 << 22):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder, paths, **extra):
    """folder/MANIFEST, written after the files: each one's size and sha256, and `extra` (stats)."""
    write_json(Path(folder) / MANIFEST, {**extra, **{p.name: {"bytes": os.path.getsize(p), "sha256": sha256_file(p)}
                                                     for p in map(Path, paths)}})


def manifest_problem(folder, names=None):
    """None if the files `names` (default: all) are as MANIFEST records them (size, then sha256), else why not."""
    try:
        manifest = json.loads(read_small(Path(folder) / MANIFEST, 1 << 20))
        names = names or [n for n, entry in manifest.items() if "sha256" in entry]
    except (OSError, ValueError, TypeError, AttributeError):  # missing, a planted link or device, not a dict
        return f"{MANIFEST} is missing or unreadable"
    for name in names:
        path, expected = Path(folder) / name, manifest.get(name) or {}
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected.get("bytes"):  # a truncated checkpoint named without hashing its GBs
            return f"{name} has {path.stat().st_size} bytes, the manifest says {expected.get('bytes')}"
        if sha256_file(path) != expected.get("sha256"):
            return f"{name} does not match its manifest"
    return None
