"""slurm/handin.sh (README step 8) in a tmp git repository with fabricated runs and job logs: what the pack holds
(git's tracked files and what the student names; never untracked secrets, weights or checkpoints), the report it
accepts, and the tarball written by temp-and-rename (never half a tarball, never through a link, replaced only
with --force). Bash and tar only: no Slurm, no Python of the project."""
import fcntl
import json
import os
import pwd
import signal
import subprocess
import tarfile

import pytest

from conftest import REPO, wait_for

PDF = "%PDF-1.7\nmine\n"
PACK = f"lab5-handin-{pwd.getpwuid(os.getuid()).pw_name}.tar.gz"


def handin_repo(tmp_path):
    """A tmp git copy of the launchers, README and report.md with fabricated runs and job logs: two runs to
    hand in (lenet, gpt: a requeued job), one unnamed run each, a failed job's log, a traceback, a report; a
    tracked file whose name has a space, a newline and a leading dash; untracked files nobody named."""
    repo = tmp_path / "repo"

    def put(path, text="x\n"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)

    for path in (".gitignore", "slurm/handin.sh", "slurm/gpt.sh", "README.md", "report/report.md"):
        put(path, (REPO / path).read_text())
    for path in ("report/results/tests.json", "report/generated/gpt_curves.png", "mine.py", "-odd name\n.py"):
        put(path)
    put("report/report.pdf", "%PDF-1.7\nthe team's report\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "add", ".gitignore", "slurm", "README.md", "report", "--", "-odd name\n.py"], cwd=repo,
                   check=True)
    for path in (".env", "venv/lib/site.py", "venv/bin/python", "notes.txt"):  # untracked
        put(path)
    head = "[2026-12-01 10:00:00] host n1, job {} (restart {}), partition normal, GPUs 0, cwd /x\n"
    lenet, gpt = repo / "runs/lenet5/20261201-100000-ab12-torch", repo / "runs/gpt/gpt-7"
    for run in (lenet, gpt, repo / "runs/gpt/gpt-70", repo / "runs/lenet5/20261201-090000-cd34-torch"):
        put(run.relative_to(repo) / "metrics.json", "{}")
        put(run.relative_to(repo) / "events.out.tfevents.1.n1")
    put("runs/gpt/gpt-7/final/model.safetensors")
    put("runs/gpt/gpt-7/ckpt-5/model.safetensors")
    put("runs/slurm/lenet5-3.out", head.format(3, 0) + f"LeNet-5 ..., logs in {lenet}\ntest accuracy 99.1%\n")
    put("runs/slurm/lenet5-4.out", head.format(4, 0) + f"error: --out-dir {lenet} holds a finished run\n")
    put("runs/slurm/gpt-7.out", head.format(7, 0) + f"out {gpt}\nUSR1: checkpointing\nslurmstepd: error: *** JOB 7 "
        "CANCELLED DUE TO JOB REQUEUE ***\n" + head.format(7, 1) + f"out {gpt}\n-> success: train loss < 7\n")
    put("runs/slurm/gpt-70.out", head.format(70, 0) + f"out {repo}/runs/gpt/gpt-70\n-> success: train loss < 7\n")
    put("runs/slurm/tokenizer-2.out", head.format(2, 0) + "Traceback (most recent call last):\nOSError: no\n")
    put("runs/myreport/lab5-report-student.pdf", PDF)
    put("runs/myreport/tb.png")
    return repo, lenet, gpt


def handin(repo, *args, cwd=None, **kw):
    return subprocess.run(["bash", str(repo / "slurm" / "handin.sh"), *map(str, args)], cwd=cwd or repo,
                          capture_output=True, text=True, timeout=60, **kw)


def members(pack):
    with tarfile.open(pack) as tar:
        return {m.name for m in tar.getmembers() if m.isfile()}


def refused(done):
    """The one error line of a refused pack."""
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr.strip()


@pytest.fixture
def packed(tmp_path):
    """The repository after a good pack of its two runs: (repo, path of the tarball)."""
    repo, lenet, gpt = handin_repo(tmp_path)
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", lenet, gpt)
    assert done.returncode == 0, done.stderr
    return repo, repo / PACK


