"""benchmarks/gpt_bench.py: the ladder's rows (vocabulary, candidates, labels), MFU against the right
peak, the measured matmul rate and each row's fraction of it, failed rows recorded, rows written as
they finish."""
import json
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench


def rows_by_name(cuda, capability, **kw):
    return dict(gpt_bench.ladder(cuda, capability, **kw))


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0)), (True, (7, 5))])
def test_the_vocabulary_row_and_the_chunked_loss_candidate_extend_the_default(cuda, capability):
    rows = gpt_bench.ladder(cuda, capability)
    default = [s for name, s in rows if not name.startswith(" ")][-1]
    vocab = [s for name, s in rows if "GPT-2's vocabulary (50,304 instead of 16,384)" in name]
    chunked = [s for name, s in rows if name.startswith("  candidate: chunked loss")]
    assert vocab == [{**default, "vocab_size": 50304}] and chunked == [{**default, "loss": "chunked"}]
    assert not any("GPT-2's vocabulary" in name for name in rows_by_name(cuda, capability, vocab_size=50304))


@pytest.mark.parametrize("cuda, capability", [(False, (0, 0)), (True, (9, 0))])
def test_every_sdpa_backend_has_a_forced_row_and_compiles_come_last(cuda, capability):
    rows = gpt_bench.ladder(cuda, capability)
    forced = [s["sdpa_backend"] for _, s in rows if s["sdpa_backend"]]
    assert forced == ["flash", "efficient", "cudnn", "math"]
    groups = gpt_bench.unmeasured_first(rows)
    assert sorted(i for g in groups for i in g) == list(range(1, len(rows) + 1))
    # what the report's conclusions rest on gets every repeat first: the naive row, the default, the default
    # without each acceleration; then the rungs between and the SDPA backends (cuDNN's among them)
    first, second = ([rows[i - 1][0] for i in g] for g in groups[:2])
    rungs = [name for name, _ in rows if not name.startswith(" ")]
    leave_one_out = [name for name, _ in rows if name.startswith("  default without")]
    assert first == [rungs[0], rungs[-1], *leave_one_out] and rungs[-1].endswith("(= gpt_train.py default)")
    assert len(leave_one_out) == len(rungs) - 2  # every acceleration but dropout (the own module has none)
    assert "  default without fused AdamW" in first and "  default, SDPA forced to its cudnn backend" in second
    assert "  default without bf16 autocast" in first or not cuda
    assert second[:len(rungs) - 2] == rungs[1:-1]
    assert not any("candidate" in name or "vocabulary" in name or "compile" in name for name in first + second)
    compiled = [i for i, (_, s) in enumerate(rows, 1) if s["compile"] != "off"]
    assert (groups[-1] == compiled and len(compiled) == 2) if cuda else not compiled


@pytest.mark.slow
def test_an_unavailable_sdpa_backend_is_a_row_that_says_so():
    """On a CPU the cuDNN kernel does not exist: that row says so, the others measure."""
    rows = gpt_bench.ladder(False, (0, 0))
    pick = [i for i, (_, s) in enumerate(rows, 1) if s.get("sdpa_backend") in ("math", "cudnn")]
    out = gpt_bench.main(["--only", ",".join(map(str, pick)), "--repeats", "1", "--steps", "1", "--warmup", "0",
                          "--seq-len", "16", "--micro-batch", "1", "--vocab-size", "64"])
    cudnn, math_row = out["rungs"]
    assert cudnn["error"].startswith("SDPA's cudnn backend not available here")
    assert math_row["sdpa_backend"] == "math (forced)" and math_row["tokens_per_second"] > 0


def test_the_row_without_the_own_module_is_plain_transformers():
    rows = [name for name, s in gpt_bench.ladder(True, (9, 0)) if "without own GPT module" in name]
    assert rows == ["  default without own GPT module from the same GPT2Config"]


