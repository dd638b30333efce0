"""report/make_report.py on runs the tests make: figures, tables that match the inputs, missing and corrupt inputs."""
import json
import os
import shutil

import pytest
from torch.utils.tensorboard import SummaryWriter

import gpt_train
import lenet5
from conftest import REPO, tiny_args, write_tiny_mnist
from report import browser, figures, inputs, make_report


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """A real tiny LeNet-5 run and a real tiny GPT run, plus a benchmark JSON, in a runs/ layout."""
    root = tmp_path_factory.mktemp("report")
    mnist = write_tiny_mnist(root / "mnist", n_train=300, n_test=100)
    lenet5.main(["--data-dir", str(mnist), "--no-download", "--epochs", "2", "--batch-size", "50",
                 "--log-every", "2", "--device", "cpu", "--out-dir", str(root / "runs" / "lenet5" / "a")])
    corpus = request.getfixturevalue("corpus")
    gpt_train.main(tiny_args(corpus, root / "runs" / "gpt" / "b", "--tokens", str(20 * 8 * 32)))
    results = root / "results"
    results.mkdir()
    (results / "gpt_bench_test.json").write_text(json.dumps({
        "device_name": "test cpu", "micro_batch": 2, "seq_len": 64, "vocab_size": 512,
        "rungs": [{"name": "naive", "tokens_per_second": 100.0, "ms_per_step": 1280.0, "mfu": None, "speedup": 1.0},
                  {"name": "+ everything", "tokens_per_second": 450.0, "ms_per_step": 284.4, "mfu": None,
                   "speedup": 4.5}]}))
    return root


GPU_SLOTS = ("gpu_utilization.png", "nvidia_smi_gpt.png", "nvidia_smi_lenet.png")


def linking(tmp_path, *figures):
    """A report.md of the test's own linking `figures`: a build draws only the figures its report links."""
    report = tmp_path / "links.md"
    report.write_text("".join(f"![{name}](generated/{name})\n" for name in figures))
    return str(report)


@pytest.mark.slow  # the module's real tiny runs (screenshots: test_tensorboard_screenshots_...)
def test_figures_and_numbers_match_the_runs(runs, tmp_path):
    """The newest runs under --runs-root and a results folder named: their curves drawn, their numbers (and the
    ladder's rows) in the filled report, each results file listed by its placeholder name."""
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(runs / "runs"), "--results", str(runs / "results"), "--out", str(out),
                      "--no-screenshots"])
    data = (out / "gpt_curves.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 500
    text, filled = (out / "results.md").read_text(), (out / "report_filled.md").read_text()
    lenet = json.loads((runs / "runs" / "lenet5" / "a" / "metrics.json").read_text())
    gpt = json.loads((runs / "runs" / "gpt" / "b" / "metrics.json").read_text())
    assert f"测试准确率 **{lenet['test_accuracy']:.2%}**，测试损失 {lenet['test_loss']:.4f}" in filled
    assert f"训练损失 **{gpt['final_train_loss']:.2f}**" in filled and f"{gpt['tokens_seen']:,} 个 token" in filled
    assert "| + everything | 450（×4.50） |" in filled  # the results folder's ladder
    assert f"- `{runs / 'results' / 'gpt_bench_test.json'}`: placeholders `{{{{gpt_bench_test.…}}}}`" in text
    assert "no GPU utilisation recorded" in text  # CPU runs: said, not drawn


def test_missing_runs_are_named_and_exit_0(tmp_path):
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(tmp_path / "runs"), "--results", str(tmp_path / "none"), "--out", str(out)])
    text = (out / "results.md").read_text()
    assert f"no LeNet-5 run found under {tmp_path / 'runs' / 'lenet5'}" in text
    assert f"no GPT run found under {tmp_path / 'runs' / 'gpt'}" in text
    assert f"no results files found in {tmp_path / 'none'}" in text and not list(out.glob("*.png"))


