"""gpt_train.py: runs end to end, resume, signals, 2-process DDP (the model on its own: test_model.py;
training/'s other parts: test_training.py)."""
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

import gpt_train
from conftest import REPO, free_port, run_script, start_script, tiny_args, wait_for
from conftest import in_process as main_in_process
from training import metrics as instruments
from training.checkpoints import latest_checkpoint
from training.metrics import STOP_EXIT_CODE

in_process = functools.partial(main_in_process, gpt_train.main)  # in_process(capsys, *args)


# ------------------------------------------------------------------ training runs

def test_tiny_run_learns_and_stops_at_the_budget(corpus, tmp_path, capsys):
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "20000",
                                       "--metrics-out", str(tmp_path / "m.json")))
    assert f"{metrics['steps']}/{metrics['steps']} [" in capsys.readouterr().err  # the progress bar got there
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads((tmp_path / "run" / "metrics.json").read_text())
    per_micro = 4 * 32
    assert metrics["tokens_seen"] == math.ceil(20000 / per_micro) * per_micro  # whole micro-batches, < 1 over
    assert metrics["steps"] == math.ceil(math.ceil(20000 / per_micro) / 2)  # last step: 1 of 2 micro-batches
    curve = [loss for _, loss in metrics["loss_curve"]]
    assert curve[0] > 5.5 and metrics["final_train_loss"] < curve[0] - 1.0  # from ~ln(512) = 6.2 downwards
    assert metrics["success"] and metrics["final_val_loss"] < 6 and metrics["val_bits_per_byte"] > 0
    assert 0 < metrics["train_seconds"] <= metrics["phases"]["loop"] < metrics["process_seconds"]
    assert metrics["process_seconds_total"] == metrics["process_seconds"]  # one process: not resumed
    assert metrics["tokens_per_second"] > 0 and metrics["precision"] == "fp32" and metrics["params"] > 0
    assert metrics["mfu"] is None and metrics["world_size"] == 1 and metrics["vocab_size"] == 512
    assert not list((tmp_path / "run").glob("ckpt-*"))  # a finished run keeps its weights, not the optimizer's
    weights = load_file(tmp_path / "run" / "final" / "model.safetensors")  # GPT2LMHeadModel's names
    config = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert weights["transformer.wte.weight"].shape == (512, 32) and config["n_embd"] == 32
    assert metrics["corpus"]["name"] == "other" and metrics["corpus"]["documents"] == 300  # from the content
    with pytest.raises(SystemExit, match="finished run"):  # never overwritten
        gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "20000"))


@pytest.mark.slow
def test_lab_preset_runs_a_step_on_cpu(corpus, tmp_path):
    metrics = gpt_train.main(["--preset", "lab", "--text", str(corpus / "X.txt"), "--tokenizer",
                              str(corpus / "tok.json"), "--cache-dir", str(corpus / "cache"), "--out-dir",
                              str(tmp_path / "lab"), "--seq-len", "256", "--micro-batch", "1", "--global-batch", "1",
                              "--tokens", "256", "--compile", "off", "--val-batches", "1", "--ckpt-every", "0",
                              "--val-fraction", "0.05"])
    assert metrics["steps"] == 1 and metrics["tokens_seen"] == 256
    assert 85e6 < metrics["params"] < 87e6  # 124M structure with a 512-token vocabulary
    assert math.isfinite(metrics["final_train_loss"])


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_equals_uninterrupted(corpus, tmp_path):
    # 300 docs make ~115 blocks: 28 micro-batches per epoch; 60 steps x 2 = 120 micro-batches = 4+ epochs.
    common = ["--tokens", str(60 * 8 * 32), "--ckpt-every", "20", "--log-every", "1"]
    reference = gpt_train.main(tiny_args(corpus, tmp_path / "ref", *common))

    proc = start_script("gpt_train.py", *tiny_args(corpus, tmp_path / "cut", *common))
    wait_for(lambda: list((tmp_path / "cut").glob("ckpt-0000020")), proc=proc)
    proc.send_signal(signal.SIGTERM)  # past the first epoch: step 20 = micro-batch 40 of 28 per epoch
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE, err
    ckpt, skipped = latest_checkpoint(tmp_path / "cut")
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


