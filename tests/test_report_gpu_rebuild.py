"""After a GPU call: `python report/make_report.py --gpu OUT --pdf`, one command, rebuilds the
committed report from gpu_check.sh's OUT: OUT is copied into report/results/<GPU>-<date>/ and unpacked, every
question OUT answers (the graded GPT run, LeNet-5 on the GPU, the ladder, GELU, nvidia-smi) shows OUT's numbers
and figures, never the 2026-11-30 f52a456 ones, and the p. 1 caveats keep only what is still true."""
import json
import shutil
import tarfile

import pytest
from torch.utils.tensorboard import SummaryWriter

from conftest import REPO
from report import make_report

COMMITTED = REPO / "report" / "results"
FIRST = COMMITTED / "h200-2026-11-30"
OLD_WORDS = ("f52a456", "2026-11-30", "较早")


def tar(folder, target):
    with tarfile.open(target, "w:gz") as archive:
        archive.add(folder, arcname=folder.name)


def gpu_call_out(tmp_path, gpu="NVIDIA_H200", size="12M", smi=True):
    """gpu_check.sh's OUT as a call leaves it (results.json, logs.tar.gz, runs.tar.gz: the names its steps write),
    its runs derived from the committed files as the current code writes them (process_seconds, compile off).
    smi=False: a rehearsal's shape (no nvidia-smi on a CPU)."""
    gpt = json.loads((FIRST / "gpt_run_12M-cold_standin_h200.json").read_text()) | {
        "compile": "off", "compile_seconds": 0.0, "train_seconds": 22.9, "process_seconds": 47.25}
    results = {
        f"gpt_run_{size}-own-vocab-cold_{gpu}": gpt,
        f"gpt_run_{size}-own-vocab-regional-compile-cold_{gpu}": gpt | {"compile": "regional", "compile_seconds": 11.2,
                                                                       "process_seconds": 58.4},
        f"lenet_run_torch_{gpu}": json.loads((COMMITTED / "lenet_run_2x128_cpu.json").read_text()) | {
            "device": "cuda", "device_name": "NVIDIA H200", "train_seconds": 3.1, "process_seconds": 9.4},
        f"gpt_bench_{gpu}": json.loads((COMMITTED / "gpt_bench_cpu_2x1024.json").read_text()) | {
            "device_name": "NVIDIA H200"},
        f"gelu_bench_{gpu}": json.loads((FIRST / "gelu_bench_h200.json").read_text())}
    out, logs, runs = tmp_path / "OUT", tmp_path / "logs", tmp_path / "runs"
    for folder in (out, logs, runs / "gpt" / f"{gpu}-{size}-own-vocab-cold", runs / "lenet5" / f"{gpu}-torch"):
        folder.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps({
        "gpu": gpu, "started_utc": "2026-12-05T10:00:00Z", "rehearsal": not smi, "clocks": [], "results": results,
        "steps": [{"step": "gpt-own-vocab", "status": "ok", "seconds": 48}]}))
    for step, csv in (("gpt-own-vocab", "smi-gpt-12M-cold.csv"), ("lenet-torch", "smi-lenet.csv")) if smi else ():
        (logs / f"nvidia-smi-{step}.csv").write_text((FIRST / csv).read_text())
        (logs / f"nvidia-smi-during-{step}.txt").write_text((FIRST / "nvidia-smi-during-gpt-12M-warm.txt").read_text())
    (logs / "gpt-own-vocab.log").write_text("train: 184 steps\n")
    tar(logs, out / "logs.tar.gz")
    for run in runs.glob("*/*"):
        writer = SummaryWriter(run)
        for step, loss in ((1, 9.7), (100, 6.0), (184, 5.6)):
            writer.add_scalar("loss/train", loss, step)
        writer.close()
    tar(runs, out / "runs.tar.gz")
    return out


def rebuild(tmp_path, monkeypatch, out):
    """The documented command, on a copy of report/results (its PDF left out here: Chromium's part is tested
    elsewhere): the filled report, results.md, and where OUT was copied."""
    results = tmp_path / "results"
    shutil.copytree(COMMITTED, results)
    monkeypatch.setattr(make_report, "RESULTS", results)
    generated = tmp_path / "generated"
    monkeypatch.setattr(make_report.browser, "tensorboard_screenshots", lambda runs, out, problems: [])  # (taken)
    make_report.main(["--gpu", str(out), "--out", str(generated)])
    return (generated / "report_filled.md").read_text(), (generated / "results.md").read_text(), results