@pytest.mark.slow  # the module's real tiny runs
def test_corrupt_event_file_is_reported_not_fatal(runs, tmp_path, capsys):
    run = tmp_path / "lenet"
    run.mkdir()
    (run / "metrics.json").write_text((runs / "runs" / "lenet5" / "a" / "metrics.json").read_text())
    writer = SummaryWriter(run)
    writer.add_scalar("accuracy/test", 0.5, 1)
    writer.close()
    (run / "events.out.tfevents.0.broken").write_bytes(b"\x00garbage, not a record" * 10)
    out = tmp_path / "out"
    make_report.main([str(run), "--results", str(tmp_path / "none"), "--out", str(out), "--no-screenshots"])
    text = (out / "results.md").read_text()
    assert "corrupt event file" in text and "events.out.tfevents.0.broken" in text
    assert f"): `{run}`" in text  # the run is still reported
    assert "corrupt event file" in capsys.readouterr().err


@pytest.mark.slow  # the module's real tiny runs
def test_a_newer_broken_run_is_named_not_silently_replaced(runs, tmp_path, capsys):
    root, broken = newer_run_beside(runs, tmp_path, '{"test_accuracy": 0.9')  # cut off mid-write
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(root), "--results", str(tmp_path / "none"), "--out", str(out),
                      "--no-screenshots"])
    text = (out / "results.md").read_text()
    assert f"skipped the newer run {broken}: unreadable metrics.json" in text
    assert f"): `{root / 'lenet5' / 'a'}`" in text  # the older, readable run is the one reported
    assert "skipped the newer run" in capsys.readouterr().err


@pytest.mark.slow  # Chromium screenshots of real runs
def test_tensorboard_screenshots_from_a_real_server_and_browser(runs, tmp_path):
    import numpy as np
    from PIL import Image, ImageStat
    if not browser.find_browser():
        if os.environ.get("LAB5_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium required (LAB5_REQUIRE_BROWSER=1)")
        pytest.skip("no Chromium (apt-get install chromium)")
    out = tmp_path / "out"
    make_report.main([str(runs / "runs" / "lenet5" / "a"), str(runs / "runs" / "gpt" / "b"), "--results",
                      str(runs / "results"), "--out", str(out)])
    text = (out / "results.md").read_text()
    shots = sorted(out.glob("*tensorboard*.png"))
    assert [p.name for p in shots] == ["gpt_tensorboard_scalars.png", "lenet_tensorboard_layers.png",
                                       "lenet_tensorboard_scalars.png"]
    for shot in shots:
        image = Image.open(shot).convert("L")
        stat = ImageStat.Stat(image)
        assert image.width >= 1000 and stat.stddev[0] > 10, shot  # rendered cards, not a blank page
        assert f"]({shot.name})" in text
        pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        orange = (np.abs(pixels - (245, 124, 0)).sum(axis=2) < 30).mean(axis=1)
        assert (orange > 0.5).sum() < 30, shot  # cropped: not the toolbar's ~110 orange rows (a step slider: ~8)
        assert not (pixels[:, :40] == 245).all(axis=(0, 2)).any(), shot  # nor the grey sidebar at the left
    assert "did not answer" not in text and "uncropped" not in text
    # a rebuild without Chromium keeps the screenshots of the runs it shows, and only those
    before = {p.name: p.read_bytes() for p in shots}
    make_report.main([str(runs / "runs" / "lenet5" / "a"), str(runs / "runs" / "gpt" / "b"), "--results",
                      str(runs / "results"), "--out", str(out), "--no-screenshots"])
    assert {p.name: p.read_bytes() for p in out.glob("*tensorboard*.png")} == before
    other = tmp_path / "another-lenet-run"  # (a copy: another folder, as a student's second run)
    shutil.copytree(runs / "runs" / "lenet5" / "a", other)
    make_report.main([str(other), str(runs / "runs" / "gpt" / "b"), "--results", str(runs / "results"), "--out",
                      str(out), "--no-screenshots"])
    assert sorted(p.name for p in out.glob("*tensorboard*.png")) == ["gpt_tensorboard_scalars.png"]


def test_every_image_link_in_the_report_resolves(tmp_path):
    """Every figure the committed report shows (the blocks its committed inputs keep) is in report/generated/."""
    import re
    report = REPO / "report" / "report.md"
    args = make_report.parse_args(["--out", str(tmp_path / "out")])
    inputs = make_report.gather(args)
    filled = make_report.facts.fill(make_report.check_args(args), inputs.sources)[0]
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", filled)
    assert len(links) >= 5  # nvidia-smi, its snapshot, three TensorBoard screenshots
    for link in links:
        assert (report.parent / link).is_file(), link


