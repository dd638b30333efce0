"""make_report.py against inputs and places that used to end in a traceback or a wrong mode: numbers beyond a
float, JSON nested too deep, a PDF given as --report, --out under a file, on a
read-only or full disk, and --out's mode. Each ends in one line, and what was there before is left as it was."""
import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from report import gpu, make_report


def lenet_metrics(**extra):
    return {"act": "torch", "test_accuracy": 0.99, "test_loss": 0.05, "epochs": 2, "train_seconds": 1.5,
            "device": "cpu", "params": 44426, "steps": 4, "train_loss_curve": [[1, 2.0], [4, 0.5]],
            "history": [{"epoch": 2, "test_loss": 0.05, "test_accuracy": 0.99}]} | extra


@pytest.fixture
def inputs(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "lenet_run_2x128_cpu.json").write_text(json.dumps(lenet_metrics()))
    report = tmp_path / "report.md"
    report.write_text("# R\n\nAccuracy {{ lenet.test_accuracy|f('.2%') }}.\n")
    return results, report


def snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def build(results, report, out, *extra):
    return make_report.main(["--results", str(results), "--report", str(report), "--out", str(out),
                             "--no-screenshots", *extra])


def one_error(argv):
    """main(argv)'s exit: the message sys.exit prints on stderr (status 1), which must be one line."""
    with pytest.raises(SystemExit) as exit_:
        make_report.main(argv)
    message = str(exit_.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


# --------------------------------------------------------------------- JSON Python cannot hold

HUGE = "1" + "0" * 400  # an int json.loads takes, that .1f cannot format (OverflowError)
DEEP = "[" * 5000 + "]" * 5000  # RecursionError in the parser (or in any walk of it)


@pytest.mark.parametrize("text, why", [
    (json.dumps(lenet_metrics(train_seconds=0)).replace('"train_seconds": 0', f'"train_seconds": {HUGE}'),
     "(401 digits) is not a number a table can print"),
    (json.dumps(lenet_metrics(history=[])).replace('"history": []', f'"history": {DEEP}'), "nested too deep to read")],
    ids=["huge-int", "deep"])
def test_a_results_file_or_a_runs_metrics_python_cannot_hold_is_one_line(tmp_path, inputs, capsys, text, why):
    results, report = inputs
    (results / "lenet_run_x_cpu.json").write_text(text)
    run = tmp_path / "runs" / "lenet5" / "mine"
    run.mkdir(parents=True)
    (run / "args.json").write_text("{}")
    (run / "metrics.json").write_text(text)
    before = snapshot(tmp_path)
    build(results, report, tmp_path / "out", str(run))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if why in line]
    assert len(lines) == 2, err  # the results file and the named run, each once
    assert any(f"unreadable {results / 'lenet_run_x_cpu.json'}: " in line for line in lines)
    assert any(f"left out {run}: unreadable metrics.json" in line for line in lines)
    assert {p: b for p, b in snapshot(tmp_path).items() if p in before} == before  # the inputs untouched


def test_a_gpu_folders_results_json_nested_too_deep_is_one_line(tmp_path, inputs, capsys):
    results, report = inputs
    folder = results / "gpu-new"
    folder.mkdir()
    (folder / "results.json").write_text('{"started_utc": "2026-12-02T06:59:00Z", "results": {"a": ' + DEEP + "}}")
    build(results, report, tmp_path / "out")
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "nested too deep" in line] == [
        f"warning: GPU results folder {folder}: results.json is not gpu_check.sh's (ValueError: nested too deep to "
        "read); its figures are left out"]


# --------------------------------------------------------------------- --report, --out and its mode

def test_a_pdf_given_as_report_is_one_line_and_nothing_is_written(tmp_path, inputs):
    results, report = inputs
    out = tmp_path / "out"
    build(results, report, out)
    before = snapshot(tmp_path)
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4\n\xe2\x80\xff\xfe binary")
    message = one_error(["--results", str(results), "--report", str(pdf), "--out", str(out)])
    assert message == f"error: --report {pdf} is not UTF-8 text (a PDF?); give the Markdown it is built from, " \
                      "e.g. report/report.md"
    assert {p: b for p, b in snapshot(tmp_path).items() if p != pdf} == before


