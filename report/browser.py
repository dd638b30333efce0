"""A real TensorBoard server photographed by headless Chromium (cropped to its cards), and Chromium's print-to-PDF.
Chromium and what it writes live in one private folder (tempfile.mkdtemp) until a file is whole, then it is renamed
into place. Every wait is bounded: a hung Chromium is killed with its process group after BROWSER_TIMEOUT s.

As a command, TensorBoard for one student on a shared login node (README step 6), until Ctrl-C:
    python -m report.browser --logdir runs
It prints the URL (127.0.0.1, under a secret path: only who has the URL reads the runs) and the `ssh -L` line that
forwards it to a laptop; it reads the runs once, when it starts."""
import argparse
import base64
import contextlib
import getpass
import html as html_lib
import json
import mimetypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from data import files
from training import errors

BROWSER_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
BROWSER_TIMEOUT = 120  # seconds; a screenshot takes ~5 s, a PDF ~10 s
SHOTS = {  # run kind -> [(file, TensorBoard page: dashboard & its tag filter, window height in CSS px)]: the
    # cards that matter, two a row in a 1,400 px window; the crop keeps the first section's cards only. The filters
    # match loss/train and train/loss (older runs' events) alike; GPT's, ^loss/|/loss$|tokens_per_second, leaves
    # out a profiled run's profile/loss_seconds
    "lenet5": [("lenet_tensorboard_scalars.png", "scalars&tagFilter=loss%7Caccuracy&_smoothingWeight=0", 900),
               ("lenet_tensorboard_layers.png", "images&tagFilter=layers", 1100)],
    "gpt": [("gpt_tensorboard_scalars.png", "scalars&tagFilter=%5Eloss%2F%7C%2Floss%24%7Ctokens_per_second"
                                            "&_smoothingWeight=0", 900)],
}
SHOT_WIDTH, SHOT_SCALE = 1400, 2  # CSS px, device pixels per CSS px: tick labels legible at print size
# every point inside the y range (TensorBoard reads "ignore outliers", on by default, from localStorage only), then
# TensorBoard itself, the page named by this page's own #fragment
SETTINGS_PAGE = (b'<script>localStorage.setItem("_ignoreYOutliers", "false");'
                 b'location.replace("./?darkMode=false" + location.hash);</script>')
SOURCES = "screenshots.json"  # in --out: {screenshot file: the run folder whose events it shows}


class BrowserError(errors.UserError):
    """Chromium failed, hung or wrote nothing: the message says which, in one line."""


