"""training/rundir.py and data/files.py: what the scripts share about run folders, outputs and flags."""
import argparse
import contextlib
import errno
import json
import os
import subprocess
import tempfile
import threading

import pytest

from conftest import REPO
from data import files
from training import errors, flags, rundir


def test_concurrent_writers_of_one_json_file_never_fail_or_leave_half_a_file(tmp_path):
    """Every process of a multi-GPU job may write the same small file at once (the micro-batch memory)."""
    path, errors = tmp_path / "shared.json", []

    def writer(n):
        try:
            for i in range(200):
                files.write_json(path, {"writer": n, "i": i, "pad": "x" * 4096})
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert json.loads(path.read_text())["i"] == 199 and [p.name for p in tmp_path.iterdir()] == ["shared.json"]


# ------------------------------------------------------------------ outputs never inputs

@pytest.fixture
def an_input(tmp_path):
    path = tmp_path / "in" / "tok.json"
    path.parent.mkdir()
    path.write_text("the input")
    return path


@pytest.mark.parametrize("spell", [
    lambda p: p,                                                   # the same path
    lambda p: p.parent / ".." / "in" / "tok.json",                 # another spelling
    lambda p: (p.parent.parent / "link.json").symlink_to(p) or p.parent.parent / "link.json",  # a symlink to it
    lambda p: os.link(p, p.parent.parent / "hard.json") or p.parent.parent / "hard.json",     # a hard link
])
def test_an_output_that_is_an_input_is_refused(an_input, spell):
    with pytest.raises(errors.OutputError, match=r"^--metrics-out .* would overwrite --tokenizer .* \(an input\)"):
        rundir.check_outputs_not_inputs({"--metrics-out": spell(an_input)}, {"--tokenizer": an_input, "--x": None})


def test_outputs_inside_an_input_folder_and_two_equal_outputs(an_input, tmp_path):
    folder = {"--tokenizer": an_input.parent}
    with pytest.raises(errors.OutputError, match="would overwrite --tokenizer"):
        rundir.check_outputs_not_inputs({"--out": an_input}, folder)  # a file of the input folder
    rundir.check_outputs_not_inputs({"--out": an_input.parent / "new.json"}, folder)  # a new file there: fine
    with pytest.raises(errors.OutputError, match=r"would overwrite --out .* \(an output too\)"):
        rundir.check_outputs_not_inputs({"--out": tmp_path / "a.json", "--metrics-out": tmp_path / "a.json"}, {})
    rundir.check_outputs_not_inputs({"--out": tmp_path / "a.json", "--metrics-out": tmp_path / "b.json"}, folder)
    assert an_input.read_text() == "the input"


# ------------------------------------------------------------------ write_json on a full disk, planted symlinks

