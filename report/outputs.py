"""make_report's outputs, --out (a folder) and --pdf-out (a file): checked before any work, each written under a
short temporary name beside it and renamed into place once whole (a Ctrl-C or a failure leaves the old one)."""
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from data import files
from data.files import UserError

MIN_FREE = 64 << 20  # bytes: the figures and screenshots of a report take ~10 MB, a PDF ~5 MB
# in --out: the files a build wrote (any other file there is someone else's) and, as ./<path from --out>, the PDFs
# it printed (a line with a slash is never a file's name)
BUILT = ".built-by-make_report"
TMP = ".make_report-"  # the temporaries' prefix: short, whatever the output's name


def out_dir(args):
    """--out; a link to the student's folder: built where it points, the link left as it is."""
    return args.out.resolve() if args.out.is_symlink() else args.out


def built_lines(out):
    """`out`'s BUILT: the files its last build wrote and the PDFs its builds printed."""
    marker = out / BUILT
    return marker.read_text().splitlines() if marker.is_file() and not marker.is_symlink() else []


def printed(args):
    """--pdf-out as BUILT names it: its path from --out after ./ (a line with a slash: never a file's name)."""
    return "./" + os.path.relpath(os.path.realpath(args.pdf_out), os.path.realpath(out_dir(args)))


def writable(path, flag):
    """Its nearest existing folder is a writable folder on a disk with room, said in one line before any work."""
    parent = next(p for p in path.resolve().parents if p.exists())
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK) or os.statvfs(parent).f_flag & os.ST_RDONLY:
        raise UserError(f"{flag} {path}: {parent} is read-only")
    if (free := shutil.disk_usage(parent).free) < MIN_FREE:
        raise UserError(f"{flag} {path}: {free >> 20} MiB free on {parent}'s disk, under the {MIN_FREE >> 20} MiB "
                        "a report needs")


@contextlib.contextmanager
def building(out, keep):
    """A fresh folder beside `out` with `keep` copied from the old one, renamed into place once built; a file of
    the old --out no build wrote (a student's) is moved in, and moved back if the build stops before the rename."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP, dir=out.parent))
    tmp.chmod(0o777 & ~files.UMASK)  # mkdtemp's 0700 would become --out's: as mkdir makes it
    old, moved = None, []
    try:
        for name in keep:
            if (out / name).is_file():
                shutil.copy2(out / name, tmp / name)
        yield tmp
        built = built_lines(out)
        (tmp / BUILT).write_text("".join(f"{p.name}\n" for p in sorted(tmp.iterdir()))
                                 + "".join(f"{line}\n" for line in built if "/" in line))  # the PDFs printed
        for path in sorted(out.iterdir()) if out.is_dir() else []:
            if path.name not in built and not (tmp / path.name).exists():
                path.rename(tmp / path.name)  # someone else's: kept
                moved.append(path.name)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{TMP}old-", dir=out.parent))
            out.rename(old)  # onto the empty folder mkdtemp made
        tmp.rename(out)
    finally:
        if old and not out.exists():  # stopped between the two renames: the old --out back in place
            old.rename(out)
        for name in moved if tmp.exists() else []:  # not renamed into place: someone else's files go back
            (tmp / name).rename(out / name)
        for folder in (old, tmp):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
