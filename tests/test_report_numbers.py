"""The committed report's numbers: each one a single rounding of one JSON field, re-read here from its file;
no result typed by hand into report.md; no stray space between Chinese characters; the committed PDF brief (its
pages, the GELU section in the body, each caveat said once) and holding the numbers the JSON gives."""
import html
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO
from report import browser, facts, make_report

CJK = "\u4e00-\u9fff\u3000-\u303f\uff00-\uffef"
# a measured result typed into report.md instead of filled: a decimal percentage, seconds, watts, tokens/s, a
# ratio (not a shape such as 5×5 or 64 × 1024); configuration (20%, 1e-3, 1200 万 token) is not caught
RESULT = re.compile(r"\d[\d,]*\.\d+\s*%|\d[\d,.]*\s*(?:s\b|ms\b|W\b|MHz|token/s|倍)|\d[\d,.]*\s*×(?!\s*(?:\d|token))")
NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?(e[-+]\d+)?\s*(%|s)?$")


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """The committed report's inputs and its filled text, as `make_report.py --pdf` builds them."""
    tmp = tmp_path_factory.mktemp("numbers")
    args = make_report.parse_args(["--out", str(tmp / "out")])
    inputs = make_report.gather(args)
    text, unfilled, used = facts.fill(make_report.check_args(args), inputs.sources)
    assert unfilled == []
    return inputs, text, used


def json_value(source, path):
    """A placeholder's field read again from its file: `report/results/x.json` or `...results.json: results.stem`."""
    file, _, entry = source.partition(": results.")
    value = json.loads((REPO / file).read_text())
    for part in ([("results"), entry] if entry else []) + path:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def test_each_number_is_one_rounding_of_one_json_field_read_again_from_its_file(committed):
    inputs, _, used = committed
    specs, checked = {}, 0
    for placeholder, shown, source in used:
        key, _, spec = placeholder.strip("{}").partition(":")
        name, *path = key.split(".")
        if path == ["_source"] or path[-1:] == ["table"]:
            continue
        specs.setdefault((source, tuple(path)), set()).add(spec)
        if source.split(":")[0].endswith(".json") and (REPO / source.split(":")[0]).is_file():
            if spec:
                assert format(json_value(source, path), spec) == shown, (placeholder, source)
                checked += 1
    assert checked >= 40  # the report's numbers come from files, and this reads them
    twice = {field: s for field, s in specs.items() if len(s) > 1}
    assert not twice, twice  # one field, one rounding: never "11 s" beside "12 s"


def test_no_measured_result_is_typed_into_report_md():
    prose = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|`[^`]*`", "", (REPO / "report" / "report.md").read_text(), flags=re.S)
    assert RESULT.findall(prose) == []
    assert RESULT.findall("训练 7.8 s，准确率 99.09%，快 1.41 倍，5×5 的卷积核，快 1.2×") == [
        "7.8 s", "99.09%", "1.41 倍", "1.2×"]  # what the check catches, and a shape it lets pass


def test_the_generated_tables_quote_the_headline_as_the_text_does(committed):
    inputs, text, _ = committed
    gpt, clock = inputs.sources["gpt"][0], inputs.sources["gpt_clock"][0]
    row = next(line for line in inputs.sources["gpu_runs"][0]["table"].splitlines() if line.startswith("| **"))
    assert f"| {clock['process_text']}" in row and f"| {gpt['final_train_loss']:.2f} / " in row
    assert f"**{clock['process_text']}**" in text and f"**{gpt['final_train_loss']:.2f}**" in text


def test_no_space_between_two_chinese_characters_in_the_rendered_report(committed):
    """A line break inside a Chinese sentence renders as a space; so would one beside an inline tag."""
    _, text, _ = committed
    page = browser.report_html(text)
    blocks = [html.unescape(re.sub(r"<[^>]+>", "", inner)).strip()
              for _, inner in re.findall(r"<(p|li|td|th|h[1-6])\b[^>]*>(.*?)</\1>", page, re.S)]
    stray = re.compile(f"[{CJK}][ \\t\\n]+[{CJK}]|[、，。：；][ \\t\\n]")  # (U+3000, a full-width space, is meant)
    assert len(blocks) > 40 and [b for b in blocks if stray.search(b)] == []
    joined = re.sub(r"<[^>]+>", "", browser.report_html("甲。\n**乙**丙\n丁子\n`默`认"))
    assert "甲。乙丙丁子默认" in joined and not stray.search(joined)  # breaks beside inline tags too


def pdf_text(*args):
    if not shutil.which("pdftotext"):
        if os.environ.get("LAB5_REQUIRE_BROWSER") == "1":
            pytest.fail("pdftotext required (LAB5_REQUIRE_BROWSER=1)")
        pytest.skip("no pdftotext (apt-get install poppler-utils)")
    return subprocess.run(["pdftotext", *args, str(REPO / "report" / "report.pdf"), "-"], capture_output=True,
                          text=True, check=True).stdout


def test_the_committed_pdf_is_brief_with_gelu_in_the_body_and_each_caveat_said_once():
    pages = pdf_text().split("\f")[:-1]
    appendix = next(i for i, page in enumerate(pages) if "附录（不属于正文）" in page)
    assert len(pages) <= 9 and appendix <= 5  # the body: at most 5 pages
    body = "".join(pages[:appendix])
    assert "5. 自定义 GELU 算子" in body and "附加题：自定义 GELU" not in "".join(pages)
    whole = "".join(pages)
    assert whole.count("较早") <= 3 and whole.count("推测") <= 1 and whole.count("2080Ti") <= 3


def test_the_committed_pdf_holds_the_numbers_the_json_gives(committed):
    """Rebuilt after every change of its inputs: a stale PDF (a run re-measured, the PDF not rebuilt) fails."""
    _, _, used = committed
    text = re.sub(r"\s", "", pdf_text())
    numbers = [shown for _, shown, _ in used if NUMBER.match(shown)]
    assert len(numbers) > 60
    missing = [n for n in numbers if re.sub(r"\s", "", n) not in text]
    assert missing == []
