"""A real TensorBoard server photographed by headless Chromium (cropped to its cards), and Chromium's print-to-PDF.
Every wait is bounded: a hung Chromium is killed with its process group after BROWSER_TIMEOUT s (one line)."""
import contextlib
import html as html_lib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from data import files
from data.files import UserError

BROWSER_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
BROWSER_TIMEOUT = 120  # seconds; a screenshot takes ~5 s, a PDF ~10 s
SHOTS = {  # run kind -> [(file, TensorBoard page: dashboard & its tag filter, window height in CSS px)]: the
    # cards that matter, two a row in a 1,400 px window; the crop keeps the first section's cards only
    "lenet5": [("lenet_tensorboard_scalars.png", "scalars&tagFilter=loss%7Caccuracy&_smoothingWeight=0", 900),
               ("lenet_tensorboard_layers.png", "images&tagFilter=layers", 1100)],
    "gpt": [("gpt_tensorboard_scalars.png", "scalars&tagFilter=train%2Floss%7Cval%2Floss%7Ctokens_per_second"
                                            "&_smoothingWeight=0", 900)],
}
SHOT_WIDTH, SHOT_SCALE = 1400, 2  # CSS px, device pixels per CSS px: tick labels legible at print size
TENSORBOARD_SETTINGS = {"_ignoreYOutliers": "false"}  # localStorage: every point inside the y range
SOURCES = "screenshots.json"  # in --out: {screenshot file: the run folder whose events it shows}


class BrowserError(UserError):
    """Chromium failed, hung or wrote nothing: the message says which, in one line."""