def test_out_under_a_file_is_one_line_and_nothing_is_written(tmp_path, inputs):
    results, report = inputs
    (tmp_path / "notes.txt").write_text("keep")
    before = snapshot(tmp_path)
    target = tmp_path / "notes.txt" / "sub" / "x"
    common = ["--results", str(results), "--report", str(report)]
    for flag, argv in (("--out", ["--out", str(target)]), ("--pdf-out", ["--out", str(tmp_path / "o"), "--pdf",
                                                                          "--pdf-out", str(target)])):
        message = one_error(common + argv)
        assert message == f"error: {flag} {target.parent} cannot be written (Not a directory)"
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs of `size` mounted on tmp_path/disk (root only: where mounting is refused, skip)."""
    mounted = []

    def mount(options):
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
        mounted.append(where)
        return where
    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_out_on_a_read_only_disk_is_one_line(inputs, small_disk):
    results, report = inputs
    disk = small_disk("ro,size=1m")
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(disk / "gen")])
    assert message == f"error: --out {disk} cannot be written (Read-only file system)"


def test_a_disk_filling_during_the_build_leaves_the_old_out(inputs, small_disk):
    results, report = inputs
    disk = small_disk("size=1m")  # the disk fills while the figures are drawn
    run = results.parent / "gpt-run"  # a GPT run whose curves the report links
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({
        "tokens_seen": 4096, "steps": 4, "final_train_loss": 5.0, "final_val_loss": 5.1, "val_bits_per_byte": 2.0,
        "success": True, "train_seconds": 1.0, "tokens_per_second": 4096.0, "mfu": None, "precision": "fp32",
        "world_size": 1, "device_name": "cpu", "params": 1000, "vocab_size": 512, "text": "X.txt",
        "tokenizer": "tok.json", "loss_curve": [[1, 9.0], [4, 5.0]]}))
    report.write_text("# R\n\n![c](generated/gpt_curves.png)\n")
    build(results, report, disk / "gen", str(run))  # a first build fits: results.md and a figure
    before = snapshot(disk)
    assert (disk / "gen" / "gpt_curves.png").is_file()
    (disk / "ballast").write_bytes(b"\0" * (1024 * 1024 - sum(map(len, before.values())) - 16 * 1024))
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(disk / "gen"),
                         "--no-screenshots", str(run)])
    assert message.startswith("error: No space left on device: ") and message.endswith(
        f"--out {disk / 'gen'} was left as it was")
    (disk / "ballast").unlink()
    assert snapshot(disk) == before


def test_out_is_made_as_mkdir_would_make_it_under_the_umask(tmp_path, inputs):
    results, report = inputs
    old = os.umask(0o022)
    try:
        build(results, report, tmp_path / "shared-out")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared-out").stat().st_mode) == 0o755  # not mkdtemp's 0700
    assert stat.S_IMODE((tmp_path / "shared-out" / "results.md").stat().st_mode) == 0o644


# --------------------------------------------------------------------- what it reads, never written over

def test_pdf_out_onto_the_report_it_reads_is_refused(inputs, tmp_path):
    results, report = inputs
    before = report.read_bytes()
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(tmp_path / "out"),
                         "--no-screenshots", "--pdf", "--pdf-out", str(report)])
    assert "--pdf-out" in message and "the report never writes its inputs" in message
    assert report.read_bytes() == before and not (tmp_path / "out").exists()


def test_pdf_out_replaces_a_pdf_only(inputs, tmp_path):
    results, report = inputs
    notes = tmp_path / "notes.md"
    notes.write_text("my notes")
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(tmp_path / "out"),
                         "--no-screenshots", "--pdf", "--pdf-out", str(notes)])
    assert message.startswith(f"error: --pdf-out {notes} exists and is not a PDF, not a file this program writes")
    assert notes.read_text() == "my notes"


def test_a_rebuild_keeps_the_files_a_student_put_in_out(inputs, tmp_path):
    """README step 7: screenshots taken by hand go beside the report's figures; a rebuild keeps them."""
    results, report = inputs
    out = tmp_path / "out"
    build(results, report, out)
    (out / "my-tensorboard.png").write_bytes(b"\x89PNG by hand")
    (out / "notes").mkdir()
    (out / "notes" / "todo.txt").write_text("caption fig. 3")
    build(results, report, out)
    assert (out / "my-tensorboard.png").read_bytes() == b"\x89PNG by hand"
    assert (out / "notes" / "todo.txt").read_text() == "caption fig. 3" and (out / "results.md").is_file()


