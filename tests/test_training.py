"""training/: device decisions and MFU, the token budget and micro-batch, throughput, the stop flag,
evaluation without recompiles: the machinery gpt_train.py calls, tested on its own."""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config

import gpt_train
from conftest import REPO, free_port, tmpfs
from data import wos
from data.tokenizer import open_tokenizer
from training import budget, device, lifecycle, metrics
from training.checkpoints import TrainState
from training.errors import UserError
from training.model import GPT, model_config
from training.step import Accelerations

FP32 = Accelerations()  # the probe key's accelerations: the defaults, fp32

# ------------------------------------------------------------------ device decisions

def test_flops_per_token_is_6n_plus_attention():
    cfg = model_config(16384, 0)
    assert device.flops_per_token(cfg, 1024, 100) == 600 + 12 * 12 * 768 * 1024


@pytest.mark.parametrize("requested, device_type, capability, cpu_bf16, expected", [
    ("auto", "cuda", (9, 0), False, "bf16"),    # H100 / H200
    ("auto", "cuda", (8, 0), False, "bf16"),    # A100
    ("auto", "cuda", (7, 5), False, "fp16"),    # 2080Ti: torch would emulate bf16 there (no tensor cores)
    ("auto", "cpu", (0, 0), True, "bf16"),      # CPU with AVX512-BF16 / AMX
    ("auto", "cpu", (0, 0), False, "fp32"),     # other CPUs: emulated bf16 would be slower
    ("fp32", "cuda", (9, 0), False, "fp32"),
])
def test_precision_auto_by_compute_capability(requested, device_type, capability, cpu_bf16, expected):
    assert device.resolve_precision(requested, device_type, capability, cpu_bf16) == expected


def test_precision_impossible_requests_are_errors():
    with pytest.raises(UserError, match="needs a GPU"):
        device.resolve_precision("fp16", "cpu", (0, 0))
    with pytest.raises(UserError, match="sm75 has no bf16"):
        device.resolve_precision("bf16", "cuda", (7, 5))


def test_compile_auto_is_off_everywhere_and_a_request_below_sm70_is_one_line():
    for device_type, capability in [("cuda", (9, 0)), ("cuda", (7, 5)), ("cuda", (6, 1)), ("cpu", (0, 0))]:
        mode, note = device.resolve_compile("auto", device_type, capability)
        assert mode == "off" and "--compile regional" in note
    assert device.resolve_compile("whole", "cuda", (9, 0)) == ("whole", "")
    assert device.resolve_compile("regional", "cuda", (7, 5)) == ("regional", "")  # a 2080Ti compiles too
    assert device.resolve_compile("regional", "cpu", (0, 0)) == ("regional", "")
    with pytest.raises(UserError, match="inductor needs sm70.*sm61"):
        device.resolve_compile("regional", "cuda", (6, 1))
    assert device.resolve_compile("off", "cuda", (6, 1)) == ("off", "")


def test_peak_flops_takes_the_most_specific_name_and_the_math_in_use():
    assert device.peak_flops("NVIDIA H200 NVL", "bf16") == 835e12  # not the H200 SXM's 989
    assert device.peak_flops("NVIDIA H200", "bf16") == 989e12
    assert device.peak_flops("NVIDIA H100 80GB HBM3", "fp32") == 494e12  # TF32 on
    assert device.peak_flops("NVIDIA H100 80GB HBM3", "fp32", tf32=False) == 67e12
    assert device.peak_flops("NVIDIA GeForce RTX 2080 Ti", "fp16") == 53.8e12
    assert device.peak_flops("Some New GPU", "bf16") is None


def test_the_sdpa_backend_is_named_from_the_kernel_that_ran():
    cfg = model_config(512, 0, n_layer=1, n_head=2, n_embd=32, n_positions=64)
    assert device.sdpa_backend(cfg, "fp32", torch.device("cpu")) == "flash_attention"  # the CPU's flash kernel
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):  # what the dispatcher is allowed
        assert device.sdpa_backend(cfg, "bf16", torch.device("cpu")) == "math"