def is_png(path):
    """A PNG signature and more than a header (Chromium can leave 0 bytes)."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n" and Path(path).stat().st_size > 64
    return False


def find_browser():
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@contextlib.contextmanager
def serve_tensorboard(logdir):
    """TensorBoard in this process on 127.0.0.1, port 0 (the URL names the kernel's pick: no program that took a port
    first answers in its place), under a secret path (another user on the machine reaches the port, not the runs: any
    other path is TensorBoard's 404), its events read once; None if it lists no scalars. No child, and no
    .tensorboard-info: nothing is written in a shared TMPDIR."""
    from tensorboard import program
    board, secret = program.TensorBoard(), "/" + secrets.token_urlsafe(16)
    board.configure(logdir=str(logdir), host="127.0.0.1", port=0, path_prefix=secret, load_fast="false",
                    reload_interval=0, reload_task="blocking")
    server = board._make_server()  # launch() without its thread: launch() gives no handle to stop the server by
    server.app = with_settings(server.app, f"{secret}/lab5-storage")
    (serving := threading.Thread(target=server.serve_forever, daemon=True)).start()
    try:
        base, scalars = server.get_url().rstrip("/"), None
        with contextlib.suppress(OSError, ValueError):  # no answer, or not JSON: None
            with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=60) as answer:
                scalars = json.load(answer)
        yield base if scalars else None
    finally:
        server.shutdown()
        serving.join()  # its own close (werkzeug's serve_forever closes the socket) done: closed on leaving
        server.server_close()


def with_settings(app, path):
    """TensorBoard's WSGI app plus SETTINGS_PAGE at `path` (path#PAGE: TensorBoard's PAGE with the settings)."""
    def serve(environ, start_response):
        if environ["PATH_INFO"] != path:
            return app(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(SETTINGS_PAGE)))])
        return [SETTINGS_PAGE]
    return serve


def browser(folder, *args):
    """Headless Chromium, its profile in the private `folder`, in a process group: a hung one dies with its helpers,
    and so does one whose build is stopped (Ctrl-C, or a TERM: kill, scancel)."""
    process = subprocess.Popen([find_browser(), *BROWSER_FLAGS, f"--user-data-dir={folder / 'profile'}", *args],
                               env={**os.environ, "TMPDIR": str(folder)},  # its own temporaries there too
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a TERM: SystemExit, through the except
    try:
        code = process.wait(timeout=BROWSER_TIMEOUT)
    except BaseException as e:  # a hang, or a Ctrl-C while it prints: it must not write on after we exit
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            raise BrowserError(f"Chromium did not finish within {BROWSER_TIMEOUT} s; killed") from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0:
        raise BrowserError(f"Chromium exited with {code}")


def crop_to_cards(path):
    """Crop a TensorBoard screenshot to its first section's cards, 12 px margins; None, or why it did not fit."""
    import numpy as np
    from PIL import Image
    try:
        image = Image.open(path).convert("RGB")
        white = (np.asarray(image) == 255).all(axis=2)
        row = int(white.shape[0] * 0.6)
        xs = np.flatnonzero(white[row])
        if len(xs) == 0 or white[row, :xs[0]].any():
            raise ValueError("no white card box right of the sidebar")
        left, right = xs[0] + 1, xs[-1]
        across = white[:, left:right].mean(axis=1)  # rows of the box: white; its borders and divider: not
        top = np.argmax(across > 0.9)
        divider = top + np.argmax(across[top:] < 0.5)
        top = divider + np.argmax(across[divider:] > 0.9)
        margin = white[top:, left + 4]  # the box's left margin, white down to its bottom border
        cards = image.crop((left, top, right, top + (np.argmax(~margin) if not margin.all() else len(margin))))
        dark = (np.asarray(cards) < 235).any(axis=2)  # text, lines, images: not the page's grey (245)
        ink, rows = np.flatnonzero(dark.any(axis=0)), np.flatnonzero(dark.any(axis=1))
        if len(ink) == 0:
            raise ValueError("its card box is empty")
    except (OSError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
        return f"{path.name} left uncropped: {e}"
    cards.crop((max(0, ink[0] - 12), max(0, rows[0] - 12), min(cards.width, ink[-1] + 12),
                min(cards.height, rows[-1] + 12))).save(path)
    return None


def tensorboard_screenshots(runs, out, problems):
    """Each run's SHOTS, as a student sees them, and their lines (each file written whole); none after a failure."""
    if not find_browser():
        return ["- no TensorBoard screenshots: Chromium not found (`apt-get install chromium`)"]
    lines, taken = [], {}
    with tempfile.TemporaryDirectory(prefix="lab5-browser-") as folder:
        folder = Path(folder)
        try:
            for run in runs:
                with serve_tensorboard(run.events) as base:
                    if base is None:
                        problems.append(f"TensorBoard on {run.events_source} did not answer; no screenshots of it")
                        continue
                    for file, page, height in SHOTS.get(run.kind, []):
                        path = folder / file
                        browser(folder, f"--window-size={SHOT_WIDTH},{height}", f"--screenshot={path}",
                                f"--force-device-scale-factor={SHOT_SCALE}", "--virtual-time-budget=10000",
                                f"{base}/lab5-storage#{page}")
                        if not is_png(path):
                            raise BrowserError(f"Chromium wrote no {'PNG' if path.is_file() else 'file'}")
                        problems.extend(filter(None, [crop_to_cards(path)]))
                        files.write_atomic(out / file, path.read_bytes())
                        taken[file] = run.events_source
                        lines.append(f"![TensorBoard: {page.split('&')[0]} of {run.events_source}]({file})")
        except BrowserError as e:  # (raised by a screenshot: `file` is its)
            problems.append(f"no screenshot {file}: {e}; no further screenshots tried")
    if taken:
        files.write_json(out / SOURCES, taken)
    return lines


def kept_screenshots(out, shown):
    """The screenshots in `out` that SOURCES says show the runs shown now ({kind: inputs.Run})."""
    taken = None  # no SOURCES, or one unreadable: no screenshot is known to show these runs
    with contextlib.suppress(OSError, ValueError):
        taken = json.loads(files.read_small(out / SOURCES, 1 << 16, follow=True))
    now = {kind: run.events_source for kind, run in shown.items() if run.events}
    keep = [file for kind, shots in SHOTS.items() for file, _, _ in shots
            if isinstance(taken, dict) and kind in now and taken.get(file) == now[kind]]
    return keep + [SOURCES] if keep else []


PDF_CSS = Path(__file__).with_name("pdf.css")  # the printed report's style
PAGE_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'"  # loads no file
# Chinese text needs no space where a source line was broken; beside full-width punctuation never. Inline tags
# (<strong>, <code>) beside the break are looked through: "。\n<strong>语" is "。<strong>语", not "。 语"
CJK = re.compile("[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")
CJK_PUNCT = re.compile("[\u3000-\u303f\uff00-\uffef\u2018-\u201d\u2026\u00b7]")
SOFT_BREAK = re.compile(r"([^\s>]?)((?:<[^>]+>)*)[ \t]*\n[ \t]*((?:<[^>]+>)*)([^\s<]?)")
# an image paragraph and the italic caption paragraph after it: kept on one page as one <figure>
FIGURE = re.compile(r"(<p><img [^>]*></p>)\s*(<p><em>(?:(?!</p>).)*</p>)", re.S)  # (never past its </p>)


def report_html(markdown_text):
    """report.md as the HTML Chromium prints: titled by its first H1, lines joined, figures kept whole."""
    import markdown

    def join(m):  # a soft break between Chinese characters or beside Chinese punctuation: none (a browser's space)
        left, right = m.group(1), m.group(4)
        cjk = CJK.match(left) and CJK.match(right) or CJK_PUNCT.match(left) or CJK_PUNCT.match(right)
        return "".join(m.group(1, 2)) + ("" if cjk else "\n") + "".join(m.group(3, 4))
    parts = re.split(r"(<pre[\s>].*?</pre>)", markdown.markdown(markdown_text, extensions=["tables", "fenced_code"]),
                     flags=re.S)  # <pre> blocks left as they are
    body = "".join(part if part.startswith("<pre") else SOFT_BREAK.sub(join, part) for part in parts)
    half = body.count("nvidia_smi_") > 1  # two terminal snapshots: side by side, each a PNG to zoom into
    body = FIGURE.sub(lambda m: ('<figure class="half">' if half and "nvidia_smi_" in m.group(1) else "<figure>")
                      + m.group(1) + m.group(2) + "</figure>", body)
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", body, re.S)
    title = html_lib.escape(html_lib.unescape(re.sub(r"<[^>]+>", "", h1.group(1))).strip()) if h1 else "report"
    return (f'<!doctype html><html lang="zh"><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
            f'content="{PAGE_POLICY}"><title>{title}</title>'
            f"<style>{PDF_CSS.read_text()}</style></head><body>{body}</body></html>")


def write_pdf(markdown_path, pdf_path, text):
    """`text` printed to pdf_path whole or not at all; a page needing no file (images in report.md's folder inlined)."""
    if not find_browser():
        raise BrowserError("--pdf needs Chromium (apt-get install chromium fonts-noto-cjk)")
    with tempfile.TemporaryDirectory(prefix="lab5-browser-") as folder:
        html, printed = Path(folder) / "report.html", Path(folder) / "report.pdf"
        html.write_text(inlined(report_html(text), markdown_path.parent))
        try:
            browser(Path(folder), "--no-pdf-header-footer", f"--print-to-pdf={printed}", html.as_uri())
            if not printed.is_file() or printed.stat().st_size == 0:
                raise BrowserError("Chromium wrote no PDF")
        except BrowserError as e:
            raise BrowserError(f"no {pdf_path}: {e}") from None
        files.write_atomic(pdf_path, printed.read_bytes())


def inlined(html, folder):
    """html with each <img src> naming an image file inside `folder` (links resolved) as a data: URL, its name kept as
    the fragment (pdf.css sizes some images by name); any other src stays, for the page's CSP to refuse."""
    root = os.path.realpath(folder)

    def inline(m):
        path = os.path.realpath(os.path.join(root, urllib.parse.unquote(html_lib.unescape(m.group(2)))))
        kind = mimetypes.guess_type(path)[0] or ""
        if not (kind.startswith("image/") and Path(path).is_relative_to(root) and os.path.isfile(path)):
            return m.group(0)
        data = base64.b64encode(Path(path).read_bytes()).decode()
        return f'{m.group(1)}"data:{kind};base64,{data}#{m.group(2)}"'
    return re.sub(r'(<img [^>]*src=)"([^"]*)"', inline, html)


def main(argv=None):
    parser = argparse.ArgumentParser(description="TensorBoard on 127.0.0.1 under a secret path, until Ctrl-C")
    parser.add_argument("--logdir", type=Path, default=Path("runs"), help="the runs to show (default: runs)")
    logdir = parser.parse_args(argv).logdir
    with serve_tensorboard(logdir) as url:
        if url is None:
            sys.exit(f"error: no TensorBoard events under {logdir} (the runs are under runs/)")
        where = urllib.parse.urlsplit(url)
        print(f"TensorBoard for you only: {url}/ (the path is the key; Ctrl-C stops it). On your laptop:\n"
              f"  ssh -N -L 127.0.0.1:6006:127.0.0.1:{where.port} {getpass.getuser()}@{os.uname().nodename}\n"
              f"then open http://127.0.0.1:6006{where.path}/", flush=True)  # (localhost: maybe another's [::1])
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