def test_an_out_that_is_a_link_is_built_where_it_points_the_link_kept(inputs, tmp_path):
    """runs/myreport a link to the student's own folder: the report goes there, with their notes; the link
    stays a link (it was replaced by a real folder, the notes left behind in the target)."""
    results, report = inputs
    target, link = tmp_path / "mine", tmp_path / "myreport"
    build(results, report, target)
    (target / "notes.md").write_text("mine")
    link.symlink_to(target)
    build(results, report, link)
    assert link.is_symlink() and (target / "notes.md").read_text() == "mine" and (target / "results.md").is_file()
    assert not list(tmp_path.glob(".*old-*"))


@pytest.mark.parametrize("flag", ["--out", "--pdf-out"])
def test_an_output_inside_a_run_folder_not_named_is_refused(inputs, tmp_path, flag):
    """The ownership rule every --metrics-out keeps: a run's folder (run.owner) holds that run's files only."""
    results, report = inputs
    run = tmp_path / "runs" / "gpt" / "gpt-1"
    run.mkdir(parents=True)
    (run / "run.owner").write_text("gpt_train.py\n")
    target = {"--out": run / "report", "--pdf-out": run / "report.pdf"}[flag]
    out = target if flag == "--out" else tmp_path / "out"
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(out), "--no-screenshots",
                         "--pdf", "--pdf-out", str(target)])
    assert message.startswith(f"error: {flag} {target} is inside {run}") and sorted(os.listdir(run)) == ["run.owner"]


def test_out_over_a_run_it_reports_is_refused(inputs, tmp_path):
    results, report = inputs
    out = tmp_path / "out"
    run = out / "copied-run"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps(lenet_metrics()))
    (out / "results.md").write_text("an earlier build")
    before = snapshot(out)
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(out), "--no-screenshots",
                         str(run)])
    assert "--out" in message and "overlap" in message and snapshot(out) == before
    assert message.count(str(run)) == 1  # the run named once


def test_runs_named_around_the_flags_a_missing_one_and_a_fifo_for_metrics(inputs, tmp_path, capsys):
    """`make_report.py A --no-screenshots B` (flags between the runs); a run folder that does not exist is
    'no such folder'; a FIFO planted as metrics.json is left out at once, never waited on."""
    results, report = inputs
    fifo_run, missing = tmp_path / "fifo-run", tmp_path / "no-such-run"
    fifo_run.mkdir()
    os.mkfifo(fifo_run / "metrics.json")
    make_report.main([str(fifo_run), "--results", str(results), "--report", str(report), "--no-screenshots",
                      str(missing), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert f"left out {fifo_run}: unreadable metrics.json" in err and "not a plain file" in err
    assert f"left out {missing}: no such folder" in err and (tmp_path / "out" / "results.md").is_file()


# --------------------------------------------------------------------- --out and --pdf-out: whose files

def fake_chromium(folder, after=""):
    """A `chromium` that prints a small PDF where --print-to-pdf= says (then runs `after`)."""
    script = folder / "chromium"
    script.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --print-to-pdf=*) printf "%%PDF-1.4 printed" '
                      f'> "${{a#--print-to-pdf=}}";; esac; done\n{after}\n')
    script.chmod(0o755)
    return script


@pytest.fixture
def chromium(tmp_path, monkeypatch):
    script = fake_chromium(tmp_path)
    monkeypatch.setattr(make_report.browser, "find_browser", lambda: str(script))


def pdf_build(results, report, out, pdf, *extra):
    return build(results, report, out, "--pdf", "--pdf-out", str(pdf), *extra)


def test_an_existing_pdf_out_is_replaced_only_with_force_and_never_through_a_link(inputs, tmp_path, chromium):
    """The user's thesis.pdf is theirs until --force says otherwise; a link is never written
    through or replaced, --force or not. Refused before any work: no --out made."""
    results, report = inputs
    thesis, link = tmp_path / "thesis.pdf", tmp_path / "link.pdf"
    thesis.write_bytes(b"%PDF-1.7 my thesis")
    link.symlink_to(thesis)
    common = ["--results", str(results), "--report", str(report), "--out", str(tmp_path / "out"), "--no-screenshots",
              "--pdf", "--pdf-out"]
    assert one_error(common + [str(thesis)]) == \
        f"error: --pdf-out {thesis} exists; pass --force to replace it, or give a new file name"
    for extra in ([], ["--force"]):
        message = one_error(common + [str(link)] + extra)
        assert message.startswith(f"error: --pdf-out {link} exists and is a symbolic link")
    assert thesis.read_bytes() == b"%PDF-1.7 my thesis" and link.is_symlink() and not (tmp_path / "out").exists()
    pdf_build(results, report, tmp_path / "out", thesis, "--force")
    assert thesis.read_bytes() == b"%PDF-1.4 printed" and not list(tmp_path.glob(".make_report-*"))