def mount_small_tmpfs(where):
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                              capture_output=True).returncode == 0
    except FileNotFoundError:  # no mount command
        return False


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A folder on a 64 KiB tmpfs filled to the last byte; where mount is not permitted, writes there
    fail with ENOSPC by a patched os.fdopen."""
    where = tmp_path / "full"
    where.mkdir()
    if not mount_small_tmpfs(where):
        def no_space(fd, *a, **k):
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(os, "fdopen", no_space)
        yield where
        return
    try:
        with pytest.raises(OSError, match="No space"), open(where / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"x" * 4096)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_write_json_on_a_full_disk_is_one_line_and_leaves_no_temporary_file(full_disk):
    target = full_disk / "metrics.json"
    with pytest.raises(errors.OutputError) as error:
        files.write_json(target, {"loss": 1.0, "pad": "x" * 10_000})
    assert str(error.value) == f"cannot write {target}: No space left on device"
    assert not [p.name for p in full_disk.iterdir() if p.name != "filler"]


def test_write_json_never_follows_a_symlink_planted_at_its_temporary_name(tmp_path, monkeypatch):
    """The temporary file is tempfile.mkstemp's (O_EXCL | O_NOFOLLOW): a link planted at the name it draws is
    never opened; it draws another name."""
    victim, target = tmp_path / "victim.txt", tmp_path / "m.json"
    victim.write_text("precious")
    planted = tmp_path / ".tmp-planted.part"
    planted.symlink_to(victim)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["planted", "planted", "fresh"]))
    files.write_json(target, {"ok": True})
    assert victim.read_text() == "precious" and json.loads(target.read_text()) == {"ok": True}
    assert not target.is_symlink() and planted.is_symlink() and not (tmp_path / ".tmp-fresh.part").exists()


# ------------------------------------------------------------------ run directories

def test_a_run_folder_is_new_empty_or_the_programs_own(tmp_path):
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    lenet = tmp_path / "lenet"
    lenet.mkdir()
    (lenet / rundir.OWNER_FILE).write_text("lenet5.py\n")
    (lenet / "args.json").write_text("{}")
    leftover = tmp_path / "leftover"  # what an older failed start left: only the lock
    leftover.mkdir()
    (leftover / "run.lock").write_text("123")
    assert rundir.run_dir_problem(tmp_path / "new", "gpt_train.py") is None
    assert rundir.run_dir_problem(leftover, "gpt_train.py") is None
    assert "files that are not a run of gpt_train.py" in rundir.run_dir_problem(stranger, "gpt_train.py")
    assert "holds a run of lenet5.py" in rundir.run_dir_problem(lenet, "gpt_train.py")
    assert "not a run of gpt_train.py" in rundir.run_dir_problem(REPO, "gpt_train.py")  # the repository root
    assert rundir.run_dir_problem(lenet, "lenet5.py") is None  # its own, to resume
    assert "never overwritten" in rundir.run_dir_problem(lenet, "lenet5.py", reuse=False)
    before = sorted(p.name for p in stranger.iterdir())
    with contextlib.ExitStack() as stack, pytest.raises(errors.OutputError, match="not empty"):
        rundir.claim_run_dir(stranger, "gpt_train.py", stack)
    assert sorted(p.name for p in stranger.iterdir()) == before  # nothing written


def test_a_failed_start_leaves_no_run_folder_and_a_used_one_stays(tmp_path):
    with pytest.raises(RuntimeError), contextlib.ExitStack() as stack:
        rundir.claim_run_dir(tmp_path / "failed", "gpt_train.py", stack)
        assert (tmp_path / "failed" / rundir.OWNER_FILE).read_text() == "gpt_train.py\n"
        raise RuntimeError("the start failed")
    assert not (tmp_path / "failed").exists()
    (tmp_path / "empty").mkdir()  # given empty: it stays, empty
    with contextlib.ExitStack() as stack:
        rundir.claim_run_dir(tmp_path / "empty", "gpt_train.py", stack)
    assert list((tmp_path / "empty").iterdir()) == []
    with contextlib.ExitStack() as stack:
        rundir.claim_run_dir(tmp_path / "used", "gpt_train.py", stack)
        (tmp_path / "used" / "metrics.json").write_text("{}")
    assert {p.name for p in (tmp_path / "used").iterdir()} == {"metrics.json", rundir.OWNER_FILE, "run.lock"}


def test_a_run_folder_locked_by_another_run_keeps_its_lock(tmp_path):
    with rundir.RunLock(tmp_path / "run"), contextlib.ExitStack() as stack:
        with pytest.raises(errors.OutputError, match="in use by another run"):
            rundir.claim_run_dir(tmp_path / "run", "gpt_train.py", stack)
        assert (tmp_path / "run" / "run.lock").read_text() == str(os.getpid())


def test_an_empty_path_flag_and_a_seed_out_of_range_are_refused():
    for text in ("", "  "):
        with pytest.raises(argparse.ArgumentTypeError, match="empty"):
            flags.path_flag(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be in \[0, 4294967296\)"):
        flags.seed_flag(str(2**64))
    assert flags.path_flag("runs/x").name == "x" and flags.seed_flag("7") == 7


def test_default_run_names_of_one_second_differ():
    names = {rundir.new_run_name() for _ in range(20)}
    assert len(names) == 20


def test_open_run_says_whether_an_attempt_is_there_and_never_reopens_a_finished_run(tmp_path):
    run = tmp_path / "run"
    with contextlib.ExitStack() as stack:
        assert rundir.open_run(run, "lenet5.py", stack) is False  # new
        (run / "args.json").write_text("{}")
    with contextlib.ExitStack() as stack:
        assert rundir.open_run(run, "lenet5.py", stack) is True  # an unfinished attempt: resume or set aside
        (run / "metrics.json").write_text("{}")
    with contextlib.ExitStack() as stack, pytest.raises(errors.OutputError, match="holds a finished run of lenet5"):
        rundir.open_run(run, "lenet5.py", stack)
    assert sorted(p.name for p in run.iterdir()) == ["args.json", "metrics.json", "run.lock", "run.owner"]
