"""report/browser.py on a shared login node: TensorBoard, Chromium and the PDF keep their temporaries in one private
folder, the screenshot is of this process's own server, TensorBoard serves the runs under a secret path only (the
screenshots' server and the student's `python -m report.browser` alike), a stopped build leaves no Chromium behind,
Chromium prints a page that reads no file, and the screenshots' tag filters find the loss and accuracy cards under
both the current and the older tag names."""
import contextlib
import getpass
import http.server
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import REPO, require_or_skip, wait_for
from report import browser

GPT_TAGS = {"loss/train", "loss/val", "perf/tokens_per_second"}  # the cards the GPT screenshot must show
GPT_OTHERS = {"train/grad_norm", "train/lr", "perf/step_ms", "perf/mfu", "profile/loss_seconds",
              "phases/loop_seconds", "system/gpu_utilization_percent", "system/gpu_memory_used_GiB"}
LENET_TAGS = {"accuracy/train", "accuracy/test", "loss/train", "loss/test"}
OLD_NAMES = {"loss/train": "train/loss", "loss/val": "val/loss", "loss/test": "test/loss",
             "accuracy/train": "train/accuracy", "accuracy/test": "test/accuracy"}  # committed events keep these


def write_events(folder, tags, steps=5):
    with SummaryWriter(folder) as writer:
        for step in range(steps):
            for tag in sorted(tags):
                writer.add_scalar(tag, 1.0 / (step + 1), step)
    return folder


def require_browser():
    if not browser.find_browser():
        require_or_skip("no Chromium (apt-get install chromium)", "LAB5_REQUIRE_BROWSER")


@pytest.fixture(scope="module")
def other_uid():
    """Another, unprivileged user to own what a test plants: made with useradd when the tests run as root (who
    ignores file modes), else None: the test's own user plants then, and a planted link is followed all the same."""
    name, code = "lab5-planter", None
    if os.geteuid() == 0 and shutil.which("useradd"):
        code = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True).returncode
    try:
        yield pwd.getpwnam(name).pw_uid if code in (0, 9) else None  # 9: it exists already
    finally:
        if code == 0:
            subprocess.run(["userdel", name], capture_output=True)


def plant(uid, path, target=None):
    """A folder (0777, as TensorBoard makes its own) or, with target, a link at path, owned by uid where given."""
    if target is None:
        path.mkdir(mode=0o777)
        path.chmod(0o777)
    else:
        path.symlink_to(target)
    if uid is not None:
        os.lchown(path, uid, uid)


# --------------------------------------------------------------------- TensorBoard: private, and its own server

def planted_tmpdir(tmp_path, other_uid):
    """A shared TMPDIR (1777) where another user made `.tensorboard-info` (0777) with a `pid-N.info` link for every
    pid the next processes may get, each to the student's metrics.json: (the TMPDIR, metrics.json, the links)."""
    shared, victim = tmp_path / "shared", tmp_path / "run" / "metrics.json"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    victim.parent.mkdir()
    victim.write_text('{"test_accuracy": 0.99}\n')
    plant(other_uid, shared / ".tensorboard-info")
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    for pid in {os.getpid(), *range(last + 1, last + 4000)}:
        plant(other_uid, shared / ".tensorboard-info" / f"pid-{pid}.info", victim)
    return shared, victim, sorted(os.listdir(shared / ".tensorboard-info"))


def test_tensorboard_writes_nothing_into_a_shared_tmpdir_and_never_through_a_planted_link(tmp_path, monkeypatch,
                                                                                         other_uid):
    """A shared TMPDIR where another user made `.tensorboard-info` (0777) with a `pid-N.info` link for every pid
    the next processes may get, each to the student's metrics.json: the `tensorboard` command writes its info file
    there through the link; the report's TensorBoard must write nothing there at all."""
    shared, victim, before = planted_tmpdir(tmp_path, other_uid)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr("tempfile.tempdir", None)  # (read again from TMPDIR)
    with browser.serve_tensorboard(write_events(tmp_path / "events", LENET_TAGS)) as base:
        assert base
    assert victim.read_text() == '{"test_accuracy": 0.99}\n'
    assert sorted(os.listdir(shared)) == [".tensorboard-info"]
    assert sorted(os.listdir(shared / ".tensorboard-info")) == before