@pytest.mark.parametrize("where", ["inside", "beside"])
def test_the_documented_rebuild_replaces_its_pdf_with_force(inputs, tmp_path, chromium, where):
    """README step 7: `--out runs/myreport --pdf --force --pdf-out runs/myreport/lab5-report-<login>.pdf`, run
    again; results/README.md's `--pdf-out runs/myreport.pdf` too: an existing PDF is replaced with --force only."""
    results, report = inputs
    out = tmp_path / "runs" / "myreport"
    pdf = out / "lab5-report-me.pdf" if where == "inside" else tmp_path / "runs" / "myreport.pdf"
    pdf_build(results, report, out, pdf)
    pdf.write_bytes(b"%PDF-1.4 the first build's")
    build(results, report, out)  # a rebuild without --pdf keeps the PDF and what it printed
    assert pdf.read_bytes() == b"%PDF-1.4 the first build's"
    assert one_error(["--results", str(results), "--report", str(report), "--out", str(out), "--pdf",
                      "--pdf-out", str(pdf)]).endswith("pass --force to replace it, or give a new file name")
    pdf_build(results, report, out, pdf, "--force")
    assert pdf.read_bytes() == b"%PDF-1.4 printed" and (out / "results.md").is_file()


def test_a_users_folder_holding_a_results_md_is_refused_as_out(inputs, tmp_path):
    """A folder make_report did not build (no .built-by-make_report) is not rebuilt over, results.md
    or not; one make_report built is (its student's files kept: test_a_rebuild_keeps_the_files_...)."""
    results, report = inputs
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.md").write_text("my own results")
    before = snapshot(tmp_path)
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(mine)])
    assert message == f"error: --out {mine} is not a folder this program wrote (no .built-by-make_report); give " \
                      "a new or empty one (nothing written)"
    assert snapshot(tmp_path) == before and not list(tmp_path.glob(".make_report-*"))


def interrupted_build(results, report, out):
    """build(), stopped by the Ctrl-C the test plants: its exit status (a KeyboardInterrupt escaping main() is a
    traceback to the user: a failure here, not the end of the test run)."""
    try:
        with pytest.raises(SystemExit) as exit_:
            build(results, report, out)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C escaped main(): a traceback, not one line")
    return exit_.value.code


def test_a_ctrl_c_while_the_figures_are_drawn_is_one_line_and_130_the_old_out_whole(inputs, tmp_path, monkeypatch,
                                                                                     capsys):
    results, report = inputs
    out = tmp_path / "out"
    build(results, report, out)
    (out / "notes.md").write_text("mine")
    before = snapshot(tmp_path)

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(make_report, "run_lines", interrupted)
    capsys.readouterr()
    assert interrupted_build(results, report, out) == 130
    assert capsys.readouterr().err.strip() == f"interrupted (Ctrl-C): --out {out} was left as it was"
    assert snapshot(tmp_path) == before and not list(tmp_path.glob(".make_report-*"))


def test_a_ctrl_c_between_the_renames_puts_the_old_out_and_the_students_files_back(inputs, tmp_path, monkeypatch,
                                                                                   capsys):
    """The last instants of a rebuild: the student's files already moved into the new folder, the old --out
    renamed aside; stopped there, both go back where they were, nothing half-built left beside."""
    results, report = inputs
    out = tmp_path / "out"
    build(results, report, out)
    (out / "notes.md").write_text("mine")
    before = snapshot(tmp_path)
    rename, stops = Path.rename, []

    def rename_once_stopped(self, target):
        if Path(target) == out and not stops:
            stops.append(self)
            raise KeyboardInterrupt
        return rename(self, target)
    monkeypatch.setattr(Path, "rename", rename_once_stopped)
    assert interrupted_build(results, report, out) == 130 and stops[0].name.startswith(".make_report-")
    assert snapshot(tmp_path) == before and not list(tmp_path.glob(".make_report-*"))


