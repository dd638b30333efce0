"""The test counts have one home, report/results/tests.json: the README and the results page quote the line made
from it word for word, and the README states no other count (a count typed by hand drifts: 477 against 490)."""
import json
import re

from conftest import REPO

TESTS_JSON = REPO / "report" / "results" / "tests.json"


def run_words(run):
    if run.get("passed") is None:
        return f"not measured ({run['why']})"
    return (f"**{run['passed']} passed**, {run['failed']} failed, {run['skipped']} skipped, {run['deselected']} "
            f"deselected in {run['seconds']:.0f} s")


def counts_line(t):
    """The sentence both pages carry: each count once, then where and when it was measured."""
    full, quick = t["full"], t["quick"]
    return (f"Whole suite (`{full['command']}`): {run_words(full)}; quick subset (`{quick['command']}`): "
            f"{run_words(quick)}. Commit {t['commit']}, {t['hardware']}, {t['date']}.")


def test_readme_and_the_results_page_quote_tests_json_and_nothing_else():
    t = json.loads(TESTS_JSON.read_text())
    line = counts_line(t)
    readme = (REPO / "README.md").read_text()
    results = (REPO / "report" / "results" / "README.md").read_text()
    assert line in readme and line in results
    outside = readme.replace(line, "")
    assert not re.search(r"\d+ (passed|skipped|deselected)", outside), "a test count in the README outside tests.json's"


def test_the_counts_line_says_what_the_json_says():
    t = {"full": {"command": "pytest tests", "passed": 12, "failed": 1, "skipped": 3, "deselected": 0, "seconds": 65.4},
         "quick": {"command": "pytest -m 'not slow' tests", "passed": None, "why": "no time"},
         "commit": "abc1234", "hardware": "a 2-core VM", "date": "2026-12-01"}
    assert counts_line(t) == (
        "Whole suite (`pytest tests`): **12 passed**, 1 failed, 3 skipped, 0 deselected in 65 s; quick subset "
        "(`pytest -m 'not slow' tests`): not measured (no time). Commit abc1234, a 2-core VM, 2026-12-01.")
