"""report/make_report.py builds from one named set of inputs: runs only when named, the report's
placeholders from the same files, damaged inputs named in one line, --out never half-written."""
import ast
import json
import math
import subprocess
import sys

import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import REPO
from report import make_report


def lenet_metrics(accuracy):
    return {"act": "torch", "test_accuracy": accuracy, "test_loss": 0.05, "epochs": 2, "train_seconds": 1.5,
            "device": "cpu", "params": 44426, "steps": 4, "train_loss_curve": [[1, 2.0], [4, 0.5]],
            "history": [{"epoch": 1, "test_loss": 0.1, "test_accuracy": accuracy - 0.01},
                        {"epoch": 2, "test_loss": 0.05, "test_accuracy": accuracy}]}


@pytest.fixture
def committed(tmp_path):
    """A results folder with the committed default LeNet run, and a report using its numbers."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "lenet_run_2x128_cpu.json").write_text(json.dumps(lenet_metrics(0.9876)))
    report = tmp_path / "report.md"
    report.write_text("# R\n\nAccuracy {{ lenet.test_accuracy|f('.2%') }} after {{ lenet.epochs }} epochs.\n")
    return results, report


def own_run(tmp_path, accuracy=0.4321):
    """A student's own tiny run: metrics.json, args.json and an event file, under a runs/ tree."""
    run = tmp_path / "runs" / "lenet5" / "mine"
    run.mkdir(parents=True)
    (run / "args.json").write_text("{}")
    (run / "metrics.json").write_text(json.dumps(lenet_metrics(accuracy)))
    writer = SummaryWriter(run)
    for step, value in ((1, 0.2), (4, accuracy)):
        writer.add_scalar("test/accuracy", value, step)
    writer.close()
    return run


def build(tmp_path, results, report, *extra):
    out = tmp_path / "out"
    make_report.main(["--results", str(results), "--report", str(report), "--out", str(out), "--no-screenshots",
                      *extra])
    return out, (out / "results.md").read_text()