def test_after_a_gpu_call_one_command_replaces_every_2026_11_30_figure_and_caveat_it_answers(tmp_path, monkeypatch):
    out = gpu_call_out(tmp_path)
    filled, listing, results = rebuild(tmp_path, monkeypatch, out)
    copied = results / "NVIDIA_H200-2026-12-05"
    names = {p.name for p in copied.iterdir()}
    assert {"logs.tar.gz", "results.json", "runs.tar.gz", "nvidia-smi-lenet-torch.csv"} <= names  # OUT, unpacked
    assert {"gpt_run_12M-own-vocab-cold_NVIDIA_H200.json", "lenet_run_torch_NVIDIA_H200.json"} <= names
    for word in OLD_WORDS:
        assert word not in filled, word  # not a number, caption, table row or caveat of the first H200 folder
    for slot in ("gpu_utilization.png", "nvidia_smi_gpt.png", "nvidia_smi_lenet.png"):
        line = next(line for line in listing.splitlines() if f"]({slot})" in line)
        assert line.endswith(f"in `{copied}`"), line
    assert "作业进程从启动到结束 **47 s**" in filled and "**`12M-own-vocab-cold`**" in filled
    assert "NVIDIA H200，2026-12-05" in filled and "§6 的 GPT 运行" in filled
    assert f"`{copied / 'gpt_run_12M-own-vocab-cold_NVIDIA_H200'}`" in filled  # its screenshot: OUT's own events
    committed = (REPO / "report" / "report.md").read_text()
    assert all(f"{{{{ {role}." in committed for role in ("gpu_gpt", "gpu_lenet", "gpu_gelu", "ladder"))


def test_a_rehearsal_shaped_folder_replaces_what_it_answers_and_the_caveats_say_both(tmp_path, monkeypatch):
    """A folder without nvidia-smi (the rehearsal's shape): its runs answer, the 2026-11-30 nvidia-smi figures stay
    (nothing newer answers them), and the caveats name both folders, each for what it still holds."""
    out = gpu_call_out(tmp_path, gpu="rehearsal_cpu", size="4K", smi=False)
    filled, listing, results = rebuild(tmp_path, monkeypatch, out)
    assert "**`4K-own-vocab-cold`**" in filled and "，2026-12-05" in filled
    line = next(line for line in listing.splitlines() if "](gpu_utilization.png)" in line)
    assert line.endswith(f"in `{results / 'h200-2026-11-30'}`")
    assert filled.count("较早") == 1 and "f52a456" in filled.split("## 1.")[0]


def refused_import(tmp_path, monkeypatch, out):
    """make_report --gpu OUT into an empty results folder, refused: (its one line, the results folder)."""
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(make_report, "RESULTS", results)
    with pytest.raises(SystemExit) as stop:
        make_report.main(["--gpu", str(out), "--out", str(tmp_path / "generated"), "--no-screenshots"])
    return str(stop.value.code), results


@pytest.mark.parametrize("gpu, started", [("/work/runs/gpt/gpt", "2026-12-05T10:00:00Z"), ("../x", "2026-12-05"),
                                          ("NVIDIA_H200", "../../../x"), ("NVIDIA_H200", None)])
def test_gpu_out_is_copied_only_into_a_folder_the_project_names(tmp_path, monkeypatch, capsys, gpu, started):
    """results.json's `gpu` and `started_utc` name the folder OUT is copied into (report/results/<GPU>-<date>):
    a path or anything but a GPU name and a YYYY-MM-DD date is refused in one line, and nothing is copied."""
    out = tmp_path / "OUT"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"gpu": gpu, "started_utc": started, "results": {}}))
    message, results = refused_import(tmp_path, monkeypatch, out)
    assert message.startswith(f"error: --gpu {out}: results.json's gpu") and "\n" not in message
    assert "nothing copied" in message and list(results.iterdir()) == [] and not (tmp_path / "x").exists()


@pytest.mark.parametrize("damage", ["cut", "no results"])
def test_an_out_that_cannot_be_unpacked_is_one_line_and_nothing_is_copied(tmp_path, monkeypatch, damage):
    out = gpu_call_out(tmp_path)
    if damage == "cut":
        (out / "runs.tar.gz").write_bytes((out / "runs.tar.gz").read_bytes()[:200])  # a copy stopped part way
    else:
        (out / "results.json").write_text(json.dumps({"gpu": "NVIDIA_H200", "started_utc": "2026-12-05"}))
    message, results = refused_import(tmp_path, monkeypatch, out)
    assert message.startswith(f"error: --gpu {out}: cannot unpack it (") and "\n" not in message
    assert message.endswith("nothing copied") and list(results.iterdir()) == []