@pytest.mark.parametrize("capability, tf32", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_tf32_is_decided_on_only_where_the_gpu_has_tf32_tensor_cores(capability, tf32):
    """A 2080 Ti (sm75) has none: its start-up line says tf32 off, its ladder has no TF32 rung or row."""
    import training.device
    decisions = training.device.decisions_for("cuda", capability, "auto", "auto", "NVIDIA GeForce RTX 2080 Ti")
    assert decisions.tf32 is tf32 and gpt_bench.default_step(True, capability)[0].tf32 is tf32
    assert any("TF32" in name for name, _ in gpt_bench.ladder(True, capability)) is tf32
    assert not training.device.decisions_for("cpu", (0, 0), "auto", "auto").tf32


def test_mfu_peaks_come_from_training_device_by_the_most_specific_name():
    import training.device
    assert training.device.peak_flops("NVIDIA H200 NVL", "fp32", tf32=False) == 60e12  # not the H200's 67
    assert gpt_bench.matmul_kind({"precision": "fp32", "tf32": True}, cuda=True) == "tf32"
    assert gpt_bench.matmul_kind({"precision": "fp32", "tf32": True}, cuda=False) == "fp32"


def test_the_matmul_rate_is_a_plausible_flop_rate():
    import torch
    rate = gpt_bench.matmul_rate("fp32", 64, torch.device("cpu"), k=64, n=64)
    assert 1e6 < rate < 1e14


def test_a_failing_row_is_recorded_and_the_others_written_as_they_finish(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_measure(settings, args, device, profile=False):
        calls.append(settings.get("loss"))
        out = tmp_path / "m.json"
        if len(calls) == 2:  # the first row is on disk before the second starts
            assert [r["tokens_per_second"] for r in json.loads(out.read_text())["rungs"]] == [1000.0]
        if settings.get("loss") == "chunked":
            raise RuntimeError("kernel failed\nsecond line")
        return {"tokens_per_second": 1000.0, "ms_per_step": 1.0, "flops_per_token": 1e6, "mfu": None,
                "ms_per_step_range": [1.0, 1.0], "first_step_extra_seconds": 0.0, "loss": 9.0,
                "vocab_size": settings.get("vocab_size", 16384), "matmul_kind": "fp32"}
    monkeypatch.setattr(gpt_bench, "measure", fake_measure)
    monkeypatch.setattr(gpt_bench, "matmul_rate", lambda kind, m, device, k, n: {"fp32": 4e9, "bf16": 8e9}[kind])
    rows = gpt_bench.ladder(False, (0, 0), vocab_size=16384)
    numbers = [i for i, (name, _) in enumerate(rows, 1) if "vocabulary" in name or "chunked" in name]
    out = gpt_bench.main(["--only", ",".join(map(str, [1, *numbers])), "--repeats", "2", "--metrics-out",
                          str(tmp_path / "m.json")])
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(out))
    first, chunked, vocab = out["rungs"]  # the ladder's order
    assert first["fraction_of_matmul_rate"] == pytest.approx(1e6 * 1000 / 4e9) and first["matmul_kind"] == "fp32"
    assert vocab["vocab_size"] == 50304  # the fake echoes the row's setting
    assert chunked == {"name": rows[numbers[0] - 1][0], "error": "RuntimeError: kernel failed",
                       "repeats": [{"error": "RuntimeError: kernel failed"}] * 2}
    assert out["matmul"]["flops_per_second"]["fp32"] == 4e9 and out["matmul"]["shape"] == [2 * 1024, 768, 3072]
    assert out["load_average_at_start"] >= 0 and out["load_average_now"] >= 0  # how busy the machine was


@pytest.mark.parametrize("flags, message", [(["--only", "99"], "the ladder has rows 1.."),
                                            (["--only", "x"], "--only takes row numbers"),
                                            (["--steps", "0"], "must be > 0")])
def test_bad_flags_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpt_bench.main(flags)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_real_rows_on_cpu_vocabulary_and_chunked_loss(tmp_path):
    """The lab shape at a short sequence: GPT-2's vocabulary costs FLOPs; the chunked loss gives the plain loss."""
    rows = gpt_bench.ladder(False, (0, 0))
    pick = [len([n for n, _ in rows if not n.startswith(" ")])]  # the default (last rung)
    pick += [i for i, (name, _) in enumerate(rows, 1) if "vocabulary" in name or "chunked" in name]
    out = gpt_bench.main(["--only", ",".join(map(str, pick)), "--repeats", "1", "--steps", "1", "--warmup", "0",
                          "--seq-len", "16", "--micro-batch", "1", "--metrics-out", str(tmp_path / "m.json")])
    default, chunked, vocab = out["rungs"]
    assert (default["vocab_size"], vocab["vocab_size"]) == (16384, 50304)
    assert vocab["flops_per_token"] - default["flops_per_token"] == 6 * 768 * (50304 - 16384)
    assert chunked["repeats"][0]["loss"] == pytest.approx(default["repeats"][0]["loss"], rel=1e-4)
    assert 0 < default["fraction_of_matmul_rate"] and set(out["matmul"]["flops_per_second"]) >= {default["matmul_kind"]}


def test_list_prints_the_numbered_rows_and_measures_nothing(monkeypatch, capsys):
    """`--list`: the numbers `--only` takes, each beside its row's name, and no row measured."""
    monkeypatch.setattr(gpt_bench, "measure", lambda *a, **kw: pytest.fail("--list measured a row"))
    rows = gpt_bench.main(["--list", "--vocab-size", "50304"])
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{i:2d} {name}" for i, (name, _) in enumerate(rows, 1)]
    assert rows == gpt_bench.ladder(False, (0, 0), vocab_size=50304) and printed[0].startswith(" 1 naive: ")
    assert "15   candidate: chunked loss, no full fp32 logits (--loss chunked)" in printed


def test_a_cpu_rows_peak_memory_is_the_process_peak_since_the_rows_start():
    """On a CPU the peak is the process's resident peak (VmHWM) from the reset at a row's start: a 0.37 GiB tensor
    made and freed after the reset is in it, and the next row's reset forgets it."""
    before = gpt_bench.process_peak_GiB(reset=True)
    if before is None:
        pytest.skip("no /proc/self/status: the peak is null, not measured")
    block = torch.ones(100_000_000)  # 0.37 GiB, written: resident
    del block
    peak = gpt_bench.process_peak_GiB()
    assert peak > before + 0.3
    assert gpt_bench.process_peak_GiB(reset=True) < peak - 0.3