def snapshot(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*"))}


def test_a_run_lying_under_runs_is_ignored_unless_named(tmp_path, committed, monkeypatch):
    results, report = committed
    own_run(tmp_path)
    monkeypatch.chdir(tmp_path)  # runs/ right where a student would have it
    before = snapshot(results)
    out, text = build(tmp_path, results, report)
    assert "99.88%" not in text and "98.76%" in text and "43.21%" not in text
    assert "Accuracy 98.76% after 2 epochs." in (out / "report_filled.md").read_text()
    assert "- `{{lenet.test_accuracy:.2%}}` -> 98.76% -> `" in text
    assert snapshot(results) == before  # nothing written under the inputs


@pytest.mark.parametrize("how", ["positional", "runs-root"])
def test_a_named_run_shows_its_numbers_in_tables_and_placeholders(tmp_path, committed, how):
    results, report = committed
    run = own_run(tmp_path)
    before = snapshot(results)
    named = [str(run)] if how == "positional" else ["--runs-root", str(tmp_path / "runs")]
    out, text = build(tmp_path, results, report, *named)
    alias = text.split("## LeNet-5")[1].split("## GPT-2")[0]
    assert f"`{run}`" in alias and "98.76%" not in text
    assert "Accuracy 43.21% after 2 epochs." in (out / "report_filled.md").read_text()
    assert f"-> 43.21% -> `{run}/metrics.json`" in text
    assert snapshot(results) == before


def test_an_unknown_placeholder_is_a_problem_line_and_refuses_the_pdf(tmp_path, committed, capsys):
    results, report = committed
    report.write_text("# R\n\n{{ lenet.nope }} and {{ nosuch.x|f('.1f') }}\n")
    out, text = build(tmp_path, results, report)
    assert "report placeholder {{lenet.nope}}: " in text and "has no 'nope'" in text
    assert "report placeholder {{nosuch.x}}: no input named 'nosuch'" in text
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        make_report.main(["--results", str(results), "--report", str(report), "--out", str(tmp_path / "o2"), "--pdf",
                          "--pdf-out", str(tmp_path / "r.pdf")])
    assert str(exit_.value).startswith("error: report placeholder {{lenet.nope}}") and "\n" not in str(exit_.value)
    assert not (tmp_path / "o2").exists() and not (tmp_path / "r.pdf").exists()  # refused before any work


def test_a_report_without_placeholders_is_rendered_as_written(tmp_path, committed):
    results, report = committed
    report.write_text("# R\n\nNo numbers {here}.\n")
    text, problems, used = make_report.facts.fill(report.read_text(), {})
    assert (text, problems, used) == (report.read_text(), [], [])
    out, _ = build(tmp_path, results, report)
    assert not (out / "report_filled.md").exists()


def test_a_nan_accuracy_is_never_printed_as_nan_percent(tmp_path, committed):
    results, report = committed
    (results / "lenet_run_x_cpu.json").write_text(json.dumps(lenet_metrics(math.nan)))  # Python writes NaN
    (results / "lenet_run_y_cpu.json").write_text(json.dumps(lenet_metrics(1.0)).replace("1.0,", "1e999,", 1))
    out, text = build(tmp_path, results, report)
    assert "nan%" not in text.lower() and "inf%" not in text.lower()
    assert f"unreadable {results / 'lenet_run_x_cpu.json'}: NaN is not a number a table can print" in text
    assert f"unreadable {results / 'lenet_run_y_cpu.json'}: 1e999 is not a number a table can print" in text


def test_a_null_accuracy_in_a_named_run_is_named_not_tabled(tmp_path, committed):
    results, report = committed
    run = own_run(tmp_path)
    (run / "metrics.json").write_text(json.dumps(lenet_metrics(0.5) | {"test_accuracy": None}))
    out, text = build(tmp_path, results, report, str(run))
    assert f"left out {run}: metrics.json has 'test_accuracy': null, not a number" in text


# --------------------------------------------------------------------- a damaged GPU results folder

def gpu_folder(results, results_json):
    """The newest GPU folder: a snapshot it could draw, and its results.json's facts given as text."""
    folder = results / "gpu-new"
    folder.mkdir(parents=True)
    (folder / "nvidia-smi-during-lenet-torch.txt").write_text("| NVIDIA-SMI |\n" * 3)
    (folder / "results.json").write_text(results_json)
    return folder


@pytest.mark.parametrize("damage, results_json", [
    ("results.json is not gpu_check.sh's (TypeError: a JSON list, not an object)", "[1, 2]"),
    ("results.json is not gpu_check.sh's (JSONDecodeError: Unterminated string", '{"started_utc": "2026-12-02T06:5')])
def test_a_damaged_gpu_folder_is_one_problem_line_and_its_slots_missing(tmp_path, committed, capsys, damage,
                                                                         results_json):
    results, report = committed
    report.write_text("![a](generated/nvidia_smi_lenet.png)\n![b](generated/nvidia_smi_gpt.png)\n")
    folder = gpu_folder(results, results_json)
    out, text = build(tmp_path, results, report)
    problems = [line for line in text.splitlines() if f"GPU results folder {folder}" in line]
    assert len(problems) == 1 and damage in problems[0], problems
    for slot in ("nvidia_smi_lenet.png", "nvidia_smi_gpt.png"):
        assert f"- `{slot}` (" in text and f"the folder {folder} is damaged" in text
        assert not (out / slot).exists()
    assert "Traceback" not in capsys.readouterr().err


# --------------------------------------------------------------------- --out and the PDF's images

def test_a_build_that_fails_leaves_the_old_out_whole(tmp_path, committed, monkeypatch):
    results, report = committed
    out, _ = build(tmp_path, results, report)
    before = snapshot(out)
    monkeypatch.setattr(make_report, "run_lines", lambda *a: 1 / 0)  # a failure half-way through the figures
    with pytest.raises(ZeroDivisionError):
        build(tmp_path, results, report)
    assert snapshot(out) == before and [p.name for p in tmp_path.glob(".make_report-*")] == []


def test_an_out_folder_the_report_did_not_write_is_refused(tmp_path, committed):
    results, report = committed
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    for out, why in ((tmp_path / "mine", "is not a folder this program wrote"), (results / "gen", "overlap")):
        with pytest.raises(SystemExit) as exit_:
            make_report.main(["--results", str(results), "--report", str(report), "--out", str(out)])
        assert why in str(exit_.value)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "keep me" and not (results / "gen").exists()


def test_an_empty_or_foreign_image_never_goes_into_the_pdf(tmp_path, committed):
    results, report = committed
    built = tmp_path / "built"
    built.mkdir()
    (built / "empty.png").write_bytes(b"")
    (built / "fake.png").write_text("<html>not a picture</html>")
    from PIL import Image
    Image.new("RGB", (40, 40)).save(built / "good.png")
    problems = []
    text = make_report.images("![e](generated/empty.png) ![f](generated/fake.png) ![g](generated/good.png)",
                              built, problems)
    assert "figure missing: `generated/empty.png`" in text and "figure missing: `generated/fake.png`" in text
    assert "![g](good.png)" in text  # beside the filled report, where it is printed from
    assert problems == [f"report image generated/{n}.png is missing, empty or not a PNG; left out of the PDF"
                        for n in ("empty", "fake")]


# --------------------------------------------------------------------- the package

def test_report_never_imports_a_top_level_script():
    scripts = {p.stem for p in REPO.glob("*.py")}
    for path in (REPO / "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not {n.split(".")[0] for n in names} & scripts, (path.name, names)


def test_the_script_runs_from_anywhere_and_an_error_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "report" / "make_report.py"), "--gpu", str(tmp_path / "none"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr == f"error: --gpu {tmp_path / 'none'} is not a folder\n"


def test_gpu_checks_report_step_fills_the_students_template_from_its_results_without_warnings(tmp_path, capsys):
    """gpu_check.sh's report step names its runs (--runs-root) and results: report/student.md is built from those
    alone, what they hold filled, every other section a visible gap, and no placeholder left unfilled."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    results.mkdir()
    runs.mkdir()
    (results / "gpt_bench_rehearsal_cpu.json").write_text(json.dumps({
        "device_name": "rehearsal cpu", "micro_batch": 1, "seq_len": 16, "vocab_size": 64, "repeats": 1,
        "rungs": [{"name": "naive: x", "tokens_per_second": 123.0},
                  {"name": "+ y (= default)", "tokens_per_second": 456.0}]}))
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(runs), "--results", str(results), "--out", str(out), "--no-screenshots"])
    filled = (out / "report_filled.md").read_text()
    assert "| + y (= default) | 456（×3.71） |" in filled and "rehearsal cpu" in filled
    assert filled.count("**待补**") >= 5 and "{{" not in filled  # LeNet-5, GPT, GPU, screenshots, GELU: gaps
    assert "report placeholder" not in capsys.readouterr().err
