"""Folders whose files a run trusts, on a login node shared with other users: a --cache-dir (the token cache is
trained on), an --out-dir (its metrics.json is the run's record) or a --compile-cache (its kernels run) that another
user owns or may write, or that lies inside a folder they may swap, is refused in one line (data/files.check_folder,
also training/rundir.check_folder), never read; a folder made here is made without write for others. A second user
is made with useradd where the tests run as root; those cases skip elsewhere."""
import contextlib
import grp
import json
import os
import pwd
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from data import blocks, files, wos
from data.tokenizer import open_tokenizer
from training import errors, rundir
from training.errors import OutputError

OTHER = "lab5-other"


@pytest.fixture(scope="module")
def other_user():
    """A second, unprivileged user (pwd entry), made with useradd once; a skip where this is not root."""
    if os.geteuid() != 0:
        pytest.skip("a second user is made with useradd, as root")
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(OTHER)
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], capture_output=True,
                          text=True)
    if made.returncode:
        pytest.skip(f"useradd {OTHER} failed: {made.stderr.strip()}")
    return pwd.getpwnam(OTHER)


def cache_blocks(corpus, cache):
    tok = open_tokenizer(corpus / "tok.json").tokenizer
    return blocks.token_blocks(wos.read_corpus(corpus / "X.txt"), tok, blocks.Packing(33, 0.05, 0, cache))


def poison(cache):
    """What another user can do to a cache they can write: every block one token, the manifest made again."""
    folder = next(cache.glob("corpus-*/packed-v*"))
    stats = json.loads((folder / "manifest.json").read_text())["stats"]
    for name in ("train", "validation"):
        np.save(folder / f"{name}.npy", np.full_like(np.load(folder / f"{name}.npy"), 7))
    files.write_manifest(folder, [folder / "train.npy", folder / "validation.npy"], stats=stats)


def chown_tree(root, uid, gid):
    for folder, subfolders, names in os.walk(root):
        for path in [folder] + [os.path.join(folder, n) for n in subfolders + names]:
            os.chown(path, uid, gid)


def test_a_token_cache_another_user_can_write_is_refused_not_trained_on(corpus, tmp_path):
    """A 0777 cache (a shared folder, or umask 000): anyone could have packed the blocks and their manifest."""
    cache = tmp_path / "cache"
    cache_blocks(corpus, cache)
    poison(cache)
    cache.chmod(0o777)
    with pytest.raises(OutputError) as refused:
        cache_blocks(corpus, cache)
    corpus_dir = next(cache.glob("corpus-*"))
    assert str(refused.value) == (f"--cache-dir {corpus_dir} is inside {cache}, which is writable by others (mode 777: "
                                  f"chmod go-w): files there could be anyone's; give a folder of your own")
    cache.chmod(0o755)
    next(cache.glob("corpus-*")).chmod(0o1777)  # the sticky bit stops no one from adding files
    with pytest.raises(OutputError, match="is writable by others .mode 1777"):
        cache_blocks(corpus, cache)


def test_a_token_cache_owned_by_another_user_is_refused(corpus, tmp_path, other_user):
    """Their cache, manifest recomputed: it trained the victim on one repeated token before."""
    cache = tmp_path / "cache"
    cache_blocks(corpus, cache)
    poison(cache)
    chown_tree(cache, other_user.pw_uid, other_user.pw_gid)
    with pytest.raises(OutputError) as refused:
        cache_blocks(corpus, cache)
    assert str(refused.value) == (f"--cache-dir {next(cache.glob('corpus-*'))} is another user's: files there could "
                                  f"be anyone's; give a folder of your own")