def test_mfu_peak_table():
    assert device.peak_flops("NVIDIA H200", "bf16") == 989e12
    assert device.peak_flops("NVIDIA GeForce RTX 2080 Ti", "fp16") == 53.8e12
    assert device.peak_flops("NVIDIA A100-SXM4-80GB", "fp32") == 156e12
    assert device.peak_flops("Some Unknown GPU", "bf16") is None
    # the most specific name wins: an NVL card is not the SXM part whose name it contains
    assert device.peak_flops("NVIDIA H200 NVL", "bf16") == 835e12
    assert device.peak_flops("NVIDIA H100 NVL", "bf16") == 835e12
    assert device.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert device.peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12


# ------------------------------------------------------------------ budget, micro-batch, throughput

def test_budget_rounds_up_to_whole_micro_batches_and_shortens_only_the_last_step():
    plan = budget.plan_budget(tokens=1000, global_batch=8, micro_batch=2, world=2, seq_len=32)
    assert (plan.accum, plan.tokens_per_micro, plan.total_micro, plan.total_steps) == (2, 128, 8, 4)
    plan = budget.plan_budget(tokens=1100, global_batch=8, micro_batch=2, world=2, seq_len=32)
    assert plan.total_micro == 9 and plan.total_steps == 5
    assert [plan.micro_in_step(done) for done in (0, 2, 4, 6, 8)] == [2, 2, 2, 2, 1]
    with pytest.raises(UserError, match="not a multiple"):
        budget.plan_budget(1000, global_batch=6, micro_batch=4, world=1, seq_len=32)


def test_multi_node_micro_batch_fits_the_global_batch():
    # 2 nodes x 4 GPUs with the lab's global batch 64: 8 sequences per GPU, not the preset's 16
    assert budget.fit_micro_batch(64, world=8, limit=16) == 8
    assert budget.fit_micro_batch(64, world=1, limit=16) == 16
    assert budget.fit_micro_batch(48, world=2, limit=16) == 12
    with pytest.raises(UserError, match="not a multiple of micro-batch 7 x 3 processes"):
        budget.plan_budget(1000, 64, budget.fit_micro_batch(64, world=3, limit=16), world=3, seq_len=32)


def test_micro_batch_search_backs_off_on_out_of_memory():
    tried = []

    def try_step(m):  # a GPU where 6 sequences of the model fit, 8 do not
        tried.append(m)
        if m > 6:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")

    assert budget.find_micro_batch(try_step, share=64) == 4  # largest divisor of 64 that fits
    assert tried == [64, 32, 16, 8, 4]
    with pytest.raises(UserError, match="not even a micro-batch of 1"):
        budget.find_micro_batch(lambda m: (_ for _ in ()).throw(torch.OutOfMemoryError("fake")), share=4)


def test_micro_batch_search_runs_on_torch_2_4(monkeypatch):
    """torch 2.4 (requirements.txt allows it) has torch.cuda.OutOfMemoryError but no torch.OutOfMemoryError."""
    oom = torch.cuda.OutOfMemoryError
    monkeypatch.delattr(torch, "OutOfMemoryError")

    def try_step(m):
        if m > 2:
            raise oom("CUDA out of memory (fake)")

    assert budget.find_micro_batch(try_step, share=8) == 2


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """The probe's CUDA calls on a CPU: a GPU name, no cache to empty, peak-memory resets recorded."""
    resets = []
    monkeypatch.setattr(budget, "CACHE_HOME", tmp_path / "lab5")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    cfg = GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    return GPT(cfg), resets, tmp_path / "lab5" / "micro_batch.json"


def test_the_probe_resets_peak_memory_and_remembers_per_share(fake_gpu):
    model, resets, cache = fake_gpu
    assert budget.probe_micro_batch(model, FP32, "cpu", share=8) == (8, "probed")
    assert resets == ["cpu"]  # the failed tries' peak is not training's
    assert budget.probe_micro_batch(model, FP32, "cpu", share=8) == (8, "remembered")
    assert budget.probe_micro_batch(model, FP32, "cpu", share=4) == (4, "probed")  # another share: its own entry
    assert sorted(key.rsplit("|", 1)[1] for key in json.loads(cache.read_text())) == ["share 4", "share 8"]


@pytest.mark.parametrize("content", [b"{\"Fake GPU|1x16", b"[1, 2]", b'{"k": "x"}', b"\xff\xfe\x00"])
def test_a_damaged_probe_cache_is_ignored_and_probed_again(fake_gpu, content):
    model, _, cache = fake_gpu
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content)
    assert budget.probe_micro_batch(model, FP32, "cpu", share=4) == (4, "probed")
    assert list(json.loads(cache.read_text()).values()) == [4]