def test_the_pack_holds_the_tracked_code_the_report_its_runs_and_logs_and_what_is_named(tmp_path):
    """The code is git's list (a name with a newline and a leading dash verbatim), not the team's
    report/results/ or report.pdf; the runs named without checkpoints or final/ weights, the logs of the jobs
    that wrote them, not a failed job's log nor a run left unnamed. Untracked files (.env, venv/) are listed in
    one line and left out; a file named (mine.py, untracked) is packed. The umask is followed; an empty $USER
    gives the login name."""
    repo, lenet, gpt = handin_repo(tmp_path)
    done = handin(repo, "../myreport/lab5-report-student.pdf", "../../runs/lenet5/" + lenet.name, gpt,
                  "../myreport/tb.png", "../../mine.py", cwd=repo / "runs" / "gpt", env={**os.environ, "USER": ""},
                  preexec_fn=lambda: os.umask(0o027))
    pack = repo / PACK
    assert done.returncode == 0 and pack.exists(), done.stderr
    assert members(pack) == {".gitignore", "slurm/handin.sh", "slurm/gpt.sh", "README.md", "report/report.md",
                             "-odd name\n.py", "mine.py", "runs/myreport/lab5-report-student.pdf",
                             "runs/myreport/tb.png", f"runs/lenet5/{lenet.name}/metrics.json",
                             f"runs/lenet5/{lenet.name}/events.out.tfevents.1.n1", "runs/gpt/gpt-7/metrics.json",
                             "runs/gpt/gpt-7/events.out.tfevents.1.n1", "runs/slurm/lenet5-3.out",
                             "runs/slurm/gpt-7.out"}
    assert "not packed (untracked): .env notes.txt venv/ — name them to add them\n" in done.stdout
    assert "not packed: 2 weight and checkpoint files" in done.stdout
    assert f"15 files in {pack}" in done.stdout and done.stderr == ""
    assert pack.stat().st_mode & 0o777 == 0o640  # as the umask says, not mktemp's 0600

    unfinished = handin(repo, "--force", "runs/myreport/lab5-report-student.pdf", "runs/gpt")
    assert refused(unfinished) == "error: runs/gpt: not a finished run folder (no metrics.json) nor a file"


def test_a_repository_without_untracked_files_packs(tmp_path):
    """The usual case (a student's new files are under the ignored runs/): no untracked file to list is no
    error, and nothing is said about them."""
    repo, lenet, gpt = handin_repo(tmp_path)
    for path in (".env", "venv", "notes.txt", "mine.py"):
        subprocess.run(["rm", "-r", str(repo / path)], check=True)
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", lenet, gpt)
    assert done.returncode == 0 and (repo / PACK).is_file(), done.stderr
    assert "untracked" not in done.stdout and done.stderr == ""