def test_an_out_dir_another_user_owns_or_can_write_is_refused_and_a_private_one_used(tmp_path, other_user):
    made = tmp_path / "premade"
    made.mkdir(mode=0o777)
    made.chmod(0o777)
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o775)  # umask 002: writable by the owner's private group only (root's: named root, no member)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, -1, other_user.pw_gid)  # a group of another user's
    shared.chmod(0o775)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    assert grp.getgrgid(os.stat(mine).st_gid).gr_name == pwd.getpwuid(os.geteuid()).pw_name
    for folder, why in ((made, "is writable by others (mode 777"), (shared, "is writable by others (mode 775"),
                        (theirs, "is another user's")):
        with contextlib.ExitStack() as stack, pytest.raises(OutputError) as refused:
            rundir.open_run(folder, "gpt_train.py", stack)
        assert str(refused.value).startswith(f"--out-dir {folder} {why}") and "\n" not in str(refused.value)
        assert sorted(p.name for p in folder.iterdir()) == []  # nothing written there
    with contextlib.ExitStack() as stack:
        assert rundir.open_run(mine, "gpt_train.py", stack) is False


def test_the_check_from_an_unprivileged_users_side(other_user):
    """The second user runs the check (os.setuid in a child): root's folder is another user's to them, their own
    folder is theirs, a 0777 one of theirs is refused. Root ignores file modes; an ordinary user is who is attacked."""
    root = Path(tempfile.mkdtemp(prefix="lab5-private-"))
    try:
        root.chmod(0o755)
        ours, own, open_ = root / "roots", root / "own", root / "open"
        for folder, mode in ((ours, 0o755), (own, 0o755), (open_, 0o777)):
            folder.mkdir()
            folder.chmod(mode)
        for folder in (own, open_):
            os.chown(folder, other_user.pw_uid, other_user.pw_gid)
        for package in ("data", "training"):  # a copy they can read, wherever the checkout lies
            (root / "pkg" / package).mkdir(parents=True)
            for module in (REPO / package).glob("*.py"):
                shutil.copy(module, root / "pkg" / package)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from data import files\n"
                "for folder in sys.argv[2:]:\n"
                "    try:\n        files.check_folder(folder, '--out-dir'); print('used')\n"
                "    except files.OutputError as e:\n        print(e)")
        for python in (sys.executable, "/usr/bin/python3"):  # a Python of root's own (pyenv) may be closed to them
            with contextlib.suppress(PermissionError, FileNotFoundError):
                done = subprocess.run([python, "-c", code, str(root / "pkg"), str(ours), str(own), str(open_)],
                                      user=other_user.pw_uid, group=other_user.pw_gid, extra_groups=[],
                                      capture_output=True, text=True, timeout=60, cwd="/")
                break
        else:
            pytest.skip("no Python the second user may run")
        assert done.stdout.splitlines() == [
            f"--out-dir {ours} is another user's: files there could be anyone's; give a folder of your own", "used",
            f"--out-dir {open_} is writable by others (mode 777: chmod go-w): files there could be anyone's; give a "
            f"folder of your own"], done.stderr
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=True)


def test_a_folder_an_acl_opens_to_another_user_is_refused(other_user, tmp_path):
    """The group bits of a folder with an ACL are its mask: `user:<other>:rwx` shows as a 775 of the owner's own
    group, yet the other user may write there."""
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o755)
    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x02, 7, other_user.pw_uid), (0x04, 5, undefined), (0x10, 7, undefined),
               (0x20, 5, undefined)]  # user::rwx user:other:rwx group::r-x mask::rwx other::r-x
    try:
        os.setxattr(folder, "system.posix_acl_access",
                    struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries))
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on this file system ({e.strerror})")
    with pytest.raises(OutputError, match=r"is writable by others \(mode 775: setfacl -b, chmod go-w\)"):
        files.check_folder(folder, "--cache-dir")


def test_a_group_that_is_another_users_primary_one_is_not_private(other_user, tmp_path):
    """A group named as its owner is private only if no one else is in it: a user whose primary group it is
    (not listed among its members) may write a 775 folder of that group."""
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o775)
    os.chown(folder, other_user.pw_uid, other_user.pw_gid)
    assert files.own_group(os.stat(folder))
    member = "lab5-member"
    made = subprocess.run(["useradd", "--no-create-home", "--no-user-group", "--gid", str(other_user.pw_gid),
                           "--shell", "/usr/sbin/nologin", member], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"useradd {member} failed: {made.stderr.strip()}")
    try:
        assert not files.own_group(os.stat(folder))
    finally:
        subprocess.run(["userdel", member], check=True)