def test_the_probe_ballast_counts_ddp_buckets(fake_gpu, monkeypatch):
    model, _, _ = fake_gpu
    n, sizes, empty = sum(p.numel() for p in model.parameters()), {}, torch.empty
    for world in (1, 8):
        monkeypatch.setattr(torch, "empty", lambda size, **kw: sizes.setdefault(world, size) and empty(size, **kw))
        budget.probe_micro_batch(model, FP32, "cpu", share=4, world=world)
    assert sizes == {1: 3 * n, 8: 4 * n}  # AdamW's two moments + the step's temporaries; + DDP's gradient buckets


def test_tokens_per_second_and_mfu_exclude_the_compiling_first_step():
    state = TrainState()
    perf = metrics.Throughput(state)
    perf.step_done(31.0, 1000)  # the first step: compilation
    for _ in range(4):
        perf.step_done(1.0, 1000)
    perf.close()
    assert metrics.steady_tokens_per_second(state) == 1000
    assert state.compile_seconds == 30.0 and state.train_seconds == 35.0
    # MFU: the achieved FLOP/s over the peak of all GPUs, not one
    assert device.mfu(1000, 6e6, 1e12, world=1) == pytest.approx(6e-3)
    assert device.mfu(1000, 6e6, 1e12, world=8) == pytest.approx(6e-3 / 8)
    assert device.mfu(1000, 6e6, None, world=1) is None


def leave_without_teardown():
    """The end of a spawned test rank, as gpt_train's ranks end (test_ranks_leave_with_their_code...):
    a last barrier, then out without the interpreter's teardown, where a gloo worker could abort a
    finished rank and fail a test whose values were all written."""
    with lifecycle.no_teardown_after_collectives():
        pass


# ------------------------------------------------------------------ the stop flag

EXITING_RANK = """
import atexit, pathlib, sys
from accelerate import Accelerator
from training.lifecycle import no_teardown_after_collectives

def main():
    accelerator = Accelerator(cpu=True)  # gloo ranks when RANK/WORLD_SIZE say so
    mark = pathlib.Path(sys.argv[1], f"teardown{accelerator.process_index}")
    atexit.register(mark.touch)  # runs only in the interpreter's teardown
    accelerator.wait_for_everyone()  # a collective just before the end, as gpt_train's last ones
    sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])

with no_teardown_after_collectives(agreed=(0, 3)):
    main()
"""