def is_png(path):
    """A PNG signature and more than a header (Chromium can leave 0 bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n" and Path(path).stat().st_size > 64
    except OSError:
        return False


def find_browser():
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@contextlib.contextmanager
def serve_tensorboard(logdir):
    """A real TensorBoard server on logdir (127.0.0.1); its URL once it lists scalars, None if not within 90 s."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base, deadline = f"http://127.0.0.1:{port}", time.time() + 90
    try:
        while time.time() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/data/plugin/scalars/tags",
                                                                      timeout=5) as answer:
                if json.loads(answer.read()):
                    break
            time.sleep(0.5)
        else:
            base = None
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def storage_front(base, items):
    """A front for the server at base: /lab5-storage?next=PATH stores `items` in localStorage, then opens PATH.
    TensorBoard reads "ignore outliers" (`_ignoreYOutliers`, on by default) from localStorage only, not the URL."""
    script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in items.items())

    class Front(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/lab5-storage?"):
                target = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["next"][0]
                page = f"<script>{script}location.replace({json.dumps(target)});</script>"
                return self.reply(200, {"Content-Type": "text/html"}, page.encode())
            self.do_POST()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "x-xsrf-protected")}
            request = urllib.request.Request(base + self.path, data=body, method=self.command, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    self.reply(answer.status, answer.headers, answer.read())
            except urllib.error.HTTPError as e:
                self.reply(e.code, e.headers, e.read())

        def reply(self, status, headers, body):
            self.send_response(status)
            for key in ("Content-Type", "Content-Encoding"):
                if headers.get(key):
                    self.send_header(key, headers[key])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet: the report's own output is what matters
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def browser(*args):
    """Headless Chromium with a fresh profile, in its own process group: a hung one is killed with its helpers."""
    with tempfile.TemporaryDirectory() as profile:
        process = subprocess.Popen([find_browser(), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=BROWSER_TIMEOUT)
        except BaseException as e:  # a hang, or a Ctrl-C while it prints: it must not write on after we exit
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if isinstance(e, subprocess.TimeoutExpired):
                raise BrowserError(f"Chromium did not finish within {BROWSER_TIMEOUT} s; killed") from None
            raise
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
    except (OSError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
        return f"{path.name} left uncropped: {e}"
    dark = (np.asarray(cards) < 235).any(axis=2)  # text, lines, images: not the page's grey (245)
    ink, rows = np.flatnonzero(dark.any(axis=0)), np.flatnonzero(dark.any(axis=1))
    if len(ink) == 0:
        return f"{path.name} left uncropped: its card box is empty"
    cards.crop((max(0, ink[0] - 12), max(0, rows[0] - 12), min(cards.width, ink[-1] + 12),
                min(cards.height, rows[-1] + 12))).save(path)
    return None


def tensorboard_screenshots(runs, out, problems):
    """Each run's SHOTS through the front, as a student sees them, and their lines; none after a failure."""
    if not find_browser():
        return ["- no TensorBoard screenshots: Chromium not found (`apt-get install chromium`)"]
    lines, taken = [], {}
    try:
        for run in runs:
            with serve_tensorboard(run.events) as base, storage_front(base, TENSORBOARD_SETTINGS) as front:
                if base is None:
                    problems.append(f"TensorBoard on {run.events_source} did not answer; no screenshots of it")
                    continue
                for file, page, height in SHOTS.get(run.kind, []):
                    path, target = out / file, urllib.parse.quote(f"/?darkMode=false#{page}", safe="")
                    path.unlink(missing_ok=True)  # so an old file cannot pass for a new screenshot
                    browser(f"--window-size={SHOT_WIDTH},{height}", f"--force-device-scale-factor={SHOT_SCALE}",
                            "--virtual-time-budget=10000", f"--screenshot={path}",
                            f"{front}/lab5-storage?next={target}")
                    if not is_png(path):
                        raise BrowserError(f"Chromium wrote no {'PNG' if path.is_file() else 'file'}")
                    problems.extend(filter(None, [crop_to_cards(path)]))
                    taken[file] = run.events_source
                    lines.append(f"![TensorBoard: {page.split('&')[0]} of {run.events_source}]({file})")
    except BrowserError as e:  # (raised by a screenshot: `file` and `path` are its)
        path.unlink(missing_ok=True)
        problems.append(f"no screenshot {file}: {e}; no further screenshots tried")
    if taken:
        files.write_json(out / SOURCES, taken)
    return lines


def kept_screenshots(out, shown):
    """The screenshots in `out` that SOURCES says show the runs shown now ({kind: inputs.Run})."""
    try:
        taken = json.loads(files.read_small(out / SOURCES, 1 << 16, follow=True))
    except (OSError, ValueError):
        return []
    now = {kind: run.events_source for kind, run in shown.items() if run.events}
    keep = [file for kind, shots in SHOTS.items() for file, _, _ in shots
            if isinstance(taken, dict) and kind in now and taken.get(file) == now[kind]]
    return keep + [SOURCES] if keep else []


PDF_CSS = Path(__file__).with_name("pdf.css")  # the printed report's style
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
    return (f'<!doctype html><html lang="zh"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{PDF_CSS.read_text()}</style></head><body>{body}</body></html>")


def write_pdf(markdown_path, pdf_path, text):
    """`text` printed to pdf_path whole or not at all; the HTML beside report.md so figure links resolve."""
    if not find_browser():
        raise BrowserError("--pdf needs Chromium (apt-get install chromium fonts-noto-cjk)")
    with tempfile.NamedTemporaryFile("w", suffix=".html", prefix=".pdf-", dir=markdown_path.parent,
                                     delete=False) as html:
        html.write(report_html(text))
    html = Path(html.name)
    printed = pdf_path.parent / f".make_report-{os.getpid()}.pdf"
    try:
        browser("--no-pdf-header-footer", f"--print-to-pdf={printed}", html.resolve().as_uri())
        if not printed.is_file() or printed.stat().st_size == 0:
            raise BrowserError("Chromium wrote no PDF")
        printed.chmod(0o666 & ~files.UMASK)
        printed.replace(pdf_path)
    except BrowserError as e:
        raise BrowserError(f"no {pdf_path}: {e}") from None
    finally:
        html.unlink()
        printed.unlink(missing_ok=True)
