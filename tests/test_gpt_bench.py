"""benchmarks/gpt_bench.py: the ladder's rows (vocabulary, candidates, labels), MFU against the right
peak, the measured matmul rate and each row's fraction of it, failed rows recorded, rows written as
they finish."""
import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import gpt_bench  # noqa: E402


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


def test_the_cudnn_attention_candidate_only_on_sm90_where_available(monkeypatch):
    monkeypatch.setattr(gpt_bench, "cudnn_attention_available", lambda: True)
    sm90 = [s for name, s in gpt_bench.ladder(True, (9, 0)) if "cuDNN attention" in name]
    assert len(sm90) == 1 and sm90[0]["sdpa_backend"] == "cudnn"
    assert not [name for name, _ in gpt_bench.ladder(True, (8, 0)) if "cuDNN" in name]
    assert not [name for name, _ in gpt_bench.ladder(False, (0, 0)) if "cuDNN" in name]


def test_the_row_without_the_own_module_says_what_it_compiles():
    compiled = [name for name, s in gpt_bench.ladder(True, (9, 0)) if "without own GPT module" in name]
    assert compiled == ["  default without own GPT module from the same GPT2Config: transformers' GPT2LMHeadModel, "
                        "torch.compile of the whole model"]
    eager = [name for name, s in gpt_bench.ladder(False, (0, 0)) if "without own GPT module" in name]
    assert eager and "torch.compile" not in eager[0]


def test_fp32_rows_are_measured_against_the_fp32_peak_where_tf32_is_off():
    row = {"precision": "fp32", "tf32": False}
    assert gpt_bench.datasheet_peak(row, "NVIDIA H200") == 67e12  # CUDA cores, not the 494 TFLOP/s of TF32
    assert gpt_bench.datasheet_peak({**row, "tf32": True}, "NVIDIA H200") == 494e12
    assert gpt_bench.datasheet_peak({**row, "precision": "bf16"}, "NVIDIA H200") == 989e12
    assert gpt_bench.datasheet_peak(row, "NVIDIA GeForce RTX 2080 Ti") == 13.4e12
    assert gpt_bench.matmul_kind(row, cuda=True) == "fp32" and gpt_bench.matmul_kind({**row, "tf32": True}, True) == "tf32"
    assert gpt_bench.matmul_kind({**row, "tf32": True}, cuda=False) == "fp32"


def test_the_matmul_rate_is_a_plausible_flop_rate():
    import torch
    rate = gpt_bench.matmul_rate("fp32", 64, torch.device("cpu"), k=64, n=64)
    assert 1e6 < rate < 1e14


def test_a_failing_row_is_recorded_and_the_others_written_as_they_finish(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_measure(settings, args, device):
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
    monkeypatch.setattr(gpt_bench, "matmul_rate", lambda kind, m, device: {"fp32": 4e9, "bf16": 8e9}[kind])
    rows = gpt_bench.ladder(False, (0, 0), vocab_size=16384)
    numbers = [i for i, (name, _) in enumerate(rows, 1) if "vocabulary" in name or "chunked" in name]
    out = gpt_bench.main(["--only", ",".join(map(str, [1, *numbers])), "--repeats", "2", "--metrics-out",
                          str(tmp_path / "m.json")])
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(out))
    first, vocab, chunked = out["rungs"]
    assert first["fraction_of_matmul_rate"] == pytest.approx(1e6 * 1000 / 4e9) and first["matmul_kind"] == "fp32"
    assert vocab["vocab_size"] == 50304  # the fake echoes the row's setting
    assert chunked == {"name": rows[numbers[1] - 1][0], "error": "RuntimeError: kernel failed",
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


def test_real_rows_on_cpu_vocabulary_and_chunked_loss(tmp_path):
    """The lab shape at a short sequence: GPT-2's vocabulary costs FLOPs; the chunked loss gives the plain loss."""
    rows = gpt_bench.ladder(False, (0, 0))
    pick = [len([n for n, _ in rows if not n.startswith(" ")])]  # the default (last rung)
    pick += [i for i, (name, _) in enumerate(rows, 1) if "vocabulary" in name or "chunked" in name]
    out = gpt_bench.main(["--only", ",".join(map(str, pick)), "--repeats", "1", "--steps", "1", "--warmup", "0",
                          "--seq-len", "16", "--micro-batch", "1", "--metrics-out", str(tmp_path / "m.json")])
    default, vocab, chunked = out["rungs"]
    assert (default["vocab_size"], vocab["vocab_size"]) == (16384, 50304)
    assert vocab["flops_per_token"] - default["flops_per_token"] == 6 * 768 * (50304 - 16384)
    assert chunked["repeats"][0]["loss"] == pytest.approx(default["repeats"][0]["loss"], rel=1e-4)
    assert 0 < default["fraction_of_matmul_rate"] and set(out["matmul"]["flops_per_second"]) >= {default["matmul_kind"]}