def exiting_ranks(folder, code, world):
    """The started processes of a `world`-process job that exit with `code`; a teardown leaves a mark in `folder`."""
    folder.mkdir()
    script = folder / "rank.py"
    script.write_text(EXITING_RANK)
    port, env = free_port(), {**os.environ, "PYTHONPATH": str(REPO)}
    return [subprocess.Popen([sys.executable, script, folder, code], stderr=subprocess.PIPE, text=True,
                             env={**env, **({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
                                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
                                            if world > 1 else {})}) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("code, rc", [("0", 0), ("3", 3), ("error: bad input", 1)])
def test_ranks_leave_with_their_code_and_without_teardown(tmp_path, code, rc):
    """A finished rank must not abort in the interpreter's teardown (a gloo worker dropping a
    collective's last reference then: exit -6, a finished run marked failed); so the ranks of a
    multi-process run skip it, keeping main()'s exit code and message; one process too (the teardown is
    seconds on the job's clock)."""
    started = exiting_ranks(tmp_path / "two", code, world=2) + exiting_ranks(tmp_path / "one", code, world=1)
    *ranks, one = [(p.wait(timeout=300), p.stderr.read()) for p in started]  # the two jobs at once
    assert [r for r, _ in ranks] == [rc, rc], ranks
    assert not list(tmp_path.glob("*/teardown*"))  # no atexit ran: no teardown
    assert all(("error: bad input" in err) == (rc == 1) for _, err in ranks)
    assert one[0] == rc and ("error: bad input" in one[1]) == (rc == 1)


def test_a_second_ctrl_c_aborts_at_once():
    previous = signal.getsignal(signal.SIGINT)
    with lifecycle.StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs between bytecodes
        assert stop.signal == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # TERM and USR1 never abort: they only ask to stop
        time.sleep(0.01)
        assert stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGINT) is previous


# ------------------------------------------------------------------ evaluation

@pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="eager_mode() is a no-op below torch 2.6")
def test_evaluation_does_not_recompile_the_regionally_compiled_model(corpus):
    from accelerate import Accelerator
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    cfg = GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = device.compile_model(GPT(cfg), "regional", backend="eager")
    batch = torch.randint(0, 512, (4, 33))
    model(batch[:, :-1], batch[:, 1:]).backward()  # the training graph: one, shared by both blocks
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    tok = open_tokenizer(corpus / "tok.json").tokenizer
    splits = wos.load_splits(wos.read_corpus(corpus / "X.txt"), 0.2, 0)
    blocks, _ = wos.tokenize_blocks(splits, tok, 33)
    val = budget.evaluate(model, blocks["validation"], Accelerator(cpu=True), 3, 10, 3)  # partial last batch
    assert math.isfinite(val) and counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_term_right_after_a_usr1_checkpoint_still_exits_3(corpus, tmp_path):
    """Slurm's USR1, then a TERM while the process is exiting (seen: 0.3 s later): the handlers stay
    until the process is gone, so it still exits with 3 (gpt.sh requeues on 3), never 143."""
    import threading

    from conftest import start_script, tiny_args, wait_for
    from training.checkpoints import latest_checkpoint
    proc = start_script("gpt_train.py", *tiny_args(corpus, tmp_path / "run", "--tokens", str(3000 * 8 * 32),
                                                   "--ckpt-every", "0"))
    checkpointed = threading.Event()

    def watch():  # the stop message, then everything else (the pipe must not fill up)
        for line in proc.stderr:
            if "checkpointed at step" in line:
                checkpointed.set()

    threading.Thread(target=watch, daemon=True).start()
    assert wait_for(lambda: any((tmp_path / "run").glob("events.out.tfevents.*")), proc=proc)
    time.sleep(0.5)  # the loop is running
    proc.send_signal(signal.SIGUSR1)
    assert checkpointed.wait(120)
    while proc.poll() is None:  # TERMs until it has exited: every moment of its exit gets one
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    assert proc.wait() == metrics.STOP_EXIT_CODE
    assert latest_checkpoint(tmp_path / "run")[0] is not None


# ------------------------------------------------------------------ fp16 loss scaling