def listening_ports_of_this_process():
    """{port: socket inode} of the TCP ports a socket of this very process listens on (/proc/net/tcp's LISTEN
    rows, by socket inode)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            inodes.add(os.readlink(f"/proc/self/fd/{fd}"))
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {int(row[1].split(":")[1], 16): row[9] for row in rows if row[3] == "0A" and f"socket:[{row[9]}]" in inodes}


def status(url):
    """The HTTP status a GET of url gets."""
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def without_secret(url):
    """Every path that reads the runs, or could, on url's port but not under its secret path."""
    root = url.split("/")[:3]
    return ["/".join(root) + path for path in ("/", "/data/plugin/scalars/tags", "/data/runs", "/lab5-storage")]


def test_the_tensorboard_url_is_a_port_this_process_listens_on_and_its_runs_are_under_a_secret(tmp_path):
    """Whoever answers on the URL is this process's own server: the port is one its own socket listens on (a port
    chosen, closed and handed to a child can be taken by anyone in between). Another user on the machine who finds
    the port reads nothing there: without the URL's secret path every request is TensorBoard's 404."""
    with browser.serve_tensorboard(write_events(tmp_path / "events", LENET_TAGS)) as base:
        port = urllib.parse.urlsplit(base).port
        assert base.startswith("http://127.0.0.1:") and port in listening_ports_of_this_process()
        assert len(urllib.parse.urlsplit(base).path) > 20  # a secret: 16 random bytes
        inode = listening_ports_of_this_process()[port]
        with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=60) as answer:
            assert set(next(iter(json.loads(answer.read()).values()))) == LENET_TAGS
        assert [status(url) for url in without_secret(base)] == [404] * 4
        with urllib.request.urlopen(f"{base}/lab5-storage", timeout=60) as answer:
            page = answer.read().decode()
    assert page.index('localStorage.setItem("_ignoreYOutliers", "false");') < page.index("location.replace(")
    assert inode not in listening_ports_of_this_process().values()  # stopped on leaving (the port may be reused)


def test_the_tensorboard_command_serves_only_its_printed_url_and_writes_nothing_in_a_shared_tmpdir(tmp_path,
                                                                                               other_uid):
    """`python -m report.browser --logdir runs` (README step 6) under a shared TMPDIR with planted links: it prints
    a URL on 127.0.0.1 under a secret path, the `ssh -L` line that forwards a laptop's 127.0.0.1:6006 to it, and
    the laptop's URL with the same secret; the runs answer there and nowhere else on the port (404). Nothing is written
    in the TMPDIR nor through its links; Ctrl-C stops it cleanly, and its port is closed."""
    shared, victim, before = planted_tmpdir(tmp_path, other_uid)
    write_events(tmp_path / "runs" / "lenet", LENET_TAGS)
    process = subprocess.Popen([sys.executable, "-m", "report.browser", "--logdir", str(tmp_path / "runs")],
                               cwd=REPO, env={**os.environ, "TMPDIR": str(shared)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        url = re.search(r"(http://127\.0\.0\.1:(\d+)(/[\w-]{20,})/) ", lines[0])
        assert url, lines
        assert lines[1].split() == ["ssh", "-N", "-L", f"127.0.0.1:6006:127.0.0.1:{url[2]}",
                                    f"{getpass.getuser()}@{os.uname().nodename}"]
        assert lines[2].strip() == f"then open http://127.0.0.1:6006{url[3]}/"
        with urllib.request.urlopen(f"{url[1]}data/plugin/scalars/tags", timeout=60) as answer:
            assert set(json.loads(answer.read())["lenet"]) == LENET_TAGS
        assert [status(u) for u in without_secret(url[1])] == [404] * 4
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    assert victim.read_text() == '{"test_accuracy": 0.99}\n'
    assert sorted(os.listdir(shared)) == [".tensorboard-info"]
    assert sorted(os.listdir(shared / ".tensorboard-info")) == before
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url[1]}data/plugin/scalars/tags", timeout=10)


def test_the_tensorboard_command_without_runs_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "report.browser", "--logdir", str(tmp_path / "nothing")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: no TensorBoard events under {tmp_path / 'nothing'} (the runs are under runs/)\n"


class Squatter:
    """Another user's program that takes the port a TensorBoard command line names as soon as it appears, and
    answers every request there with its own scalars and page; counts the requests it answered."""

    def __init__(self):
        self.hits, self.servers, self.done = 0, [], threading.Event()
        threading.Thread(target=self.watch, daemon=True).start()

    def watch(self):
        while not self.done.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    args = cmdline.read_bytes().split(b"\0")
                    if b"--port" in args and any(b"tensorboard" in a for a in args):
                        self.take(int(args[args.index(b"--port") + 1]))
            time.sleep(0.01)

    def take(self, port):
        squatter = self

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                squatter.hits += 1
                body = b'{"forged": {"loss/train": {}}}' if "/data/" in self.path else b"<h1>FORGED</h1>"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)  # OSError: TensorBoard was first
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self):
        self.done.set()
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.mark.slow  # Chromium screenshots
def test_a_squatter_on_a_port_is_never_photographed(tmp_path):
    """Another program that binds the port TensorBoard was to use first serves its own page there; the screenshots
    must be of this process's TensorBoard (the squatter answers no request), whole and cropped to their cards."""
    require_browser()
    run = SimpleNamespace(kind="gpt", events=write_events(tmp_path / "events", GPT_TAGS | GPT_OTHERS),
                          events_source="run")
    out, problems, squatter = tmp_path / "out", [], Squatter()
    out.mkdir()
    try:
        lines = browser.tensorboard_screenshots([run], out, problems)
    finally:
        squatter.close()
    assert squatter.hits == 0 and problems == []
    assert lines == ["![TensorBoard: scalars of run](gpt_tensorboard_scalars.png)"]
    assert browser.is_png(out / "gpt_tensorboard_scalars.png")