def test_a_folder_inside_one_another_user_may_swap_is_refused(other_user, tmp_path):
    """Their folder (they may rename what is inside), or a folder of anyone's that others may write without the
    sticky bit: the run folder under it could be replaced. /tmp's sticky bit is fine; so is a root-owned /home."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    for parent, why in ((theirs, "another user's"), (open_, "which is writable by others (mode 777: chmod go-w)")):
        with pytest.raises(OutputError) as refused:
            files.check_folder(parent / "runs" / "gpt", "--out-dir")
        assert str(refused.value).startswith(f"--out-dir {parent / 'runs' / 'gpt'} is inside {parent}, {why}: ")
        assert list(parent.iterdir()) == []  # nothing made there
    files.check_folder(sticky / "runs", "--out-dir")
    assert stat.S_IMODE((sticky / "runs").stat().st_mode) & 0o022 == 0


def test_a_runs_link_into_another_users_folder_is_refused(other_user, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "runs").symlink_to(theirs)
    with contextlib.ExitStack() as stack, pytest.raises(OutputError, match=f"is inside {theirs}, another user's"):
        rundir.open_run(tmp_path / "repo" / "runs" / "gpt" / "x", "gpt_train.py", stack)
    assert list(theirs.iterdir()) == []


def test_a_run_folder_is_made_without_write_for_others_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        with contextlib.ExitStack() as stack:
            rundir.open_run(tmp_path / "runs" / "gpt" / "x", "gpt_train.py", stack)
            modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "runs", tmp_path / "runs" / "gpt",
                                                                 tmp_path / "runs" / "gpt" / "x")}
    finally:
        os.umask(previous)
    assert modes == dict.fromkeys(modes, 0o755)


def test_a_compile_cache_others_may_write_is_refused_in_one_line(tmp_path, monkeypatch):
    from training import device
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(errors.UserError) as refused:
        device.use_compile_cache(cache)
    assert str(refused.value) == (f"--compile-cache {cache / 'inductor'} is inside {cache}, which is writable by "
                                  f"others (mode 777: chmod go-w): files there could be anyone's; give a folder of "
                                  f"your own; or --compile off")
    assert list(cache.iterdir()) == []


@pytest.mark.slow
def test_no_compile_cache_lands_in_a_tmp_folder_another_user_made_first(tmp_path):
    """torch keeps precompiled headers in $TMPDIR/torchinductor_$USER whatever TORCHINDUCTOR_CACHE_DIR says: a
    folder of that name planted first (0777) stays empty; headers, kernels and Triton's files go to the cache."""
    tmp = tmp_path / "tmp"
    planted = tmp / f"torchinductor_{pwd.getpwuid(os.geteuid()).pw_name}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); from training import device\n"
            "device.use_compile_cache(sys.argv[2])\n"
            "print(torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1)(torch.ones(64)).sum().item())")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    done = subprocess.run([sys.executable, "-c", code, str(REPO), str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=600, env={**env, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(planted.rglob("*")) == []
    assert any((tmp_path / "cache" / "inductor").rglob("*"))


def test_an_output_file_in_a_folder_others_may_write_is_refused_in_a_sticky_one_written(tmp_path):
    """Without the sticky bit anyone may replace a finished metrics file; with it (/tmp) only its owner."""
    open_, sticky = tmp_path / "open", tmp_path / "sticky"
    for folder, mode in ((open_, 0o777), (sticky, 0o1777)):
        folder.mkdir()
        folder.chmod(mode)
    with pytest.raises(OutputError, match=f"^--metrics-out {open_ / 'm.json'} is inside {open_}, which is writable"):
        rundir.check_output(open_ / "m.json", "--metrics-out")
    rundir.check_output(sticky / "m.json", "--metrics-out")