def test_pdf_has_the_chinese_text_and_the_accuracy(tmp_path):
    import subprocess
    if not browser.find_browser() or not shutil.which("pdftotext"):
        if os.environ.get("LAB5_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium and pdftotext required (LAB5_REQUIRE_BROWSER=1)")
        pytest.skip("no Chromium or pdftotext (apt-get install chromium fonts-noto-cjk poppler-utils)")
    from report import facts
    report = REPO / "report" / "report.md"
    args = make_report.parse_args(["--out", str(tmp_path / "out")])
    inputs = make_report.gather(args)
    filled, unfilled, used = facts.fill(make_report.check_args(args), inputs.sources)
    assert unfilled == []
    pdf = tmp_path / "report.pdf"
    browser.write_pdf(report, pdf, filled)
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "实验报告" in text and "神经网络" in text and "{{" not in text
    accuracies = [shown for placeholder, shown, _ in used if "accuracy" in placeholder and shown.endswith("%")]
    assert accuracies and all(a in text.replace("\n", "") for a in accuracies)  # the JSON's numbers, in the PDF


SMI_HEADER = "timestamp, utilization.gpu [%], utilization.memory [%], memory.used [MiB], power.draw [W]\n"


def smi_csv(start_minute, utils):
    return SMI_HEADER + "".join(f"2026/12/0{start_minute} 07:00:{i:02d}.000, {u} %, 40 %, 20000 MiB, {100 + 3 * u} W\n"
                                for i, u in enumerate(utils))


def smi_snapshot(gpu, util):
    return ("+----------------------+\n| NVIDIA-SMI 580.00     Driver Version: 580.00 |\n"
            f"|   0  {gpu}                    On  |\n"
            f"|  45C  P0  300W / 700W |  20000MiB / 143771MiB |  {util}%  Default |\n")


def test_gpu_slots_are_filled_from_the_newest_gpu_folder(tmp_path, capsys):
    results = tmp_path / "results"
    older = results / "h200-old"
    older.mkdir(parents=True)
    (older / "results.json").write_text(json.dumps({"started_utc": "2026-11-30"}))
    (older / "smi-gpt-12M-cold.csv").write_text(smi_csv(1, [0, 50, 97, 98]))
    (older / "nvidia-smi-during-gpt-12M-cold.txt").write_text(smi_snapshot("NVIDIA H200", 97))
    newer = results / "gpu-new"  # gpu_check.sh's OUT as --gpu unpacks it: results.json's facts beside its files
    newer.mkdir()
    (newer / "nvidia-smi-gpt-cold.csv").write_text(smi_csv(2, [0, 100, 100, 100, 0]))
    (newer / "nvidia-smi-during-gpt-cold.txt").write_text(smi_snapshot("NVIDIA GeForce RTX 2080 Ti", 99))
    (newer / "nvidia-smi-during-lenet-cpp.txt").write_text(smi_snapshot("NVIDIA GeForce RTX 2080 Ti", 12))
    (newer / "nvidia-smi-during-lenet-torch.txt").write_text(smi_snapshot("NVIDIA GeForce RTX 2080 Ti", 15))
    (newer / "gpt_bench_NVIDIA_2080.json").write_text(json.dumps(ladder_json("2080 Ti")))
    (newer / "results.json").write_text(json.dumps({"started_utc": "2026-12-02T06:59:00Z", "steps": []}))
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(tmp_path / "none"), "--results", str(results), "--out", str(out),
                      "--no-screenshots", "--report", linking(tmp_path, *GPU_SLOTS)])
    text = (out / "results.md").read_text()
    assert f"GPU folders, first answering first: `{newer}`, `{older}`." in text
    assert f"(gpu_utilization.png) from `nvidia-smi-gpt-cold.csv` in `{newer}`" in text  # the newer answers
    assert "(nvidia_smi_gpt.png) from `nvidia-smi-during-gpt-cold.txt`" in text
    assert "(nvidia_smi_lenet.png) from `nvidia-smi-during-lenet-torch.txt`" in text  # --act torch's, not cpp's
    assert "placeholders `{{gpt_bench_NVIDIA_2080.…}}`" in text and "{{results.…}}" not in text  # (its facts)
    for slot in GPU_SLOTS:
        assert (out / slot).read_bytes().startswith(b"\x89PNG"), slot
    assert f"in `{older}`" not in text  # every question the newer folder answers: never the older's figure
    assert "GPU figure missing" not in capsys.readouterr().out