# --------------------------------------------------------------------- the tag filters

def shown(kind, tags):
    """The tags a SHOTS scalars page of `kind` shows: TensorBoard's tagFilter is a regular expression searched in
    each tag name (JavaScript's RegExp; these patterns mean the same in Python's re)."""
    page = next(page for _, page, _ in browser.SHOTS[kind] if page.startswith("scalars"))
    pattern = urllib.parse.unquote(dict(urllib.parse.parse_qsl(page.split("&", 1)[1]))["tagFilter"])
    return {tag for tag in tags if re.search(pattern, tag)}


@pytest.mark.parametrize("rename", [lambda tag: tag, lambda tag: OLD_NAMES.get(tag, tag)], ids=["current", "older"])
def test_the_scalar_screenshots_show_loss_accuracy_and_throughput_under_both_tag_names(rename):
    """The GPT screenshot shows both losses and the throughput, nothing else (no gradient norm, no profiled
    profile/loss_seconds); the LeNet-5 one both losses and accuracies: under the names runs write now and under the
    older ones the committed events keep."""
    gpt, lenet = {rename(t) for t in GPT_TAGS}, {rename(t) for t in LENET_TAGS}
    assert shown("gpt", gpt | {rename(t) for t in GPT_OTHERS}) == gpt
    assert shown("lenet5", lenet | {"train/lr", "phases/loop_seconds", "phases/evaluation_seconds"}) == lenet


# --------------------------------------------------------------------- the PDF

def fake_chromium(folder, record):
    """A `chromium` that records where it was told to keep its profile, temporaries and PDF (and their folders'
    modes), then prints a small PDF there through the shell's `>` (which follows a link)."""
    script = folder / "chromium"
    script.write_text(f"""#!/bin/sh
for a in "$@"; do case "$a" in
  --user-data-dir=*) profile="${{a#--user-data-dir=}}";;
  --print-to-pdf=*) pdf="${{a#--print-to-pdf=}}";;
esac; done
printf '%s\\n' "$profile" "$TMPDIR" "$pdf" "$(stat -c %a "$(dirname "$pdf")")" > {record}
printf '%%PDF-1.4 printed' > "$pdf"
""")
    script.chmod(0o755)
    return str(script)


def test_the_pdf_is_printed_in_a_private_folder_and_renamed_into_place_never_through_a_link(tmp_path, monkeypatch,
                                                                                            other_uid):
    """Chromium's profile, its temporaries and the PDF it prints lie in one folder only this user can enter; the
    PDF reaches --pdf-out by a rename, so a link another user planted at a temporary name there (the old
    `.make_report-<pid>.pdf`) is never written through."""
    shared, victim, record = tmp_path / "shared", tmp_path / "metrics.json", tmp_path / "record"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    victim.write_text('{"test_accuracy": 0.99}\n')
    plant(other_uid, shared / f".make_report-{os.getpid()}.pdf", victim)
    (tmp_path / "r.md").write_text("# 报告\n\n正文。\n")
    monkeypatch.setattr(browser, "find_browser", lambda: fake_chromium(tmp_path, record))
    browser.write_pdf(tmp_path / "r.md", shared / "report.pdf", "# 报告\n\n正文。\n")
    assert victim.read_text() == '{"test_accuracy": 0.99}\n'
    assert (shared / "report.pdf").read_bytes() == b"%PDF-1.4 printed" and not (shared / "report.pdf").is_symlink()
    assert stat.S_IMODE((shared / "report.pdf").stat().st_mode) == 0o666 & ~browser.files.UMASK
    assert sorted(os.listdir(shared)) == sorted([f".make_report-{os.getpid()}.pdf", "report.pdf"])
    profile, tmpdir, pdf, mode = record.read_text().splitlines()
    private = Path(tmpdir)
    assert Path(profile).parent == private == Path(pdf).parent and mode == "700" and not private.exists()