@pytest.mark.slow
def test_two_processes_match_one_for_the_same_global_batch(corpus, tmp_path):
    steps = 80  # past the first epoch's end: the corpus has 509 blocks, 63 global batches of 8
    args = tiny_args(corpus, tmp_path / "one", "--tokens", str(steps * 8 * 32), "--fused-adamw", "off")
    single = gpt_train.main(args)
    two = tiny_args(corpus, tmp_path / "two", "--tokens", str(steps * 8 * 32), "--fused-adamw", "off",
                    "--metrics-out", str(tmp_path / "two.json"))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(free_port()), str(REPO / "gpt_train.py"), *two],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    double = json.loads((tmp_path / "two.json").read_text())
    assert double["world_size"] == 2 and double["tokens_seen"] == single["tokens_seen"]
    for (s1, l1), (s2, l2) in zip(single["loss_curve"], double["loss_curve"]):
        assert s1 == s2 and l2 == pytest.approx(l1, rel=1e-4)


def test_a_skipped_fp16_step_does_not_advance_the_lr_schedule(corpus, tmp_path, monkeypatch):
    """GradScaler skips a step whose gradients overflowed (fp16 only, so on a GPU); the schedule must
    not count it. Here the loop is told of three skipped steps; that the scale tells them, with a real
    GradScaler and a fused AdamW, is test_training's test_a_step_skipped_by_a_real_grad_scaler..."""
    reports = iter([True] * 3)
    monkeypatch.setattr(instruments.SkippedSteps, "last_skipped", lambda self: next(reports, False))
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", str(10 * 8 * 32), "--keep-checkpoints"))
    state = json.loads((latest_checkpoint(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert state["step"] == 10 and state["lr_step"] == 7 and metrics["skipped_steps"] == 3  # counted in the metrics


# ------------------------------------------------------------------ errors a user can cause

@pytest.mark.parametrize("args, message", [
    pytest.param(["--seq-len", "2048"], "exceeds GPT-2's 1024", marks=pytest.mark.slow),  # as a user runs it
    (["--tokens", "0"], "--tokens: must be in [1, 10000000000000], got 0"),
    (["--n-embd", "100", "--n-head", "3"], "not divisible"),
    (["--precision", "fp8"], "invalid choice"),
])
def test_bad_flags(args, message, capsys):
    result = run_script("gpt_train.py", *args) if "2048" in args else in_process(capsys, *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("case", ["--global-batch", "--text"])  # one a test: each starts its own accelerator
def test_user_errors_are_one_line(corpus, tmp_path, capsys, case, monkeypatch):
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # on a GPU the lab preset sets them (compile):
        monkeypatch.delenv(variable, raising=False)  # undone after the test, as the process's exit did
    if case == "--global-batch":
        result = in_process(capsys, *tiny_args(corpus, tmp_path / "x", "--global-batch", "6"))
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("error: --global-batch 6")
    else:
        result = in_process(capsys, "--text", tmp_path / "missing.txt")
        assert result.returncode == 1
        assert result.stderr.strip() == f"error: --text {tmp_path / 'missing.txt'}: no such file"


# ------------------------------------------------------------------ the Slurm launcher, without Slurm

@pytest.mark.slow
def test_slurm_script_forwards_flags_and_usr1_checkpoints(corpus, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(["bash", str(REPO / "slurm" / "gpt.sh"),
                             *tiny_args(corpus, tmp_path / "run", "--tokens", str(400 * 8 * 32), "--ckpt-every", "5",
                                        "--log-every", "1")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: list((tmp_path / "run").glob("ckpt-*[0-9]")), proc=proc)
    proc.send_signal(signal.SIGUSR1)  # what Slurm sends the batch shell 90 s before the limit
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE, err[-2000:]
    assert "USR1: checkpointing" in out and "run again with --out-dir" in err
    assert f"out {tmp_path / 'run'}" in out  # the log names the folder the flags chose, not the default
    state = json.loads((latest_checkpoint(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert 0 < state["step"] < 400


# ------------------------------------------------------------------ budget, micro-batch, throughput


def test_cpu_micro_batch_auto_takes_the_preset_within_the_share(corpus, tmp_path):
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", str(4 * 8 * 32), "--micro-batch", "auto",
                                       "--global-batch", "4"))
    assert metrics["micro_batch"] == 4 and metrics["global_batch"] == 4  # preset 8, share only 4


def test_batches_come_without_worker_processes(corpus, tmp_path, monkeypatch):
    seen = []
    from training import budget as batches
    original = batches.epoch_loader

    def spy(*args, **kwargs):
        seen.append(kwargs.get("num_workers", 0))
        return original(*args, **kwargs)

    monkeypatch.setattr(batches, "epoch_loader", spy)
    # 300 docs ~ 115 blocks ~ 28 micro-batches per epoch: 40 steps x 2 cross 2 epoch boundaries
    gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", str(40 * 8 * 32)))
    assert len(seen) >= 3 and set(seen) == {0}


# ------------------------------------------------------------------ never lose a run

def wait_for_events(run_dir, n, timeout=120):
    """Until the run's n-th TensorBoard file exists (one per start), then a moment: the loop is running."""
    wait_for(lambda: len(list(run_dir.glob("events.out.tfevents.*"))) >= n, timeout, poll=0.05)
    time.sleep(0.5)


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_a_second_one_aborts(corpus, tmp_path):
    args = tiny_args(corpus, tmp_path / "run", "--tokens", str(3000 * 8 * 32), "--ckpt-every", "0", "--log-every", "1")
    proc = start_script("gpt_train.py", *args)
    wait_for_events(tmp_path / "run", 1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE and "Traceback" not in err, err[-2000:]
    assert "Ctrl-C: checkpointing" in err and f"--out-dir {tmp_path / 'run'} to resume" in err
    assert latest_checkpoint(tmp_path / "run")[0] is not None


@pytest.mark.slow
def test_ctrl_c_through_the_slurm_script_without_slurm(corpus, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(["bash", str(REPO / "slurm" / "gpt.sh"),
                             *tiny_args(corpus, tmp_path / "run", "--tokens", str(3000 * 8 * 32), "--ckpt-every", "0")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    wait_for_events(tmp_path / "run", 1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE, err[-2000:]
    assert latest_checkpoint(tmp_path / "run")[0] is not None


@pytest.mark.slow
def test_usr1_during_start_up_is_not_lost(corpus, tmp_path):
    proc = start_script("gpt_train.py", *tiny_args(corpus, tmp_path / "run", "--tokens", str(400 * 8 * 32)))
    time.sleep(0.3)  # Python is still importing torch
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE, (proc.returncode, err[-2000:])  # not killed (-10)
    state = json.loads((latest_checkpoint(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert state["step"] == 1


@pytest.mark.slow
def test_usr1_to_the_launcher_as_python_starts_is_not_lost(corpus, tmp_path):
    """Slurm's warning reaching gpt.sh the moment it has started Python (before gpt_train.py's first lines can
    catch it): Python is not killed unsaved (138, no requeue); the run checkpoints and exits 3."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(["bash", str(REPO / "slurm" / "gpt.sh"),
                             *tiny_args(corpus, tmp_path / "run", "--tokens", str(400 * 8 * 32))],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    def python_started():
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                if b"gpt_train.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return True
        return False
    assert wait_for(python_started, timeout=30, poll=0.001, proc=proc)  # exec'd, its imports not yet begun
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE and "USR1: checkpointing" in out, (proc.returncode, err[-2000:])
    assert latest_checkpoint(tmp_path / "run")[0] is not None


def make_unfinished_run(corpus, run_dir, *extra):
    """A run stopped at its last checkpoint: the finished run minus its metrics (as if cut just before)."""
    common = ["--tokens", str(12 * 8 * 32), "--ckpt-every", "4", "--log-every", "1", "--keep-checkpoints", *extra]
    reference = gpt_train.main(tiny_args(corpus, run_dir, *common))
    (run_dir / "metrics.json").unlink()
    return reference, common


@pytest.fixture(scope="module")
def pristine_unfinished_run(corpus, tmp_path_factory):
    """make_unfinished_run's run, trained once for the tests that resume it (each resumes its own copy)."""
    run_dir = tmp_path_factory.mktemp("unfinished") / "run"
    return run_dir, *make_unfinished_run(corpus, run_dir)


@pytest.fixture
def unfinished_run(pristine_unfinished_run):
    """A copy of the unfinished run: unfinished_run(run_dir) puts it there -> (the reference metrics, its flags)."""
    pristine, reference, common = pristine_unfinished_run

    def copy(run_dir):
        shutil.copytree(pristine, run_dir)
        return reference, common
    return copy


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(corpus, tmp_path, capsys, unfinished_run):
    reference, common = unfinished_run(tmp_path / "run")
    newest, previous = sorted((tmp_path / "run").glob("ckpt-*[0-9]"), reverse=True)
    model_file = next(newest.glob("pytorch_model*.bin"))
    model_file.write_bytes(model_file.read_bytes()[:1000])  # truncated
    capsys.readouterr()  # the reference run's output
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common))
    captured = capsys.readouterr()
    assert f"skipping checkpoint {newest.name}: {model_file.name} has 1000 bytes" in captured.err
    assert f"resuming at step 8 from {previous}" in captured.out and resumed["resumed"]
    assert resumed["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-6)


def test_a_damaged_trainer_state_is_skipped(corpus, tmp_path, unfinished_run):
    reference, common = unfinished_run(tmp_path / "run")
    newest = sorted((tmp_path / "run").glob("ckpt-*[0-9]"))[-1]
    (newest / "trainer_state.json").write_text('{"step": 1')
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common))
    assert resumed["resumed"] and resumed["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-6)


@pytest.mark.parametrize("change, message", [
    (["--tokens", str(13 * 8 * 32)], "tokens = 3072"),
    (["--n-embd", "64"], "n_embd = 32"),
    (["--global-batch", "16"], "global_batch = 8"),
    (["--tokenizer", "OTHER"], "tokenizer = "),
])
def test_a_resume_with_other_settings_is_refused_in_one_line(corpus, tmp_path, change, message, unfinished_run,
                                                             capsys):
    _, common = unfinished_run(tmp_path / "run")
    if change[-1] == "OTHER":  # another tokenizer with the same vocabulary size
        import tokenizer_train
        from conftest import generated_docs
        other = tokenizer_train.train_bpe(generated_docs(300, seed=7), vocab_size=512)
        tokenizer_train.save_atomic(other, tmp_path / "other.json")
        change = ["--tokenizer", str(tmp_path / "other.json")]
    result = in_process(capsys, *tiny_args(corpus, tmp_path / "run", *common), *change)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: the checkpoint was made with " + message)


def test_gpt2s_tokenizer_from_its_folder_end_to_end_with_resume(corpus, shared_data, tmp_path):
    from data.tokenizer import open_tokenizer
    gpt2 = shared_data / "gpt2-tokenizer"  # the folder AutoTokenizer.from_pretrained takes
    reference, common = make_unfinished_run(corpus, tmp_path / "run", "--tokenizer", str(gpt2))
    assert reference["vocab_size"] == 50304 and math.isfinite(reference["final_val_loss"])  # 50,257 padded
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common))
    assert resumed["resumed"] and resumed["vocab_size"] == 50304
    assert resumed["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-6)
    caches = {p.name[:26] for p in (corpus / "cache").rglob("packed-v1-*")}  # one token cache per tokenizer
    own, theirs = (open_tokenizer(t).sha256[:16] for t in (corpus / "tok.json", gpt2))
    assert f"packed-v1-{theirs}" in caches and own != theirs


def test_the_own_tokenizer_as_a_file_or_its_folder_is_the_same_run(corpus, tmp_path, unfinished_run):
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(corpus / "tok.json", folder / "tokenizer.json")
    reference, common = unfinished_run(tmp_path / "run")  # started with the file
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common, "--tokenizer", str(folder)))
    assert resumed["resumed"] and resumed["vocab_size"] == 512  # the run identity keys the tokenizer's content
    assert resumed["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-6)


def test_a_second_run_on_the_same_directory_is_refused(corpus, tmp_path, capsys):
    from training.rundir import RunLock
    with RunLock(tmp_path / "run"):  # the first run, still going (flock: another open file is another holder)
        result = in_process(capsys, *tiny_args(corpus, tmp_path / "run"))
    assert result.returncode == 1
    assert f"{tmp_path / 'run'} is in use by another run (pid {os.getpid()})" in result.stderr
    assert not list((tmp_path / "run").glob("ckpt-*"))


@pytest.mark.parametrize("flag, make, message", [
    ("--metrics-out", lambda p: (p / "file").write_text("x") and p / "file" / "m.json", "cannot be written"),
    ("--metrics-out", lambda p: (p / "folder").mkdir() or p / "folder", "is a folder"),
    ("--out-dir", lambda p: (p / "file").write_text("x") and p / "file", "is a file, not a folder"),
])
def test_unwritable_outputs_fail_before_any_work(corpus, tmp_path, flag, make, message, capsys):
    target = make(tmp_path)
    args = tiny_args(corpus, tmp_path / "run", "--text", str(tmp_path / "not-read-yet.txt"), flag, str(target))
    result = in_process(capsys, *args)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_float_flags_reject_non_finite_values(value, capsys):
    result = in_process(capsys, f"--lr={value}")
    assert result.returncode == 2 and "expected a finite number" in result.stderr


@pytest.mark.slow
def test_stop_reaches_every_rank_within_one_step(corpus, tmp_path):
    """TERM to one rank of two: both checkpoint the same step, at most one step after the newest
    checkpoint there was when the signal came (a checkpoint every step), and both exit with 3."""
    port, run_dir = free_port(), tmp_path / "run"
    args = tiny_args(corpus, run_dir, "--tokens", str(3000 * 8 * 32), "--ckpt-every", "1", "--log-every", "1000")
    ranks = [start_script("gpt_train.py", *args, env={**os.environ, "RANK": str(rank),
                                                      "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for rank in (0, 1)]
    assert wait_for(lambda: latest_checkpoint(run_dir)[0], proc=ranks[0])
    newest_before = int(max(run_dir.glob("ckpt-*[0-9]")).name.removeprefix("ckpt-"))  # a glob: microseconds
    ranks[1].send_signal(signal.SIGTERM)  # one rank only: the other must learn of it at the next step
    errs = [proc.communicate(timeout=120)[1] for proc in ranks]
    assert [proc.returncode for proc in ranks] == [STOP_EXIT_CODE] * 2, errs[0][-2000:] + errs[1][-2000:]
    stopped = json.loads((latest_checkpoint(run_dir)[0] / "trainer_state.json").read_text())["step"]
    # the signal lands in step newest_before + 1 (or in its checkpoint): noticed there or at the next step
    assert newest_before < stopped <= newest_before + 2 and f"checkpointed at step {stopped}" in errs[0]


def test_a_preset_sets_the_defaults_and_flags_override_them():
    tiny = gpt_train.parse_args(["--preset", "tiny", "--n-embd", "32"])
    shape = (tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.seq_len, tiny.global_batch, tiny.lr)
    assert shape == (2, 2, 32, 64, 16, 3e-3)
    lab = gpt_train.parse_args([])
    assert (lab.n_layer, lab.n_embd, lab.seq_len, lab.global_batch, lab.lr) == (12, 768, 1024, 64, 1e-3)
    assert lab.micro_batch == "auto"  # the preset's micro-batch is looked up when needed, not stored in args


@pytest.mark.parametrize("flag", ["--tf32", "--attention", "--min-lr-ratio", "--resume"])
def test_flags_nobody_used_are_gone(flag, capsys):
    result = in_process(capsys, flag, "x")
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr


# ------------------------------------------------------------------ the run directory, the run identity

@pytest.mark.parametrize("where", ["root", "repository", "lenet run", "stranger"])
def test_an_out_dir_that_is_not_gpt_trains_is_refused_before_any_work(corpus, tmp_path, where, capsys):
    folder = {"root": Path("/"), "repository": REPO, "lenet run": tmp_path / "lenet", "stranger": tmp_path / "s"}[where]
    if where in ("lenet run", "stranger"):
        folder.mkdir()
        (folder / "args.json").write_text('{"act": "torch"}')
        if where == "lenet run":
            (folder / "run.owner").write_text("lenet5.py\n")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(SystemExit) as stop:
        gpt_train.main(tiny_args(corpus, folder, "--tokens", "2000"))
    assert str(stop.value).startswith(f"error: --out-dir {folder} is not empty: it holds ")
    assert "\n" not in str(stop.value) and sorted(p.name for p in folder.iterdir()) == before  # nothing written
    assert "GPT-2" not in capsys.readouterr().out  # refused before the set-up line


def test_an_empty_out_dir_is_refused_not_the_current_folder(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        gpt_train.main(tiny_args(corpus, "", "--tokens", "2000"))
    assert stop.value.code == 2 and "--out-dir: an empty path" in capsys.readouterr().err


def test_a_failed_start_leaves_no_run_folder(corpus, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no such file"):
        gpt_train.main(tiny_args(corpus, tmp_path / "run", "--text", str(tmp_path / "missing.txt")))
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(gpt_train, "REPO", tmp_path / "repo")  # the default folder, runs/gpt/<time>-<id>/
    args = [a for a in tiny_args(corpus, "x", "--text", str(tmp_path / "missing.txt")) if a != "x"]
    args.remove("--out-dir")
    with pytest.raises(SystemExit, match="no such file"):
        gpt_train.main(args)
    assert list((tmp_path / "repo" / "runs" / "gpt").iterdir()) == []


def test_a_resume_names_every_flag_that_changes_the_run(corpus, tmp_path, unfinished_run):
    reference, common = unfinished_run(tmp_path / "run")
    other = tmp_path / "other.txt"
    other.write_text((corpus / "X.txt").read_text() + "One more document.\n")
    for change, names in [(["--text", str(other)], "corpus = "), (["--val-fraction", "0.2"], "val_fraction = 0.005"),
                          (["--lr", "0.1", "--warmup", "0.2"], "lr = 0.003, warmup = 0.1; this run has lr = 0.1, "
                                                               "warmup = 0.2 (--lr, --warmup)"),
                          (["--grad-clip", "0.5"], "grad_clip = 1.0"), (["--seed", "1"], "seed = 0")]:
        with pytest.raises(SystemExit) as stop:
            gpt_train.main(tiny_args(corpus, tmp_path / "run", *common, *change))
        assert str(stop.value).startswith("error: the checkpoint was made with " + names), str(stop.value)
        assert "\n" not in str(stop.value)
    same_text = tmp_path / "copy" / "X.txt"  # the corpus is its content, not its path; logging is free
    same_text.parent.mkdir()
    same_text.write_bytes((corpus / "X.txt").read_bytes())
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common, "--text", str(same_text),
                                       "--eval-every", "3", "--sample-tokens", "0"))
    assert resumed["resumed"] and resumed["final_train_loss"] == pytest.approx(reference["final_train_loss"], rel=1e-6)


def test_a_resume_with_another_micro_batch_continues_the_same_data(corpus, tmp_path, capsys, unfinished_run):
    reference, common = unfinished_run(tmp_path / "run")  # micro-batch 4, global batch 8: 2 per step
    for late in sorted((tmp_path / "run").glob("ckpt-*[0-9]"))[1:]:
        shutil.rmtree(late)  # resumed from step 4: 8 steps in micro-batches of 2 (accumulation 4)
    capsys.readouterr()
    resumed = gpt_train.main(tiny_args(corpus, tmp_path / "run", *common, "--micro-batch", "2"))
    assert "micro 2 [flag; the checkpoint had 4: same global batch] x 1 x accum 4" in capsys.readouterr().out
    assert resumed["resumed"] and resumed["micro_batch"] == 2
    assert (resumed["tokens_seen"], resumed["steps"]) == (reference["tokens_seen"], reference["steps"])
    ref_curve, cut_curve = dict(reference["loss_curve"]), dict(resumed["loss_curve"])
    assert len(ref_curve) == 12
    for step in range(5, 13):  # the same sequences in each step: the same losses, up to summation order
        assert cut_curve[step] == pytest.approx(ref_curve[step], rel=1e-5), step
    assert resumed["final_val_loss"] == pytest.approx(reference["final_val_loss"], rel=1e-5)  # the same sequences


def test_flags_that_make_no_sense_are_refused(capsys):
    for flags, message in [(["--grad-clip", "0"], "--grad-clip: must be > 0 (0 clips every gradient to nothing)"),
                           (["--grad-clip", "-1"], "--grad-clip"),
                           (["--warmup", "1.5"], "--warmup: must be in [0, 1)"), (["--warmup", "-0.1"], "--warmup"),
                           (["--ckpt-every", "-1"], "--ckpt-every: must be >= 0"),
                           (["--sample-tokens", "-1"], "--sample-tokens: must be in [0, 1024]"),
                           (["--sample-tokens", "10000000"], "--sample-tokens: must be in [0, 1024], got 10000000"),
                           (["--tokens", str(10**400)],
                            "--tokens: must be in [1, 10000000000000], got 100000000000...(401 digits)"),
                           (["--val-fraction", "0"], "--val-fraction: must be in (0, 0.5)"),
                           (["--weight-decay", "-0.1"], "--weight-decay: must be >= 0")]:
        with pytest.raises(SystemExit) as stop:
            gpt_train.parse_args(flags)
        assert stop.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1], flags


# ------------------------------------------------------------------ never lose a run

def test_a_full_disk_at_final_keeps_the_metrics_and_says_what_remains(corpus, tmp_path, monkeypatch):
    """No checkpoint (--ckpt-every 0): the metrics are written before final/, and the message says so and
    that no checkpoint holds the weights, never 'run the same command to resume'."""
    from training import final

    def full(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(final, "write_final", full)
    run, kept = tmp_path / "run", tmp_path / "other-disk" / "m.json"
    with pytest.raises(SystemExit) as stop:
        gpt_train.main(tiny_args(corpus, run, "--tokens", "2048", "--ckpt-every", "0", "--metrics-out", str(kept)))
    message = str(stop.value.code)
    assert "\n" not in message and "writing the final weights" in message and "No space left on device" in message
    assert f"the metrics are in {run / 'metrics.json'}" in message and "no checkpoint holds the weights" in message
    assert "resume" not in message
    assert json.loads(kept.read_text())["steps"] == json.loads((run / "metrics.json").read_text())["steps"] == 8
    assert not (run / "final").exists() and not (run / "final.tmp").exists()


def test_a_rerun_into_a_failed_attempts_folder_keeps_the_attempt_apart(corpus, tmp_path, capsys):
    """A killed attempt that never checkpointed left args.json and events: the new run's are its own, the
    old ones are kept in earlier-attempt-*/ (TensorBoard shows them as another run, never mixed in)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.owner").write_text("gpt_train.py\n")
    (run / "args.json").write_text('{"lr": 99}')
    (run / "events.out.tfevents.1.old").write_bytes(b"")
    gpt_train.main(tiny_args(corpus, run, "--tokens", "2048", "--lr", "2e-3"))
    aside = list(run.glob("earlier-attempt-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["args.json", "events.out.tfevents.1.old"]
    assert json.loads((run / "args.json").read_text())["lr"] == 2e-3
    assert "earlier attempt" in capsys.readouterr().err
    steps = [e.step for e in EventAccumulator(str(run)).Reload().Scalars("loss/train")]
    assert steps == sorted(set(steps))  # one run's points, each once


def test_the_loss_window_a_checkpoint_saves_is_every_processs_mean():
    """With several processes each holds its own partial sum; every one restores the saved value, so it
    must be their mean (the first log point after a resume then averages as an uninterrupted run's)."""
    import torch

    from training.metrics import LossWindow

    class TwoRanks:  # this rank's sum is 1.0, the other's 3.0
        def reduce(self, tensor, reduction):
            assert reduction == "mean"
            return (tensor + torch.tensor(3.0)) / 2
    window = LossWindow([0.0, 0], "cpu")
    window.add(torch.tensor(1.0))
    window.steps = 1
    assert window.saved(TwoRanks()) == [2.0, 1]


def test_final_weights_are_written_before_the_samples_and_a_stop_ends_the_samples(corpus, tmp_path, monkeypatch):
    """The final samples come after final/ (a job cut short while sampling has its weights), and a stop
    signal ends them early, keeping what was generated."""
    from training import final
    seen = {}
    real = final.greedy_and_sampled

    def stopping(model, idx, new_tokens, generator, vocab_size, stop=None):
        seen["final"] = (tmp_path / "run" / "final" / "model.safetensors").is_file()
        stop.signal = "SIGUSR1"  # Slurm's warning arrives as sampling starts
        return real(model, idx, new_tokens, generator, vocab_size, stop)
    monkeypatch.setattr(final, "greedy_and_sampled", stopping)
    metrics = gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokens", "2048", "--sample-tokens", "1024"))
    assert seen["final"] and metrics["samples"]["new_tokens"] == 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["samples"]["new_tokens"] == 0


def test_tensorboard_on_a_full_disk_mid_run_is_one_line_with_what_remains(corpus, tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter
    real = SummaryWriter.add_scalar

    def failing(self, tag, value, step=None, *a, **kw):
        if step is not None and step >= 6:  # the disk filled during the run, after the step-4 checkpoint
            raise OSError(28, "No space left on device")
        return real(self, tag, value, step, *a, **kw)
    monkeypatch.setattr(SummaryWriter, "add_scalar", failing)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        gpt_train.main(tiny_args(corpus, run, "--tokens", "4096", "--ckpt-every", "4"))
    message = str(stop.value.code)
    assert message.startswith(f"error: writing TensorBoard events in {run} failed (No space left on device)")
    assert "ckpt-0000004 in" in message and "run the same command to resume from it" in message


def test_a_model_that_cannot_fit_is_refused_before_the_data_is_read(corpus, tmp_path):
    result = run_script("gpt_train.py", *tiny_args(corpus, tmp_path / "run", "--n-embd", "1073741824", "--n-head", "1",
                                                   "--cache-dir", str(tmp_path / "cache")))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: a model of --n-layer 2 --n-embd 1073741824")
    assert "GiB for its weights, gradients and AdamW alone" in result.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()  # no data read, no folder left


def test_too_few_blocks_for_one_global_batch_leaves_no_folder(corpus, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(SystemExit, match="training blocks are fewer than one global batch"):
        gpt_train.main(tiny_args(corpus, run, "--global-batch", "4096", "--micro-batch", "4"))
    assert not run.exists()  # no args.json, no empty event file