def test_without_gpu_results_each_slot_names_the_command_that_fills_it(tmp_path, capsys):
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(tmp_path / "none"), "--results", str(tmp_path / "none"), "--out", str(out),
                      "--no-screenshots", "--report", linking(tmp_path, *GPU_SLOTS)])  # every slot
    text, printed = (out / "results.md").read_text(), capsys.readouterr().out
    for slot, steps in (("gpu_utilization.png", "tokenizer,gpt-own-vocab,lenet-torch"),
                        ("nvidia_smi_gpt.png", "tokenizer,gpt-own-vocab"),
                        ("nvidia_smi_lenet.png", "lenet-torch")):
        line = next(line for line in text.splitlines() if line.startswith(f"- `{slot}`"))
        assert f"no GPU results; fill it with `bash benchmarks/gpu_check.sh --only {steps} --out" in line
        assert line.removeprefix("- ") in printed
        assert not (out / slot).exists()


def test_gpu_check_logs_folder_fills_the_slots_and_its_results_are_listed(tmp_path):
    """gpu_check.sh's own report step: --gpu-logs LOGS with the results in another folder."""
    logs, results = tmp_path / "logs", tmp_path / "results"
    logs.mkdir()
    results.mkdir()
    (logs / "nvidia-smi-gpt-cold.csv").write_text(smi_csv(1, [0, 97]))
    (logs / "nvidia-smi-during-lenet-torch.txt").write_text(smi_snapshot("NVIDIA H200", 15))
    (results / "gpt_bench_NVIDIA_H200.json").write_text(json.dumps(ladder_json("H200")))
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(tmp_path / "none"), "--results", str(results), "--out", str(out),
                      "--gpu-logs", str(logs), "--no-screenshots", "--report", linking(tmp_path, *GPU_SLOTS)])
    text = (out / "results.md").read_text()
    assert "(gpu_utilization.png) from `nvidia-smi-gpt-cold.csv`" in text
    assert f"- `{results / 'gpt_bench_NVIDIA_H200.json'}`: placeholders `{{{{gpt_bench_NVIDIA_H200.…}}}}`" in text
    assert "- `nvidia_smi_gpt.png` (nvidia-smi during GPT training): no file like" in text


# --------------------------------------------------------------------- inputs that must not break the report

def newer_run_beside(runs, tmp_path, metrics_text):
    """A copy of the runs with a newer LeNet-5 run whose metrics.json is metrics_text."""
    root = tmp_path / "runs"
    shutil.copytree(runs / "runs", root)
    newer = root / "lenet5" / "z-newer"
    newer.mkdir()
    (newer / "args.json").write_text("{}")
    (newer / "metrics.json").write_text(metrics_text)
    older = root / "lenet5" / "a" / "args.json"
    os.utime(older, (older.stat().st_mtime - 100, older.stat().st_mtime - 100))
    return root, newer


@pytest.mark.parametrize("metrics_text, reason", [("[1, 2]", "is a JSON list, not an object"),
                                                  ("{}", "is neither a LeNet-5 run"),
                                                  ('{"act": "torch", "test_accuracy": "0.99"}',
                                                   "has 'test_accuracy': \"0.99\", not a number"),
                                                  ('{"act": "torch", "test_accuracy": "<iframe src=x>"}',  # no HTML
                                                   "has 'test_accuracy': \"&lt;iframe src=x&gt;\", not a number")])
