"""TensorBoard as a student sees it: a real server on each run, Chromium's screenshots of its pages (SHOTS)
through a front that turns outlier-ignoring off, each cropped to its cards; SOURCES records which run each shows.
"""
import json
import urllib.parse

from data import files
from report import browser

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


def card_box(pixels):
    """(left, top, right, bottom) of the cards in the first section of a TensorBoard page: the white
    box right of the grey sidebar, below the "Tags matching" header's divider, down to the box's end."""
    import numpy as np
    white = (pixels == 255).all(axis=2)
    row = int(pixels.shape[0] * 0.6)
    xs = np.flatnonzero(white[row])
    if len(xs) == 0 or white[row, :xs[0]].any():
        raise ValueError("no white card box right of the sidebar")
    left, right = xs[0] + 1, xs[-1]
    across = white[:, left:right].mean(axis=1)  # rows of the box: white; its borders and divider: not
    top = np.argmax(across > 0.9)
    divider = top + np.argmax(across[top:] < 0.5)
    cards = divider + np.argmax(across[divider:] > 0.9)
    margin = white[cards:, left + 4]  # the box's left margin, white down to its bottom border
    bottom = cards + (np.argmax(~margin) if not margin.all() else len(margin))
    return left, cards, right, bottom


def crop_to_cards(path):
    """Crop a TensorBoard screenshot to its cards (no toolbar, sidebar, header or repeated sections),
    white margins trimmed to 12 px; None, or why the page did not look like TensorBoard's."""
    import numpy as np
    from PIL import Image
    try:
        image = Image.open(path).convert("RGB")
        left, top, right, bottom = card_box(np.asarray(image))
    except (OSError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
        return f"{path.name} left uncropped: {e}"
    cards = image.crop((left, top, right, bottom))
    dark = (np.asarray(cards) < 235).any(axis=2)  # text, lines, images: not the page's grey (245)
    ink, rows = np.flatnonzero(dark.any(axis=0)), np.flatnonzero(dark.any(axis=1))
    if len(ink) == 0:
        return f"{path.name} left uncropped: its card box is empty"
    pad = 12
    cards.crop((max(0, ink[0] - pad), max(0, rows[0] - pad), min(cards.width, ink[-1] + pad),
                min(cards.height, rows[-1] + pad))).save(path)
    return None


def tensorboard_screenshots(runs, out, problems):
    """Start a real TensorBoard server on each run and let Chromium photograph its pages, as a student
    sees them; the lines that show them. Only files Chromium really wrote are linked; after its first
    failure (an error exit, or a hang cut off at browser.BROWSER_TIMEOUT) no more are tried."""
    if not browser.find_browser():
        return ["- no TensorBoard screenshots: Chromium not found (`apt-get install chromium`)"]
    lines, taken = [], {}
    for run in runs:
        with browser.serve_tensorboard(run.events) as base:
            if base is None:
                problems.append(f"TensorBoard on {run.events_source} did not answer; no screenshots of it")
                continue
            if not run_screenshots(run, base, out, lines, problems, taken):
                break
    if taken:
        files.write_json(out / SOURCES, taken)
    return lines


def kept_screenshots(out, shown):
    """The screenshots in `out` a build without Chromium keeps: those SOURCES says were taken of the runs
    shown now ({kind: inputs.Run}); another run's are left out, never captioned as these."""
    try:
        taken = json.loads(files.read_small(out / SOURCES, 1 << 16, follow=True))
    except (OSError, ValueError):
        return []
    now = {kind: run.events_source for kind, run in shown.items() if run.events}
    keep = [file for kind, shots in SHOTS.items() for file, _, _ in shots
            if isinstance(taken, dict) and kind in now and taken.get(file) == now[kind]]
    return keep + [SOURCES] if keep else []


def run_screenshots(run, base, out, lines, problems, taken):
    """The SHOTS of one run, through a front that turns outlier-ignoring off (the full range of every
    curve is shown); False after Chromium failed."""
    with browser.storage_front(base, TENSORBOARD_SETTINGS) as front:
        for file, page, height in SHOTS.get(run.kind, []):
            target = urllib.parse.quote(f"/?darkMode=false#{page}", safe="")
            failure = browser.screenshot(f"{front}/lab5-storage?next={target}", out / file, SHOT_WIDTH, height,
                                         scale=SHOT_SCALE)
            if failure:
                problems.append(f"{failure}; no further screenshots tried")
                return False
            problems.extend(filter(None, [crop_to_cards(out / file)]))
            taken[file] = run.events_source
            lines.append(f"![TensorBoard: {page.split('&')[0]} of {run.events_source}]({file})")
    return True