def test_weights_and_checkpoints_are_never_packed_even_from_a_run_folder_outside_runs(tmp_path):
    """A run folder inside the repository but outside the ignored runs/ (untracked, named): its metrics go in,
    its final/ weights, optimizer states, a leftover final.tmp/ and checkpoints do not, nor a weights file
    named by itself."""
    repo, _, _ = handin_repo(tmp_path)
    run = repo / "experiments" / "gpt-big"
    for name in ("metrics.json", "args.json", "final/model.safetensors", "final/config.json", "optimizer.bin",
                 "final.tmp/model.safetensors", "ckpt-0000010/pytorch_model.bin", "ckpt-0000010/manifest.json",
                 "random_states_0.pkl", "scaler.pt", "weights.pth"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("{}")
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", run, run / "optimizer.bin")
    assert done.returncode == 0, done.stderr
    packed = members(repo / PACK)
    assert {m for m in packed if m.startswith("experiments/")} == {"experiments/gpt-big/metrics.json",
                                                                   "experiments/gpt-big/args.json"}
    assert "not packed: 9 weight and checkpoint files" in done.stdout
    assert "experiments" not in done.stdout.split("not packed (untracked):")[1].splitlines()[0]


@pytest.mark.parametrize("report, why", [
    ("report/report.pdf", " is this repository's own report/report.pdf: give the one you built"),
    ("runs/myreport/copy.pdf", " is this repository's own report/report.pdf: give the one you built"),
    ("runs/myreport/x.pdf", ": not your report's PDF (README step 7 writes"),
    ("runs/myreport/lab5-report-student.txt", ": not your report's PDF (README step 7 writes")])
def test_the_report_is_a_pdf_of_the_students_own(tmp_path, report, why):
    """Our report.pdf (or a copy of it) and a text file named x.pdf are refused in one line, nothing written."""
    repo, lenet, _ = handin_repo(tmp_path)
    (repo / "runs/myreport/copy.pdf").write_bytes((repo / "report/report.pdf").read_bytes())
    (repo / "runs/myreport/x.pdf").write_text("not a PDF\n")
    (repo / "runs/myreport/lab5-report-student.txt").write_text(PDF)
    assert refused(handin(repo, report, lenet)).startswith(f"error: {report}{why}")
    assert not (repo / PACK).exists()


def test_an_existing_tarball_is_replaced_only_with_force(packed):
    repo, pack = packed
    pack.write_bytes(b"an earlier hand-in")
    assert refused(handin(repo, "runs/myreport/lab5-report-student.pdf", "runs/gpt/gpt-7")) == (
        f"error: {pack} exists: pass --force to replace it (nothing was written)")
    assert pack.read_bytes() == b"an earlier hand-in"
    done = handin(repo, "--force", "runs/myreport/lab5-report-student.pdf", "runs/gpt/gpt-7")
    assert done.returncode == 0 and "runs/gpt/gpt-7/metrics.json" in members(pack)


def test_a_tarball_name_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    repo, lenet, _ = handin_repo(tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (repo / PACK).symlink_to(target)
    assert refused(handin(repo, "--force", "runs/myreport/lab5-report-student.pdf", lenet)) == (
        f"error: {repo / PACK} is a symbolic link: remove it (nothing was written)")
    assert target.read_text() == "keep me\n" and (repo / PACK).is_symlink()


def test_a_second_pack_while_one_is_running_is_refused(packed):
    """Two packs at once: the second stops in one line while the first holds the repository's lock."""
    repo, pack = packed
    before = pack.read_bytes()
    fd = os.open(repo, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running pack holds
        assert refused(handin(repo, "--force", "runs/myreport/lab5-report-student.pdf", "runs/gpt/gpt-7")) == (
            f"error: another hand-in is being packed in {repo}; wait for it")
    finally:
        os.close(fd)
    assert pack.read_bytes() == before


def test_a_pack_interrupted_while_writing_leaves_the_old_tarball_and_no_temporary(packed):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) in the middle of a slow pack."""
    repo, pack = packed
    before = pack.read_bytes()
    (repo / "big.dat").write_bytes(os.urandom(64 << 20))  # seconds of gzip
    subprocess.run(["git", "add", "big.dat"], cwd=repo, check=True)
    proc = subprocess.Popen(["bash", "slurm/handin.sh", "--force", "runs/myreport/lab5-report-student.pdf",
                             "runs/gpt/gpt-7"], cwd=repo, start_new_session=True, stderr=subprocess.PIPE)

    def writing():
        return [p for p in repo.glob(".lab5-handin-*.part") if p.stat().st_size > 1 << 20]
    assert wait_for(writing, timeout=60, proc=proc), "the pack never started writing"
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) != 0
    assert pack.read_bytes() == before and not list(repo.glob(".lab5-handin-*.part"))


def test_a_run_folder_whose_name_is_not_a_pattern_keeps_its_log(tmp_path):
    """`base(1` made grep fail (Unmatched `(`) and the log was lost; the name is compared as a string."""
    repo, _, _ = handin_repo(tmp_path)
    run = repo / "runs/gpt/base(1"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    head = "[2026-12-01 10:00:00] host n1, job 9 (restart 0), partition normal, GPUs 0, cwd /x\n"
    (repo / "runs/slurm/gpt-9.out").write_text(head + f"out {run}\n-> success\n")
    (repo / "runs/slurm/gpt-8.out").write_text(head + f"out {run}x\n-> success\n")  # another run's
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", run)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert {m for m in members(repo / PACK) if m.startswith("runs/")} == {
        "runs/myreport/lab5-report-student.pdf", "runs/gpt/base(1/metrics.json", "runs/slurm/gpt-9.out"}


def test_a_read_only_repository_is_one_line(tmp_path):
    """Mounted read-only (root ignores file modes: only a mount makes it unwritable); skipped where mount is
    not permitted."""
    repo, lenet, _ = handin_repo(tmp_path)
    if subprocess.run(["mount", "--bind", "-o", "ro", str(repo), str(repo)], capture_output=True).returncode:
        pytest.skip("mount --bind not permitted here")
    try:
        assert refused(handin(repo, "runs/myreport/lab5-report-student.pdf", lenet)) == (
            f"error: cannot write in {repo} (read-only?): the tarball is written there")
    finally:
        subprocess.run(["umount", "--lazy", str(repo)], check=True)


def sources(repo, pdf, inputs, markdown="runs/myreport/report_filled.md"):
    """The sources.json make_report.py writes into its --out folder (beside the PDF it printed)."""
    (repo / markdown).write_text("# 报告\n")
    (repo / "runs/myreport/sources.json").write_text(json.dumps(
        {"inputs": [str(path) for path in inputs], "markdown": str(repo / markdown), "pdf": str(pdf)}))


def test_the_report_alone_packs_what_its_sources_json_lists(tmp_path):
    """Given only the PDF: the sources.json beside it (its "pdf" that PDF), the report's Markdown, each run folder
    it lists (no weights, no run.lock) with its jobs' logs, each file it lists inside the repository (the
    student's report source, a ladder JSON). Inputs outside the repository or gone are said, not packed."""
    repo, lenet, gpt = handin_repo(tmp_path)
    (gpt / "run.lock").write_text("")
    (repo / "runs/my_report.md").write_text("# 我的报告\n")
    (repo / "runs/ladder.json").write_text("{}")
    outside = tmp_path / "data.json"
    outside.write_text("{}")
    sources(repo, repo / "runs/myreport/lab5-report-student.pdf",
            [lenet, gpt, repo / "runs/my_report.md", repo / "runs/ladder.json", outside, repo / "runs/gone"])
    done = handin(repo, "runs/myreport/lab5-report-student.pdf")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert {m for m in members(repo / PACK) if m.startswith("runs/")} == {
        "runs/myreport/lab5-report-student.pdf", "runs/myreport/sources.json", "runs/myreport/report_filled.md",
        "runs/my_report.md", "runs/ladder.json", f"runs/lenet5/{lenet.name}/metrics.json",
        f"runs/lenet5/{lenet.name}/events.out.tfevents.1.n1", "runs/gpt/gpt-7/metrics.json",
        "runs/gpt/gpt-7/events.out.tfevents.1.n1", "runs/slurm/lenet5-3.out", "runs/slurm/gpt-7.out"}
    assert f"not packed (outside the repository, or gone): {outside}\n" in done.stdout
    assert f"not packed (outside the repository, or gone): {repo / 'runs/gone'}\n" in done.stdout
    assert "not packed: 2 weight and checkpoint files" in done.stdout


def test_a_sources_json_of_another_pdf_is_not_packed(tmp_path):
    """A sources.json from a build that printed another PDF (or none) does not describe this one: without runs
    named the pack is refused in one line; with runs named only those go in."""
    repo, lenet, gpt = handin_repo(tmp_path)
    sources(repo, repo / "runs/myreport/older.pdf", [gpt])
    assert refused(handin(repo, "runs/myreport/lab5-report-student.pdf")) == (
        "error: no sources.json beside runs/myreport/lab5-report-student.pdf names it: name the runs it reports")
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", lenet)
    assert done.returncode == 0, done.stderr
    packed = {m for m in members(repo / PACK) if m.startswith("runs/")}
    assert "runs/myreport/sources.json" not in packed and "runs/gpt/gpt-7/metrics.json" not in packed


def test_a_lock_file_is_never_packed_even_named(tmp_path):
    """A run's run.lock (a live run holds it; a copy is meaningless) stays out, from a run folder or named."""
    repo, lenet, _ = handin_repo(tmp_path)
    (lenet / "run.lock").write_text("")
    (repo / "mine.lock").write_text("")
    done = handin(repo, "runs/myreport/lab5-report-student.pdf", lenet, "mine.lock")
    assert done.returncode == 0, done.stderr
    assert not [m for m in members(repo / PACK) if m.endswith(".lock")]
    assert "mine.lock" not in done.stdout


def test_a_full_disk_is_one_line_naming_it_and_leaves_no_temporary(tmp_path):
    """The repository on a small file system that the tarball cannot fit: `packing failed:` and the reason (not
    an empty one, nor tar's closing `Error is not recoverable`); no .part left. Skipped where mount is not
    permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mount not permitted here")
    try:
        repo, lenet, _ = handin_repo(disk)
        free = os.statvfs(repo).f_bavail * os.statvfs(repo).f_frsize
        (repo / "big.dat").write_bytes(os.urandom(free - (64 << 10)))  # incompressible: 64 KiB left for the pack
        done = handin(repo, "runs/myreport/lab5-report-student.pdf", lenet, "big.dat")
        assert refused(done) == "error: packing failed: gzip: stdout: No space left on device"
        assert not list(repo.glob(".lab5-handin-*")) and not (repo / PACK).exists()
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def test_a_killed_pack_leaves_a_part_that_the_next_pack_removes(packed):
    """SIGKILL (no trap runs) to the pack and its tar in the middle of writing: its .part is left beside the
    tarball, the old tarball whole; the next pack removes it under the lock and packs."""
    repo, pack = packed
    before = pack.read_bytes()
    (repo / "big.dat").write_bytes(os.urandom(64 << 20))  # seconds of gzip
    subprocess.run(["git", "add", "big.dat"], cwd=repo, check=True)
    proc = subprocess.Popen(["bash", "slurm/handin.sh", "--force", "runs/myreport/lab5-report-student.pdf",
                             "runs/gpt/gpt-7"], cwd=repo, start_new_session=True)

    def parts():
        return [p for p in repo.glob(".lab5-handin-*.part") if p.stat().st_size > 1 << 20]
    assert wait_for(parts, timeout=60, proc=proc), "the pack never started writing"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert pack.read_bytes() == before and parts()
    (repo / "big.dat").unlink()
    subprocess.run(["git", "rm", "-q", "--cached", "big.dat"], cwd=repo, check=True)
    done = handin(repo, "--force", "runs/myreport/lab5-report-student.pdf", "runs/gpt/gpt-7")
    assert done.returncode == 0 and "big.dat" not in members(pack), done.stderr
    assert not list(repo.glob(".lab5-handin-*"))