def test_a_newer_run_with_unusable_metrics_does_not_hide_an_older_good_one(runs, tmp_path, capsys, metrics_text,
                                                                             reason):
    root, newer = newer_run_beside(runs, tmp_path, metrics_text)
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(root), "--results", str(tmp_path / "none"), "--out", str(out),
                      "--no-screenshots"])
    text = (out / "results.md").read_text()
    assert f"skipped the newer run {newer}: metrics.json {reason}" in text
    assert f"): `{root / 'lenet5' / 'a'}`" in text
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(line.startswith("warning: ") for line in err.splitlines())


def test_a_string_where_a_number_belongs_in_a_results_file_is_one_line(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    lenet = {"act": "torch", "test_accuracy": "0.99", "test_loss": 0.05, "epochs": 2, "train_seconds": 1.5,
             "device": "cpu", "params": 44426}
    (results / "lenet_run_2x128_cpu.json").write_text(json.dumps(lenet))  # the run the LeNet-5 section shows
    (tmp_path / "r.md").write_text("# R\n\nAccuracy {{ lenet.test_accuracy|f('.2%') }}.\n")
    out = tmp_path / "out"
    make_report.main(["--results", str(results), "--report", str(tmp_path / "r.md"), "--out", str(out),
                      "--no-screenshots"])
    assert "format '.2%' does not fit '0.99'" in (out / "results.md").read_text()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: report placeholder") and "Traceback" not in err[0]


def fake_chromium(tmp_path, body):
    script = tmp_path / "chromium"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_chromium_that_fails_leaves_no_links_to_missing_screenshots(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(browser, "find_browser", lambda: fake_chromium(tmp_path, "exit 1"))
    out = tmp_path / "out"
    make_report.main([str(runs / "runs" / "lenet5" / "a"), "--results", str(tmp_path / "none"), "--out", str(out)])
    text = (out / "results.md").read_text()
    assert not list(out.glob("*tensorboard*.png")) and "tensorboard_scalars.png)" not in text
    assert "no screenshot lenet_tensorboard_scalars.png: Chromium exited with 1" in text


@pytest.mark.slow
def test_a_hanging_chromium_is_killed_and_the_report_still_written(runs, tmp_path, monkeypatch):
    import time
    pid_file = tmp_path / "pid"
    monkeypatch.setattr(browser, "find_browser", lambda: fake_chromium(tmp_path, f"echo $$ > {pid_file}; sleep 600"))
    monkeypatch.setattr(browser, "BROWSER_TIMEOUT", 3)
    out = tmp_path / "out"
    t0 = time.monotonic()
    make_report.main([str(runs / "runs" / "lenet5" / "a"), "--results", str(tmp_path / "none"), "--out", str(out)])
    assert time.monotonic() - t0 < 100  # one bounded wait, not one per screenshot, not 120 s
    text = (out / "results.md").read_text()
    assert "Chromium did not finish within 3 s; killed; no further screenshots tried" in text
    assert "tensorboard_scalars.png)" not in text
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # the hung process is gone


# --------------------------------------------------------------------- results files: names, fields, corpus

def gelu_json(device):
    return {"device_name": device, "dtype": "float32", "ext_measured": True,
            "rows": [{"n": 1024, "aten_ms": 0.5, "seed_ms": 1.5, "python_ms": 2.0, "ext_ms": 0.25, "ext_vs_aten": 2.0}]}


def ladder_json(device):
    return {"device_name": device, "micro_batch": 2, "seq_len": 64, "vocab_size": 512,
            "rungs": [{"name": "naive", "tokens_per_second": 100.0, "ms_per_step": 1.0, "mfu": None, "speedup": 1.0}]}


def test_results_files_with_one_name_in_two_folders_are_both_reported(tmp_path):
    results = tmp_path / "results"
    (results / "h200").mkdir(parents=True)
    for folder, device in ((results, "outer cpu"), (results / "h200", "inner gpu")):
        (folder / "gelu_bench_x.json").write_text(json.dumps(gelu_json(device)))
        (folder / "gpt_bench_x.json").write_text(json.dumps(ladder_json(device)))
    out = tmp_path / "out"
    make_report.main(["--runs-root", str(tmp_path / "none"), "--results", str(results), "--out", str(out),
                      "--no-screenshots"])
    text = (out / "results.md").read_text()
    for kind in ("gelu_bench_x", "gpt_bench_x"):
        for path, name in ((results / f"{kind}.json", kind), (results / "h200" / f"{kind}.json", f"h200_{kind}")):
            assert f"- `{path}`: placeholders `{{{{{name}.…}}}}`" in text


# --------------------------------------------------------------------- the PDF

def require_pdf_tools():
    if not browser.find_browser() or not all(shutil.which(t) for t in ("pdftotext", "pdfinfo", "pdfimages")):
        if os.environ.get("LAB5_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium and poppler required (LAB5_REQUIRE_BROWSER=1)")
        pytest.skip("no Chromium or poppler (apt-get install chromium fonts-noto-cjk poppler-utils)")


def poppler(*args):
    import subprocess
    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout


def test_pdf_is_titled_by_the_h1_with_no_stray_spaces_and_each_figure_beside_its_caption(tmp_path):
    import re

    from PIL import Image
    require_pdf_tools()
    Image.new("RGB", (600, 180), (40, 90, 160)).save(tmp_path / "wide.png")
    figures = "".join(  # fillers of varied length: unkept, figures 5 and 12 would lose their captions' ends
        "这段填充文字把图推向页面底部。" * (5 * k % 17 + 1) + "\n\n![wide](wide.png)\n\n"
        + f"*图 {k}：图的说明，它必须和图在同一页上；\n"
        + "说明很长" * 60 + f"。说明{k}结束。*\n\n" for k in range(1, 13))
    (tmp_path / "r.md").write_text(
        "# 测试报告：GELU 与 `GPT-2`\n\n"
        "第一段的第一行在这里断开\n第二行接着写，硬件、\nPyTorch 版本和命令，\n都记录在 JSON 中。\n\n" + figures
        + "| 列一 | 列二 |\n|---|---|\n" + "".join(f"| 第 {i} 行 | 数值 {i} |\n" for i in range(60)))
    pdf = tmp_path / "r.pdf"
    browser.write_pdf(tmp_path / "r.md", pdf, (tmp_path / "r.md").read_text())
    assert re.search(r"^Title:\s+测试报告：GELU 与 GPT-2$", poppler("pdfinfo", str(pdf)), re.M)
    text = poppler("pdftotext", str(pdf), "-")
    first = "第一段的第一行在这里断开第二行接着写，" "硬件、PyTorch 版本和命令，都记录在 JSON 中。"
    assert first in text.replace("\n", "")
    cjk = "[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]"
    prose = text.split("列一")[0]  # (pdftotext separates table cells by spaces: not the text's)
    stray = f"{cjk} +{cjk}|[、，。：；] "
    assert not re.search(stray, prose), re.findall(f".{{3}}(?:{stray}).{{3}}", prose)
    pages = [int(line.split()[0]) for line in poppler("pdfimages", "-list", str(pdf)).splitlines()[2:]]
    assert len(pages) == 12
    for k, page in enumerate(pages, 1):  # each image's page holds all of its caption
        on_page = poppler("pdftotext", "-f", str(page), "-l", str(page), str(pdf), "-").replace("\n", "")
        assert f"图 {k}：图的说明" in on_page and f"说明{k}结束。" in on_page, (k, page)
    assert [p.name for p in tmp_path.glob(".pdf-*")] == []  # the HTML printed is removed


def test_the_events_shown_are_of_the_very_run_the_text_reports(runs, tmp_path):
    """The committed LeNet-5 run's events lie beside its JSON; the GPU folder's tb-lenet (another recipe, another
    machine) is never shown under its numbers. Without events beside it: said, and no screenshot of another run."""
    results = tmp_path / "results"
    gpu = results / "h200"
    shutil.copytree(runs / "runs" / "lenet5" / "a", gpu / "tb-lenet", ignore=shutil.ignore_patterns("*.json", "*.pt"))
    (gpu / "nvidia-smi-during-lenet.txt").write_text(smi_snapshot("NVIDIA H200", 15))
    (results / "lenet_run_2x128_cpu.json").write_text((runs / "runs" / "lenet5" / "a" / "metrics.json").read_text())
    out = tmp_path / "out"
    make_report.main(["--results", str(results), "--out", str(out)])  # no events shown: no server, no Chromium
    text = (out / "results.md").read_text()
    assert f"- no TensorBoard events kept for `{results / 'lenet_run_2x128_cpu.json'}`: no screenshot of it" in text
    args = make_report.parse_args(["--results", str(results), "--out", str(tmp_path / "unused")])
    assert "lenet_tb" not in make_report.gather(args).sources and not list(out.glob("*tensorboard*"))
    shutil.copytree(runs / "runs" / "lenet5" / "a", results / "lenet_run_2x128_cpu",
                    ignore=shutil.ignore_patterns("*.json", "*.pt"))
    events = make_report.gather(args).sources["lenet_tb"][0]
    assert events == {"source": str(results / "lenet_run_2x128_cpu")}
    shown = make_report.facts.shown_runs({}, make_report.load_results(results, []), {})
    assert shown["lenet5"].events == results / "lenet_run_2x128_cpu"


def test_the_gpt_screenshot_is_of_the_headline_runs_own_events(tmp_path):
    folder = tmp_path / "h200"
    for name in ("gpt_run_12M-warm_standin_h200", "gpt_run_12M-cold_standin_h200", "tb-lenet"):
        (folder / name).mkdir(parents=True)
        (folder / name / "events.out.tfevents.1.x").write_bytes(b"")
    cold = folder / "gpt_run_12M-cold_standin_h200"
    assert inputs.events_beside(folder / "gpt_run_12M-cold_standin_h200.json") == cold
    assert inputs.events_beside(folder / "lenet_run_torch_h200.json") is None  # tb-lenet: not named as this run


def test_a_figure_holds_one_image_and_only_its_own_caption():
    html = browser.report_html("# T\n\n![a](a.png)\n\n*图 1：甲。*<!-- a note after the caption -->\n\n正文。\n\n"
                               "![b](b.png)\n\n*图 2：乙。*\n\n![c](c.png)\n\n没有说明的图后面的正文。\n")
    import re
    figures = re.findall("<figure>(.*?)</figure>", html, re.S)
    assert [f.count("<img") for f in figures] == [1, 1] and "图 1：甲。" in figures[0] and "正文" not in figures[0]
    assert "图 2：乙。" in figures[1] and '<p><img alt="c" src="c.png" /></p>' in html  # no caption: no figure


def test_the_ladder_table_shows_ranges_and_leaves_out_a_failed_row():
    bench = {"device_name": "CPU", "repeats": 3, "rungs": [
        {"name": "naive: x", "tokens_per_second": 10.0, "tokens_per_second_range": [9.0, 12.0], "speedup": 1.0},
        {"name": "+ bf16", "tokens_per_second": 20.0, "tokens_per_second_range": [18.0, 21.0], "speedup": 2.0},
        {"name": "  default without bf16", "tokens_per_second": 11.0, "speedup": 1.1},
        {"name": "  candidate: out of memory", "error": "CUDA out of memory"}]}
    table = figures.ladder_compare(None, bench, None)
    assert "| 朴素基线 | 10 [9–12] |" in table and "| 20 [18–21]（×2.00） |" in table  # a rung: × the row above
    assert "| 11（默认的 ×0.55） |" in table and "out of memory" not in table  # leave-one-out: × the default


def test_the_gpu_roles_take_gpu_checks_run_names_the_graded_run_first():
    from report.gpu import ROLES, SLOTS, pick
    names = [f"gpt_run_{size}-{kind}_NVIDIA_H200" for size in ("12M", "4K") for kind in
             ("own-vocab-fp16", "gpt2-vocab-cold", "own-vocab-regional-compile-cold", "own-vocab-cold")]
    assert pick(names[:4], ROLES["gpu_gpt"]) == "gpt_run_12M-own-vocab-cold_NVIDIA_H200"
    assert pick(names[4:], ROLES["gpu_gpt"]) == "gpt_run_4K-own-vocab-cold_NVIDIA_H200"  # the rehearsal's
    first = ["gpt_run_12M-cold_standin_h200_call1", "gpt_run_12M-cold_standin_h200", "gpt_run_12M-warm_standin_h200"]
    assert pick(first, ROLES["gpu_gpt"]) == "gpt_run_12M-cold_standin_h200"  # the first H200 folder's
    csvs = ["nvidia-smi-gpt-gpt2-vocab.csv", "nvidia-smi-gpt-own-vocab-regional-compile.csv",
            "nvidia-smi-gpt-own-vocab.csv"]
    assert pick(csvs, SLOTS["gpu_utilization.png"][1]) == "nvidia-smi-gpt-own-vocab.csv"
    assert pick(["nvidia-smi-during-lenet.txt"], SLOTS["nvidia_smi_lenet.png"][1]) is None  # taken before training


TEAM_WORDS = ("H200", "4-epoch", "4 个 epoch", "h200-", "f52a456", "替身语料", "stand-in")


@pytest.mark.slow  # two real tiny runs (the module's fixture) and a build
def test_a_students_report_from_own_cpu_runs_names_only_those_runs(runs, tmp_path):
    """A student's report: every caption, title and sentence of the body names the runs it shows, none of the
    team's machines, recipes or files (the H200, its 4-epoch LeNet-5 recipe, report/results/h200-...)."""
    lenet, gpt = runs / "runs" / "lenet5" / "a", runs / "runs" / "gpt" / "b"
    out = tmp_path / "mine"
    make_report.main([str(lenet), str(gpt), "--out", str(out), "--no-screenshots"])
    body = (out / "report_filled.md").read_text().split("# 附录")[0]
    captions = [line for line in body.splitlines() if line.startswith("*图 ")]
    assert len(captions) >= 1 and "{{" not in body  # the GPT curves (--no-screenshots: no TensorBoard caption)
    for word in TEAM_WORDS:
        assert word not in body, word
    lenet_m, gpt_m = (json.loads((d / "metrics.json").read_text()) for d in (lenet, gpt))
    assert f"{lenet_m['test_accuracy']:.2%}" in body and f"{gpt_m['final_train_loss']:.2f}" in body
    assert str(gpt) in body and str(lenet) in body
    assert [f"图 {i}：" for i in range(1, len(captions) + 1)] == [c[1:5] for c in captions]  # numbered in order
    shots = [c for c in captions if "事件文件" in c]  # the screenshot captions name the named runs' folders
    assert all(str(lenet) in c or str(gpt) in c for c in shots)
    team = (REPO / "report" / "report.md").read_text()
    assert any(word in team for word in TEAM_WORDS)  # the words checked are the team report's, so this can fail


@pytest.mark.slow  # the module's two real tiny runs and a build
def test_a_named_run_that_cannot_be_read_is_missing_never_the_teams(runs, tmp_path, capsys):
    """A student's GPT run stopped before its metrics (or with them damaged): the report says no GPT run was
    found among the runs named; the team's committed H200 run never stands in for it."""
    lenet, gpt = runs / "runs" / "lenet5" / "a", tmp_path / "gpt-stopped"
    shutil.copytree(runs / "runs" / "gpt" / "b", gpt)
    (gpt / "metrics.json").write_text('{"tokens_seen": 12')  # cut short
    out = tmp_path / "mine"
    make_report.main([str(lenet), str(gpt), "--out", str(out), "--no-screenshots"])
    assert f"left out {gpt}" in capsys.readouterr().err
    body = (out / "report_filled.md").read_text().split("# 附录")[0]
    for word in TEAM_WORDS + ("gpt_run_12M",):
        assert word not in body, word
    assert "no GPT run found among the runs named" in (out / "results.md").read_text()


def test_a_resumed_runs_job_time_is_all_its_processes():
    """A run stopped and resumed: its loop time sums both processes' loops, so its job time must be
    process_seconds_total (never this process's alone), and none at all where that total was lost."""
    from report import facts
    m = {"process_seconds": 13.1, "process_seconds_total": 23.1, "train_seconds": 16.1}
    assert facts.process_seconds(m) == 23.1
    assert facts.process_seconds({"process_seconds": 13.1}) == 13.1  # a run of one process, from before the total
    lost = {**m, "resumed": True, "process_seconds_total": None}  # an edited stop_clock.json gave inf: null
    assert facts.process_seconds(lost) is None
    run = make_report.facts.Run("gpt", "gpt", lost, "x.json")
    assert "process_seconds" not in facts.clock_facts(run) and "未记录" in facts.clock_facts(run)["process_text"]
