"""What make_report.py needs from outside Python: a TensorBoard server (serve_tensorboard, and storage_front,
which sets TensorBoard's localStorage-only "ignore outliers" off), headless Chromium's screenshots, and its
print-to-PDF of report.md. Every wait is bounded: a Chromium that hangs is killed with its whole process group
after BROWSER_TIMEOUT seconds, and the caller gets a reason in one line instead of an exception.
"""
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


class BrowserError(UserError):
    """Chromium failed, hung or wrote nothing: the message says which, in one line."""


def is_png(path):
    """A file a page may show: a PNG signature and more than a header (Chromium can leave 0 bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n" and Path(path).stat().st_size > 64
    except OSError:
        return False


def find_browser():
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_tensorboard(base, timeout=90):
    """Until the server lists at least one run with scalars: its HTTP API answered with data."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=5) as response:
                if json.loads(response.read()):
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


@contextlib.contextmanager
def serve_tensorboard(logdir):
    """A real TensorBoard server on logdir (127.0.0.1 only); yields its base URL, or None if it never answered."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        yield base if wait_for_tensorboard(base) else None
    finally:
        server.terminate()
        server.wait(timeout=30)


def front_handler(base, items):
    """Requests to the front: /lab5-storage?next=PATH answers a page that stores `items` and opens PATH;
    everything else is passed to base and its answer back."""
    script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in items.items())

    class Front(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/lab5-storage?"):
                target = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["next"][0]
                page = f"<script>{script}location.replace({json.dumps(target)});</script>"
                return self.reply(200, {"Content-Type": "text/html"}, page.encode())
            self.forward()

        def do_POST(self):
            self.forward()

        def forward(self):
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
    return Front


@contextlib.contextmanager
def storage_front(base, items):
    """A front for the server at base on another port of 127.0.0.1, so a browser's localStorage for it
    can be written before the page loads: TensorBoard reads settings such as "ignore outliers in chart
    scaling" (`_ignoreYOutliers`, on by default) from localStorage only, never from the URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), front_handler(base, items))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def browser(*args, timeout=None):
    """Headless Chromium with a fresh profile, quiet about the network it cannot reach. Its own process
    group, so a hung Chromium is killed with its renderer and GPU helpers (killing only the parent
    would leave them holding the terminal and the profile)."""
    timeout = BROWSER_TIMEOUT if timeout is None else timeout
    with tempfile.TemporaryDirectory() as profile:
        process = subprocess.Popen([find_browser(), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise BrowserError(f"Chromium did not finish within {timeout} s; killed") from None
        except BaseException:  # a Ctrl-C while it prints: it must not write on after make_report has exited
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if code != 0:
        raise BrowserError(f"Chromium exited with {code}")


def screenshot(url, path, width, height, scale=1):
    """Photograph url into path (PNG) with a window of width x height CSS px, `scale` device pixels
    each; None when it worked, else why not, in one line."""
    path.unlink(missing_ok=True)  # so an old file cannot pass for a new screenshot
    try:
        browser(f"--window-size={width},{height}", f"--force-device-scale-factor={scale}",
                "--virtual-time-budget=10000", f"--screenshot={path}", url)
    except BrowserError as e:
        return f"no screenshot {path.name}: {e}"
    if not path.is_file():
        return f"no screenshot {path.name}: Chromium wrote no file"
    if not is_png(path):
        path.unlink()
        return f"no screenshot {path.name}: Chromium wrote no PNG"
    return None


PDF_CSS = """
body { font-family: "Noto Sans CJK SC", "Noto Sans", sans-serif; font-size: 10pt; line-height: 1.45; margin: 0; }
h1 { font-size: 18pt; } h2 { font-size: 14pt; border-bottom: 1px solid #999; } h3 { font-size: 12pt; }
h1, h2, h3, h4 { break-after: avoid; }
img { max-width: 100%; max-height: 72mm; display: block; margin: 4px auto; }
img[src$="lenet_tensorboard_layers.png"] { max-height: 105mm; }  /* tall (4 cards): its digits readable */
img[src*="nvidia_smi_"] { max-height: 62mm; }  /* a terminal's text: legible smaller */
figure { margin: 0; break-inside: avoid; } figure p { margin: 4px 0; }
figure.half { display: inline-block; width: 49%; vertical-align: top; }
table { border-collapse: collapse; font-size: 8.5pt; margin: 6px 0; }
td, th { border: 1px solid #bbb; padding: 2px 5px; }
tr { break-inside: avoid; } thead { display: table-header-group; }
code, pre { font-family: "Noto Sans Mono CJK SC", monospace; font-size: 8.5pt; } pre { white-space: pre-wrap; }
blockquote { color: #444; border-left: 3px solid #bbb; margin-left: 0; padding-left: 10px; }
@page { size: A4; margin: 14mm 14mm; }
"""
# Chinese text needs no space where a source line was broken; beside full-width punctuation never. Inline tags
# (<strong>, <code>) beside the break are looked through: "。\n<strong>语" is "。<strong>语", not "。 语"
CJK = re.compile("[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")
CJK_PUNCT = re.compile("[\u3000-\u303f\uff00-\uffef\u2018-\u201d\u2026\u00b7]")
SOFT_BREAK = re.compile(r"([^\s>]?)((?:<[^>]+>)*)[ \t]*\n[ \t]*((?:<[^>]+>)*)([^\s<]?)")
# an image paragraph and the italic caption paragraph after it: kept on one page as one <figure>
FIGURE = re.compile(r"(<p><img [^>]*></p>)\s*(<p><em>(?:(?!</p>).)*</p>)", re.S)  # (never past its </p>)


def join_cjk_lines(html):
    """Soft line breaks between Chinese characters, or beside Chinese punctuation, removed (a browser
    would render them as spaces: "硬件、 PyTorch"); <pre> blocks left as they are."""
    parts = re.split(r"(<pre[\s>].*?</pre>)", html, flags=re.S)
    def join(m):
        left, right = m.group(1), m.group(4)
        cjk = CJK.match(left) and CJK.match(right) or CJK_PUNCT.match(left) or CJK_PUNCT.match(right)
        return "".join(m.group(1, 2)) + ("" if cjk else "\n") + "".join(m.group(3, 4))
    return "".join(part if part.startswith("<pre") else SOFT_BREAK.sub(join, part) for part in parts)


def report_html(markdown_text):
    """report.md as the HTML Chromium prints: titled by its first H1, lines joined, figures kept whole."""
    import markdown
    body = join_cjk_lines(markdown.markdown(markdown_text, extensions=["tables", "fenced_code"]))
    half = body.count("nvidia_smi_") > 1  # two terminal snapshots: side by side, each a PNG to zoom into
    body = FIGURE.sub(lambda m: ('<figure class="half">' if half and "nvidia_smi_" in m.group(1) else "<figure>")
                      + m.group(1) + m.group(2) + "</figure>", body)
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", body, re.S)
    title = html_lib.escape(html_lib.unescape(re.sub(r"<[^>]+>", "", h1.group(1))).strip()) if h1 else "report"
    return (f'<!doctype html><html lang="zh"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{PDF_CSS}</style></head><body>{body}</body></html>")


def write_pdf(markdown_path, pdf_path, text=None):
    """report.md (or `text`, its filled copy) -> HTML (python-markdown: tables, code) -> PDF by Chromium's
    print-to-pdf; Chinese text in Noto CJK (Debian's fonts-noto-cjk). The HTML sits beside report.md so
    figure links resolve. A failure is a BrowserError, one line."""
    if not find_browser():
        raise BrowserError("--pdf needs Chromium (apt-get install chromium fonts-noto-cjk)")
    text = markdown_path.read_text() if text is None else text
    with tempfile.NamedTemporaryFile("w", suffix=".html", prefix=".pdf-", dir=markdown_path.parent,
                                     delete=False) as html:
        html.write(report_html(text))
    html, pdf_path = Path(html.name), Path(pdf_path)
    # renamed over the old PDF once whole; a short name, whatever --pdf-out's length
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
    return pdf_path