def alive(pid):
    """A process that runs (a zombie, dead but not yet reaped by init, does not)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_a_report_build_stopped_while_chromium_prints_leaves_no_chromium_and_no_temporaries(tmp_path, sig, code):
    """A TERM (kill, scancel) or a Ctrl-C to the Python that prints the PDF: Chromium and the helpers it started
    (its process group) are killed, the private folder removed, and Python exits (143 on a TERM; an uncaught
    Ctrl-C: by SIGINT, as Python ends on one)."""
    record, private = tmp_path / "record", tmp_path / "tmp"
    private.mkdir()
    chromium = tmp_path / "chromium"
    chromium.write_text(f'#!/bin/sh\nsleep 600 &\necho "$$ $!" > {record}\nwait\n')
    chromium.chmod(0o755)
    (tmp_path / "r.md").write_text("# r\n")
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path; from report import browser\n"
              f"browser.find_browser = lambda: {str(chromium)!r}\n"
              f"browser.write_pdf(Path({str(tmp_path / 'r.md')!r}), Path({str(tmp_path / 'r.pdf')!r}), '# r')\n")
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(private)},
                               stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        assert wait_for(lambda: record.is_file() and record.read_text().strip(), proc=process), process.stderr.read()
        pids = [int(pid) for pid in record.read_text().split()]
        time.sleep(1)  # Python back from starting it, waiting on it
        process.send_signal(sig)
        assert process.wait(timeout=60) == code, process.stderr.read()
    finally:
        process.kill()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10), "Chromium outlived the build"
    assert os.listdir(private) == [] and not (tmp_path / "r.pdf").exists()


def poppler(*args):
    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout


def test_chromium_reads_no_file_outside_the_reports_folder(tmp_path):
    """HTML that reached the report (an iframe, an <img> by absolute path, a Markdown image up out of the report's
    folder or through a link inside it) loads nothing: the secret text and image are not in the PDF. The report's
    own images are there, and pdf.css still sizes them by name (an nvidia_smi_ one shown smaller)."""
    from PIL import Image
    require_browser()
    if not all(shutil.which(t) for t in ("pdftotext", "pdfimages")):
        require_or_skip("no poppler (apt-get install poppler-utils)", "LAB5_REQUIRE_BROWSER")
    secret_text, secret_png, report = tmp_path / "secret.txt", tmp_path / "secret.png", tmp_path / "report"
    secret_text.write_text("SECRET-LINE-7f3a\n")
    Image.new("RGB", (123, 45), (200, 0, 0)).save(secret_png)
    (report / "generated").mkdir(parents=True)
    for name in ("nvidia_smi_gpt.png", "plain.png"):
        Image.new("RGB", (300, 900), (0, 0, 200)).save(report / "generated" / name)
    (report / "generated" / "linked.png").symlink_to(secret_png)
    text = (f"# 报告\n\n正文。\n\n![own](generated/plain.png)\n\n![smi](generated/nvidia_smi_gpt.png)\n\n"
            f'<iframe src="{secret_text.as_uri()}" width="600" height="200"></iframe>\n\n'
            f'<img src="{secret_png}">\n\n<img src={secret_png}>\n\n![up](../secret.png)\n\n'
            f"![linked](generated/linked.png)\n\n<object data=\"{secret_text.as_uri()}\"></object>\n")
    (report / "r.md").write_text(text)
    pdf = tmp_path / "r.pdf"
    browser.write_pdf(report / "r.md", pdf, text)
    assert "正文" in poppler("pdftotext", str(pdf), "-") and "SECRET" not in poppler("pdftotext", str(pdf), "-")
    images = [line.split() for line in poppler("pdfimages", "-list", str(pdf)).splitlines()[2:]]
    sizes = [(int(row[3]), int(row[4])) for row in images if row[2] == "image"]
    assert (123, 45) not in sizes and sizes.count((300, 900)) == 2, sizes
    plain, smi = (float(row[13]) for row in images if (row[3], row[4]) == ("300", "900"))  # y-ppi, in page order
    assert smi > plain * 1.1  # 62 mm high, not 72 mm