def test_a_step_skipped_by_a_real_grad_scaler_with_fused_adamw_is_seen():
    """With a fused AdamW, GradScaler always calls its step (the kernel skips on inf), so accelerate
    reports no skipped step; the scale says it: an inf gradient halves it."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    Accelerator(cpu=True)  # accelerate's state, which its optimizer wrapper needs
    weight = torch.nn.Parameter(torch.ones(4))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    optimizer = AcceleratedOptimizer(torch.optim.AdamW([weight], lr=0.1, fused=True), device_placement=False,
                                     scaler=scaler)
    skips = metrics.SkippedSteps(scaler)
    for grad_is_inf in (True, False, True):
        scaler.scale(weight.sum()).backward()
        if grad_is_inf:
            weight.grad[0] = float("inf")
        before = weight.detach().clone()
        optimizer.step()
        optimizer.zero_grad()
        assert skips.last_skipped() == grad_is_inf and torch.equal(weight, before) == grad_is_inf
    assert scaler.get_scale() == 2.0**10
    assert not metrics.SkippedSteps(None).last_skipped()  # bf16/fp32: no scaler, nothing skipped


# ------------------------------------------------------------------ several processes

def _ddp_rank(rank, port, out_dir):
    """One of two gloo processes, with the environment torchrun would give it: the DDP settings gpt_train asks
    accelerate for, the micro-batch the two agree on (they probed 16 and 8), and the stop agreement."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from accelerate import Accelerator
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=device.ddp_handlers("bf16"))
    model = accelerator.prepare(torch.nn.Linear(8, 8))
    model(torch.ones(2, 8)).sum().backward()  # the bf16 hook runs on gloo
    group = dist.distributed_c10d._get_default_group()
    report = {"hooks": len(model._comm_hooks), "bucket_view": model.gradient_as_bucket_view,
              "timeout_s": group._get_backend(torch.device("cpu")).options._timeout.total_seconds(),
              "grad_finite": bool(torch.isfinite(model.module.weight.grad).all()),
              "micro_batch": budget.agree_on_micro_batch(accelerator, [16, 8][rank])}
    stop = SimpleNamespace(signal=None)
    agree, stopped = lifecycle.StopAgreement(accelerator, stop), {}
    for step in range(1, 9):
        if rank == 1 and step == 3:
            stop.signal = "SIGTERM"  # one process gets the signal during step 3
        if agree(at_sync_point=step == 6) and "lagged" not in stopped:
            stopped["lagged"] = step
    stop.signal = None
    agree = lifecycle.StopAgreement(accelerator, stop)
    stop.signal = "SIGTERM" if rank == 0 else None
    stopped["at_sync_point"] = agree(at_sync_point=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps({**report, **stopped}))
    leave_without_teardown()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The reports of one spawned 2-process job (_ddp_rank), which two tests read."""
    out_dir = tmp_path_factory.mktemp("ranks")
    torch.multiprocessing.spawn(_ddp_rank, args=(free_port(), out_dir), nprocs=2)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_processes_agree_on_the_smallest_probed_micro_batch(two_ranks):
    """Two GPUs of one job may fit different micro-batches; both must train with the smaller one."""
    from accelerate import Accelerator
    assert [report["micro_batch"] for report in two_ranks] == [8, 8]
    assert budget.agree_on_micro_batch(Accelerator(cpu=True), 16) == 16  # one process: its own


@pytest.mark.slow
def test_ddp_all_reduces_in_16_bits_fails_in_minutes_and_agrees_on_the_stop_lagged(two_ranks):
    """bf16 on two processes: the bf16 compression hook is registered and gradients stay in DDP's
    buckets; the process group times out in 5 minutes, not 30; a stop signal on one process stops
    both after the same step, one step later (no host sync on the running step), at once at a sync point."""
    assert two_ranks[0] == two_ranks[1]
    assert two_ranks[0] == {"hooks": 1, "bucket_view": True, "timeout_s": 300.0, "grad_finite": True,
                            "micro_batch": 8, "lagged": 4, "at_sync_point": True}
    assert device.ddp_handlers("fp32")[0].comm_hook.value == "no"  # fp32 training: fp32 gradients


# ------------------------------------------------------------------ runs: what they keep, what they refuse

@pytest.mark.slow
def test_a_finished_run_keeps_final_weights_not_checkpoints_and_its_save_is_not_training_time(corpus, tmp_path,
                                                                                            monkeypatch):
    from conftest import tiny_args
    slow_save = gpt_train.save_final

    def save_final(*args, **kwargs):
        time.sleep(10.0)  # a slow file system: none of it may count as training (the 4 steps: ~0.1-3 s)
        slow_save(*args, **kwargs)

    monkeypatch.setattr(gpt_train, "save_final", save_final)
    metrics_ = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", str(4 * 8 * 32), "--ckpt-every", "1"))
    assert metrics_["train_seconds"] < 10.0
    assert not list((tmp_path / "run").glob("ckpt-*")) and (tmp_path / "run" / "final" / "model.safetensors").is_file()
    kept = gpt_train.main(tiny_args(corpus, tmp_path / "kept", "--tokens", str(4 * 8 * 32), "--ckpt-every", "0",
                                    "--keep-checkpoints"))
    assert [p.name for p in (tmp_path / "kept").glob("ckpt-*")] == ["ckpt-0000004"]  # the last step's
    a, b = (load_file(d / "final" / "model.safetensors") for d in (tmp_path / "run", tmp_path / "kept"))
    assert kept["final_train_loss"] == metrics_["final_train_loss"]
    assert torch.equal(a["transformer.wte.weight"], b["transformer.wte.weight"])


def test_the_stand_in_corpus_is_named_from_its_content(corpus, shared_data, tmp_path):
    import shutil

    from conftest import tiny_args
    text = tmp_path / "X.txt"  # a path that says nothing: the name comes from the content
    shutil.copy(shared_data / "wos-standin" / "X.txt", text)
    metrics_ = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--text", str(text), "--cache-dir",
                                        str(tmp_path / "cache"), "--tokens", str(2 * 8 * 32)))
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics_["corpus"]["name"] == saved["corpus"]["name"] == "stand-in"
    assert saved["corpus"]["documents"] > 1000 and len(saved["corpus"]["sha256"]) == 64


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--metrics-out", "--out-dir"])
def test_no_output_is_an_input(corpus, tmp_path, flag):
    import shutil

    from conftest import run_script, tiny_args
    tokenizer = tmp_path / "tok.json"
    shutil.copy(corpus / "tok.json", tokenizer)
    target = tokenizer
    if flag == "--out-dir":  # the tokenizer's folder as the run directory
        target = tmp_path / "tokfolder"
        target.mkdir()
        shutil.copy(corpus / "tok.json", target / "tokenizer.json")
        tokenizer = target
    result = run_script("gpt_train.py", *tiny_args(corpus, tmp_path / "run", "--tokenizer", str(tokenizer)),
                        flag, str(target))
    assert result.returncode == 1 and "would overwrite --tokenizer" in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1
    assert json.loads((target if flag == "--out-dir" else tmp_path).joinpath(
        "tokenizer.json" if flag == "--out-dir" else "tok.json").read_text())  # untouched: still the tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_refuses_is_one_line(seed):
    from conftest import run_script
    result = run_script("gpt_train.py", "--seed", seed)
    assert result.returncode == 2 and "--seed: must be in [0, 4294967296)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_an_unwritable_compile_cache_is_one_line_before_any_work(corpus, tmp_path):
    from conftest import run_script, tiny_args
    (tmp_path / "file").write_text("x")
    home = tmp_path / "file" / "home"  # as a read-only HOME: nothing can be created under it
    result = run_script("gpt_train.py", *tiny_args(corpus, tmp_path / "run", "--compile", "regional", "--text",
                                                   str(tmp_path / "not-read-yet.txt")),
                        env={**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: --compile-cache {home / '.cache' / 'lab5' / 'torch-compile'}")
    assert "--compile off" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _finished_with_checkpoints(corpus, run_dir):
    from conftest import tiny_args
    common = ["--tokens", str(8 * 8 * 32), "--ckpt-every", "4", "--keep-checkpoints"]
    gpt_train.main(tiny_args(corpus, run_dir, *common))
    (run_dir / "metrics.json").unlink()  # as if cut after its last checkpoint
    newest = sorted(run_dir.glob("ckpt-*[0-9]"))[-1]
    return tiny_args(corpus, run_dir, *common), newest


def _rehash(ckpt):
    """The manifest rewritten over the damage: a file damaged before it was hashed."""
    from data import files
    from data.files import MANIFEST
    manifest = {p.name: {"bytes": p.stat().st_size, "sha256": files.sha256_file(p)}
                for p in sorted(ckpt.iterdir()) if p.is_file() and p.name != MANIFEST}
    files.write_json(ckpt / MANIFEST, manifest)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["pytorch_model.bin", "optimizer.bin", "random_states_0.pkl"])
def test_a_damaged_checkpoint_file_the_manifest_vouches_for_is_named_in_one_line(corpus, tmp_path, victim):
    from conftest import run_script
    args, newest = _finished_with_checkpoints(corpus, tmp_path / "run")
    (newest / victim).write_bytes(b"this is not a checkpoint, " * 40)
    _rehash(newest)
    result = run_script("gpt_train.py", *args)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: checkpoint file {newest / victim} is damaged") and f"delete {newest}" in line


# --------------------------------------------------------------------- a full disk while a checkpoint is written

def test_a_checkpoint_on_a_full_disk_is_one_line_and_the_older_one_stays(tmp_path):
    """A real tmpfs with room for one small checkpoint: the second, larger one fails inside torch's
    C++ writer; the run stops in one line naming the folder, the partial folder is gone, the first
    checkpoint still verifies. Needs mount (root, as in CI); elsewhere skipped with the reason."""
    from accelerate import Accelerator

    from training import checkpoints
    out = tmp_path / "run"
    out.mkdir()
    with tmpfs(out, "3m"):
        accelerator = Accelerator(cpu=True)
        small = accelerator.prepare(torch.nn.Linear(64, 64))
        checkpoints.save_checkpoint(accelerator, out, TrainState(step=1), identity={})
        big = accelerator.prepare(torch.nn.Linear(1024, 1024))  # 4 MiB of weights: more than is left
        accelerator._models[:] = [big]
        with pytest.raises(UserError) as e:
            checkpoints.save_checkpoint(accelerator, out, TrainState(step=2), identity={})
        message = str(e.value)
        assert "\n" not in message and "ckpt-0000002.tmp" in message
        assert f"ckpt-0000001 in {out} is intact: free space there, then run the same command" in message
        assert not (out / "ckpt-0000002.tmp").exists()
        assert checkpoints.latest_checkpoint(out) == (out / "ckpt-0000001", [])
        del small


# ------------------------------------------------------------------ a resume with another micro-batch

def test_a_budget_planned_in_the_first_micro_batch_is_the_same_steps_in_another():
    first = budget.plan_budget(tokens=1050, global_batch=8, micro_batch=4, world=1, seq_len=32)
    again = budget.plan_budget(tokens=1050, global_batch=8, micro_batch=2, world=1, seq_len=32, unit=4)
    assert (first.total_micro, first.total_steps) == (9, 5)  # 36 sequences; the last step one micro-batch of 4
    assert again.total_micro * again.micro_batch == first.total_micro * first.micro_batch == 36
    assert again.total_steps == first.total_steps and again.val_unit == 4 and first.val_unit == 4
    planned_alone = budget.plan_budget(tokens=1050, global_batch=8, micro_batch=2, world=1, seq_len=32)
    assert planned_alone.total_micro * 2 == 36 - 2  # what a resume would have taken without the unit


def test_the_micro_batch_flag_wins_on_a_resume_and_says_so():
    class OneProcess:
        num_processes = 1

    def choose(flag, resumed_micro):
        args = argparse.Namespace(micro_batch=flag, global_batch=8)
        return budget.choose_micro_batch(args, None, OneProcess, "fp32", 8, resumed_micro)
    assert choose(2, resumed_micro=4) == (2, "flag; the checkpoint had 4: same global batch")
    assert choose("auto", resumed_micro=4) == (4, "as the checkpoint")
    assert choose(4, resumed_micro=4) == (4, "flag")


def test_the_data_position_is_recounted_in_the_new_micro_batch():
    from training.checkpoints import continue_position
    state = TrainState(step=5, micro_batches=10)  # 5 steps of 2 micro-batches of 4 = 40 sequences
    assert continue_position(state, {"micro_batch": 4}, 2) == 4 and state.micro_batches == 20
    assert continue_position(state, {"micro_batch": 2, "budget_micro_batch": 4}, 8) == 4  # the first one stays
    assert state.micro_batches == 5
    fresh = TrainState()
    assert continue_position(fresh, {}, 8) == 8 and fresh.micro_batches == 0


def test_a_resume_check_names_every_differing_flag_in_one_line():
    from training.checkpoints import check_same_run
    saved = {"lr": 0.003, "corpus": "aa", "seed": 0, "micro_batch": 8}
    with pytest.raises(UserError) as error:
        check_same_run(saved, {"lr": 0.1, "corpus": "bb", "seed": 0, "warmup": 0.1})  # warmup: not recorded then
    assert str(error.value) == ("the checkpoint was made with lr = 0.003, corpus = aa; this run has lr = 0.1, corpus "
                                "= bb (--lr, --text (its content)): resume with the same settings or pick a new "
                                "--out-dir")
    check_same_run(saved, {"lr": 0.003, "seed": 0})


def test_the_summary_puts_bits_per_byte_beside_the_verdict():
    m = {"tokens_seen": 1000, "train_seconds": 2.0, "process_seconds": 9.5, "tokens_per_second": 500.0, "mfu": None,
         "compile": "off",
         "compile_seconds": None, "final_train_loss": 4.35, "final_val_loss": 4.4, "val_bits_per_byte": 1.8,
         "success": True, "loss_curve": [[i, 5.0] for i in range(9)]}
    assert metrics.summary_line(m).startswith("1,000 tokens in 2.0 s of training loop, 9.5 s end to end (500 tokens/s")
    # the last log line shows one point's loss: the summary's is labelled as the mean it is
    assert "train loss 4.350 (the mean of the last 5 logged points)" in metrics.summary_line(m)
    assert metrics.summary_line(m).endswith("val loss 4.400 -> success: train loss < 7 (val 1.800 bits/byte, "
                                            "comparable across vocabularies; the loss is not)")
    assert "-> NOT a success: train loss >= 7 (val 2.610 bits/byte" in metrics.summary_line(
        {**m, "success": False, "final_train_loss": 7.2, "val_bits_per_byte": 2.61})


