"""gpt_train.py: the model against transformers' GPT-2, budgets, resume, signals, 2-process DDP."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import gpt_train
from conftest import REPO, free_port, tiny_args


# ------------------------------------------------------------------ the model

def lab_shape(**overrides):
    return SimpleNamespace(**{**gpt_train.PRESETS["lab"], **overrides})


def test_lab_parameter_count_matches_transformers_gpt2():
    cfg = gpt_train.model_config(lab_shape(), vocab_size=50257, eot_id=50256)
    assert cfg.vocab_size == 50304 and (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions) == (12, 12, 768, 1024)
    ours = sum(p.numel() for p in gpt_train.GPT(cfg).parameters())
    theirs = sum(p.numel() for p in GPT2LMHeadModel(cfg).parameters())
    assert ours == theirs == 124_439_808 + 47 * 768  # GPT-2 small (124.4M), plus 47 padding rows


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_forward_equals_transformers_gpt2_with_the_same_weights(attention):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(cfg).eval()
    ours = gpt_train.GPT(cfg, attention).eval()
    state = {}
    for name, tensor in hf.state_dict().items():
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":  # causal-mask buffers
            continue
        key = name.removeprefix("transformer.")  # the same names, one to one
        is_conv1d = any(part in name for part in ("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        state[key] = tensor.t() if is_conv1d else tensor  # HF's Conv1D stores (in, out)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []  # tied to wte
    idx = torch.randint(0, 128, (3, 32))
    with torch.no_grad():
        expected = hf(idx, labels=idx).loss  # HF shifts the labels itself
        got = ours(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_flops_per_token_is_6n_plus_attention():
    cfg = gpt_train.model_config(lab_shape(), 16384, 0)
    assert gpt_train.flops_per_token(cfg, 1024, 100) == 600 + 12 * 12 * 768 * 1024


# ------------------------------------------------------------------ device decisions

@pytest.mark.parametrize("requested, device, capability, cpu_bf16, expected", [
    ("auto", "cuda", (9, 0), False, "bf16"),    # H100 / H200
    ("auto", "cuda", (8, 0), False, "bf16"),    # A100
    ("auto", "cuda", (7, 5), False, "fp16"),    # 2080Ti: torch would emulate bf16 there (no tensor cores)
    ("auto", "cpu", (0, 0), True, "bf16"),      # CPU with AVX512-BF16 / AMX
    ("auto", "cpu", (0, 0), False, "fp32"),     # other CPUs: emulated bf16 would be slower
    ("fp32", "cuda", (9, 0), False, "fp32"),
])
def test_precision_auto_by_compute_capability(requested, device, capability, cpu_bf16, expected):
    assert gpt_train.resolve_precision(requested, device, capability, cpu_bf16) == expected


def test_precision_impossible_requests_are_errors():
    with pytest.raises(gpt_train.UserError, match="needs a GPU"):
        gpt_train.resolve_precision("fp16", "cpu", (0, 0))
    with pytest.raises(gpt_train.UserError, match="sm75 has no bf16"):
        gpt_train.resolve_precision("bf16", "cuda", (7, 5))


def test_compile_auto_is_regional_on_sm80_and_off_on_turing_and_cpu():
    assert gpt_train.resolve_compile("auto", "cuda", (7, 5))[0] == "off"
    assert "sm75" in gpt_train.resolve_compile("auto", "cuda", (7, 5))[1]
    assert gpt_train.resolve_compile("auto", "cuda", (9, 0)) == ("regional", "")
    assert gpt_train.resolve_compile("auto", "cpu", (0, 0))[0] == "off"
    assert gpt_train.resolve_compile("whole", "cuda", (9, 0))[0] == "whole"


def test_mfu_peak_table():
    assert gpt_train.peak_flops("NVIDIA H200", "bf16") == 989e12
    assert gpt_train.peak_flops("NVIDIA GeForce RTX 2080 Ti", "fp16") == 53.8e12
    assert gpt_train.peak_flops("NVIDIA A100-SXM4-80GB", "fp32") == 156e12
    assert gpt_train.peak_flops("Some Unknown GPU", "bf16") is None


# ------------------------------------------------------------------ training runs

def test_tiny_run_learns_and_stops_at_the_budget(corpus, tmp_path):
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "20000",
                                       "--metrics-out", str(tmp_path / "m.json")))
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads((tmp_path / "run" / "metrics.json").read_text())
    per_micro = 4 * 32
    assert metrics["tokens_seen"] == math.ceil(20000 / per_micro) * per_micro  # whole micro-batches, < 1 over
    assert metrics["steps"] == math.ceil(math.ceil(20000 / per_micro) / 2)  # last step: 1 of 2 micro-batches
    curve = [loss for _, loss in metrics["loss_curve"]]
    assert curve[0] > 5.5 and metrics["final_train_loss"] < curve[0] - 1.0  # from ~ln(512) = 6.2 downwards
    assert metrics["success"] and metrics["final_val_loss"] < 6 and metrics["val_bits_per_byte"] > 0
    for key in ("train_seconds", "total_seconds", "tokens_per_second", "mfu", "precision", "world_size",
                "device_name", "params", "vocab_size"):
        assert key in metrics
    assert metrics["mfu"] is None and metrics["world_size"] == 1 and metrics["vocab_size"] == 512
    assert list((tmp_path / "run").glob("ckpt-*"))  # the final checkpoint
    with pytest.raises(SystemExit, match="finished run"):  # never overwritten
        gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "20000"))


def test_lab_preset_runs_a_step_on_cpu(corpus, tmp_path):
    metrics = gpt_train.main(["--preset", "lab", "--text", str(corpus / "X.txt"), "--tokenizer",
                              str(corpus / "tok.json"), "--cache-dir", str(corpus / "cache"), "--out-dir",
                              str(tmp_path / "lab"), "--seq-len", "256", "--micro-batch", "1", "--global-batch", "1",
                              "--tokens", "256", "--compile", "off", "--val-batches", "1", "--ckpt-every", "0",
                              "--val-fraction", "0.05"])
    assert metrics["steps"] == 1 and metrics["tokens_seen"] == 256
    assert 85e6 < metrics["params"] < 87e6  # 124M structure with a 512-token vocabulary
    assert math.isfinite(metrics["final_train_loss"])


def run_script(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, str(REPO / "gpt_train.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def test_sigterm_checkpoints_and_resume_equals_uninterrupted(corpus, tmp_path):
    # 300 docs make ~115 blocks: 28 micro-batches per epoch; 60 steps x 2 = 120 micro-batches = 4+ epochs.
    common = ["--tokens", str(60 * 8 * 32), "--ckpt-every", "20", "--log-every", "1"]
    reference = gpt_train.main(tiny_args(corpus, tmp_path / "ref", *common))

    proc = run_script(*tiny_args(corpus, tmp_path / "cut", *common))
    deadline = time.time() + 120
    while not list((tmp_path / "cut").glob("ckpt-0000020")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # past the first epoch: step 20 = micro-batch 40 of 28 per epoch
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == gpt_train.STOP_EXIT_CODE, err
    ckpt, skipped = gpt_train.latest_checkpoint(tmp_path / "cut")
    assert skipped == []
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert 20 <= state["step"] < 60 and not (tmp_path / "cut" / "metrics.json").exists()
    assert not list((tmp_path / "cut").glob("*.tmp"))

    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "cut", *common))
    assert resumed["resumed"] and resumed["tokens_seen"] == reference["tokens_seen"]
    ref_curve = dict((step, loss) for step, loss in reference["loss_curve"])
    cut_curve = dict((step, loss) for step, loss in resumed["loss_curve"])
    common_steps = sorted(set(ref_curve) & set(cut_curve))
    assert 60 in common_steps and len(common_steps) >= 25
    for step in common_steps:  # same data, same RNG, same optimizer state: the same losses
        assert cut_curve[step] == pytest.approx(ref_curve[step], rel=1e-6), step
    assert resumed["final_val_loss"] == pytest.approx(reference["final_val_loss"], rel=1e-6)


def test_two_processes_match_one_for_the_same_global_batch(corpus, tmp_path):
    args = tiny_args(corpus, tmp_path / "one", "--tokens", str(12 * 8 * 32), "--fused-adamw", "off")
    single = gpt_train.main(args)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    two = tiny_args(corpus, tmp_path / "two", "--tokens", str(12 * 8 * 32), "--fused-adamw", "off",
                    "--metrics-out", str(tmp_path / "two.json"))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(free_port()), str(REPO / "gpt_train.py"), *two],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    double = json.loads((tmp_path / "two.json").read_text())
    assert double["world_size"] == 2 and double["tokens_seen"] == single["tokens_seen"]
    for (s1, l1), (s2, l2) in zip(single["loss_curve"], double["loss_curve"]):
        assert s1 == s2 and l2 == pytest.approx(l1, rel=1e-4)


# ------------------------------------------------------------------ errors a user can cause

@pytest.mark.parametrize("args, message", [
    (["--seq-len", "2048"], "exceeds GPT-2's 1024"),
    (["--tokens", "0"], "--tokens must be > 0"),
    (["--n-embd", "100", "--n-head", "3"], "not divisible"),
    (["--precision", "fp8"], "invalid choice"),
])
def test_bad_flags(args, message):
    result = subprocess.run([sys.executable, str(REPO / "gpt_train.py"), *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and message in result.stderr


def test_user_errors_are_one_line(corpus, tmp_path):
    proc = run_script(*tiny_args(corpus, tmp_path / "x", "--global-batch", "6"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip().splitlines()[-1].startswith("error: --global-batch 6")
    proc = run_script("--text", str(tmp_path / "missing.txt"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip() == f"error: --text {tmp_path / 'missing.txt'}: no such file"


# ------------------------------------------------------------------ the Slurm launcher, without Slurm

def test_slurm_script_forwards_flags_and_usr1_checkpoints(corpus, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(["bash", str(REPO / "slurm" / "gpt.sh"),
                             *tiny_args(corpus, tmp_path / "run", "--tokens", str(400 * 8 * 32), "--ckpt-every", "5",
                                        "--log-every", "1")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not list((tmp_path / "run").glob("ckpt-*[0-9]")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGUSR1)  # what Slurm sends the batch shell 90 s before the limit
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == gpt_train.STOP_EXIT_CODE, err[-2000:]
    assert "USR1: checkpointing" in out and "run again with --out-dir" in err
    state = json.loads((gpt_train.latest_checkpoint(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert 0 < state["step"] < 400