def test_names_at_the_limit_are_built_and_over_it_refused_before_any_work(inputs, tmp_path, chromium):
    """A 250-byte --out or --pdf-out is a legal name; their temporaries (once `.<name>.building-...`)
    had to be short too. A name over 255 bytes: one line before the work."""
    results, report = inputs
    out, pdf = tmp_path / ("o" * 250), tmp_path / ("p" * 251 + ".pdf")
    for _ in range(2):  # a first build, then a rebuild (the old --out set aside under a short name too)
        pdf_build(results, report, out, pdf, "--force")
    assert (out / "results.md").is_file() and pdf.read_bytes() == b"%PDF-1.4 printed"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    listed = sorted(os.listdir(tmp_path))
    for flag in ("--out", "--pdf-out"):
        long = tmp_path / ("x" * 256)
        argv = ["--results", str(results), "--report", str(report), "--out", str(tmp_path / "o2"), "--pdf",
                "--pdf-out", str(tmp_path / "r.pdf")]
        argv[argv.index(flag) + 1] = str(long)
        with pytest.raises(SystemExit) as exit_:
            make_report.main(argv)
        assert exit_.value.code == 2 and sorted(os.listdir(tmp_path)) == listed  # nothing made


@pytest.mark.slow  # a real process and its imports, a few seconds
def test_a_ctrl_c_while_the_pdf_prints_is_one_line_130_and_the_old_pdf_kept(inputs, tmp_path):
    """As a user meets it: SIGINT to `python report/make_report.py` while Chromium prints."""
    results, report = inputs
    bin_, pid_file, pdf, out = tmp_path / "bin", tmp_path / "chromium.pid", tmp_path / "r.pdf", tmp_path / "out"
    bin_.mkdir()
    fake_chromium(bin_, f"echo $$ > {pid_file}; sleep 600")
    pdf.write_bytes(b"%PDF-1.4 the old one")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    process = subprocess.Popen([sys.executable, str(REPO / "report" / "make_report.py"), "--results", str(results),
                                "--report", str(report), "--out", str(out), "--no-screenshots", "--pdf",
                                "--pdf-out", str(pdf), "--force"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.is_file() or not pid_file.read_text().strip():
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        err = process.communicate(timeout=60)[1]
    finally:
        process.kill()
        if pid_file.is_file():  # browser.py starts it in its own process session (gone already: browser.py killed it)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    assert process.returncode == 130
    assert err.strip() == f"interrupted (Ctrl-C): --out {out} was written; --pdf-out {pdf} was left as it was"
    assert pdf.read_bytes() == b"%PDF-1.4 the old one" and (out / "results.md").is_file()
    assert not list(tmp_path.glob(".make_report-*")) and not list(report.parent.glob(".pdf-*"))


@pytest.mark.parametrize("code, stops", [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EIO, False)])
def test_a_gpu_figure_on_a_full_disk_stops_the_build_other_errors_are_one_problem(tmp_path, monkeypatch, code, stops):
    """A disk that fills while an nvidia-smi figure is drawn must reach make_report (which leaves --out as it
    was), not become a GPU slot that 'does not fit'; a file that cannot be read is one problem line."""
    folder = gpu.GpuFolder(tmp_path, files={"nvidia-smi-gpt-warm.csv": lambda: "t,util\n"})

    def full(*args):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(gpu, "draw_slot", full)
    todo, problems = [], []
    args = [folder], tmp_path, {"gpu_utilization.png"}, todo, problems
    if stops:
        with pytest.raises(OSError):
            gpu.slot_lines(*args)
    else:
        gpu.slot_lines(*args)
        assert len(problems) == 1 and "does not fit (OSError" in problems[0] and len(todo) == 1


# --------------------------------------------------------------------- two builds of one --out

def test_a_second_build_of_one_out_waits_for_the_first_and_neither_loses_a_students_file(inputs, tmp_path):
    """While one build holds --out's lock, another waits (says so, writes nothing); released, it builds, keeping a
    student's notes.txt, and sources.json names its inputs, its Markdown and no PDF."""
    results, report = inputs
    out = tmp_path / "out"
    build(results, report, out)
    (out / "notes.txt").write_text("mine")
    with open(out / make_report.LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = subprocess.Popen([sys.executable, str(REPO / "report" / "make_report.py"), "--results",
                                    str(results), "--report", str(report), "--out", str(out), "--no-screenshots"],
                                   stdout=subprocess.PIPE, text=True)
        first = waiting.stdout.readline()  # printed once it found the lock held
        assert "waiting" in first and waiting.poll() is None
        before = snapshot(out)
    assert waiting.wait(timeout=120) == 0 and "wrote" in waiting.stdout.read()
    assert snapshot(out).keys() == before.keys() and (out / "notes.txt").read_text() == "mine"
    sources = json.loads((out / "sources.json").read_text())
    assert sources == {"inputs": [str(report), str(results)], "markdown": str(out / "report_filled.md"),
                       "pdf": None}


def test_an_out_others_may_write_is_refused_in_one_line(inputs, tmp_path):
    results, report = inputs
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    message = one_error(["--results", str(results), "--report", str(report), "--out", str(out), "--no-screenshots"])
    assert "writable by others" in message and list(out.iterdir()) == []


# --------------------------------------------------------------------- crafted inputs: one line each, in seconds

@pytest.mark.parametrize("name, text", [
    ("gpt_bench_cpu_2x1024.json", json.dumps({"device_name": "x", "micro_batch": 1, "seq_len": 2, "vocab_size": 3,
                                              "rungs": [{"name": "naive", "tokens_per_second": 0},
                                                        {"name": "+ dropout 0", "tokens_per_second": 5}]})),
    ("lenet_bench_cpu.json", '{"all_lightning_to_plain": [1.1, "x"]}'),
    ("lenet_bench_cpu.json", '{"all_lightning_to_plain": 5}'),
    ("lenet_run_2x128_cpu.json", "[1, 2]"),
    ("lenet_run_2x128_cpu.json", '{"act": "torch", "epochs": "x", "test_accuracy": null}')])
def test_a_results_file_with_a_special_name_and_wrong_fields_is_at_most_one_line(inputs, tmp_path, capsys, name,
                                                                                  text):
    """The files the report derives facts from (the CPU ladder beside the GPU's, the Lightning repeats, the LeNet-5
    run shown): a row of 0 tokens/s or a field of the wrong type is a problem line, the rest of the report built."""
    results, report = inputs
    (results / name).write_text(text)
    build(results, report, tmp_path / "out")
    err = capsys.readouterr().err
    assert "Traceback" not in err and (tmp_path / "out" / "results.md").is_file()
    assert len([line for line in err.splitlines() if "left out what" in line]) <= 1


def test_a_fifo_named_as_an_event_file_is_left_out_never_waited_on(tmp_path):
    """A run folder holding a FIFO called events.out.tfevents.*: one line, the build done in seconds."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(lenet_metrics()))
    os.mkfifo(run / "events.out.tfevents.1.fifo")
    done = subprocess.run([sys.executable, str(REPO / "report" / "make_report.py"), str(run), "--out",
                           str(tmp_path / "out"), "--no-screenshots"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"left out {run / 'events.out.tfevents.1.fifo'}: not a regular file" in done.stderr


def test_a_ladder_of_100000_rows_is_tabled_to_its_limit_saying_how_many_are_left_out(tmp_path):
    """A ladder JSON of 100,000 rows: MAX_ROWS tabled and the rest counted, in seconds, not a PDF of thousands of
    pages that Chromium never finishes."""
    from report import figures
    rows = [{"name": f"+ row {i}", "tokens_per_second": 100.0 + i} for i in range(100_000)]
    ladder = tmp_path / "gpt_bench_big.json"
    ladder.write_text(json.dumps({"device_name": "x", "micro_batch": 1, "seq_len": 2, "vocab_size": 3,
                                  "rungs": rows}))
    started = time.monotonic()
    make_report.main([str(ladder), "--out", str(tmp_path / "out"), "--no-screenshots"])
    assert time.monotonic() - started < 60
    filled = (tmp_path / "out" / "report_filled.md").read_text()
    assert f"另有 {100_000 - figures.MAX_ROWS:,} 行没有列出" in filled
    assert filled.count("| + row ") == figures.MAX_ROWS and f"| + row {figures.MAX_ROWS} |" not in filled
