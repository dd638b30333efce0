"""The launchers under a real Slurm cluster (tests/slurm_cluster.py): sbatch as a student types it.

The test cluster's nodes have one GPU slot each but no real GPU, so the single-process launchers get
`--gres=none` on the command line, as a student would on a CPU partition; gpt_multi.sh runs with its
own default (one GPU a node) and so one CPU process a node. Everything else is the scripts as committed.
"""
import json
import os
import subprocess
import time

import pytest

import gpt_train
from conftest import REPO, tiny_args
from training.checkpoints import latest_checkpoint


def log_of(job):
    return open(job["StdOut"]).read()


def why(job, slurm):
    """A failed job's log with its error lines first (a long traceback would hide them), then the
    daemons' logs (a step that a node refused to launch shows only there)."""
    log = log_of(job)
    errors = [line for line in log.splitlines() if "rror" in line or "exit" in line or "signal" in line]
    return "\n".join(errors[:30]) + "\n--- the job's log:\n" + log + "\n" + slurm.logs()


def wait_for_file(pattern_dir, pattern, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = sorted(pattern_dir.glob(pattern))
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"no {pattern} in {pattern_dir} after {timeout} s")


@pytest.mark.slow
def test_plain_sbatch_lenet_runs_on_the_default_partition(slurm, tiny_mnist, tmp_path):
    job_id = slurm.sbatch("--gres=none", "slurm/lenet.sh", "--epochs", "1", "--data-dir", tiny_mnist,
                          "--no-download", "--out-dir", tmp_path / "run", "--metrics-out", tmp_path / "m.json",
                          cwd=REPO)
    job = slurm.wait(job_id)
    try:
        assert job["JobState"] == "COMPLETED" and job["Partition"] == "normal", why(job, slurm)
        assert job["StdOut"] == str(REPO / "runs" / "slurm" / f"lenet5-{job_id}.out")
        metrics = json.loads((tmp_path / "m.json").read_text())
        assert metrics["epochs"] == 1 and metrics["test_accuracy"] > 0.5
    finally:
        (REPO / "runs" / "slurm" / f"lenet5-{job_id}.out").unlink(missing_ok=True)


@pytest.mark.slow
def test_paths_are_read_from_the_submit_folder_on_the_debug_queue(slurm, tiny_mnist, tmp_path):
    assert tiny_mnist == tmp_path / "mnist"  # relative paths below, from a folder that is not the repo
    job_id = slurm.sbatch("-p", "debug", "--gres=none", "-o", "%x-%j.out", REPO / "slurm" / "lenet.sh",
                          "--epochs", "1", "--data-dir", "mnist", "--no-download", "--out-dir", "run",
                          "--metrics-out", "out/m.json", cwd=tmp_path)
    job = slurm.wait(job_id)
    assert job["JobState"] == "COMPLETED" and job["Partition"] == "debug", why(job, slurm)
    assert (tmp_path / "out" / "m.json").exists() and (tmp_path / "run" / "metrics.json").exists()
    assert f"cwd {tmp_path}" in log_of(job)


@pytest.mark.slow
def test_sbatch_tokenizer_trains_and_caches_the_blocks(slurm, corpus, tmp_path):
    job_id = slurm.sbatch("-o", tmp_path / "%x-%j.out", "slurm/tokenizer.sh", "--text", corpus / "X.txt",
                          "--vocab-size", "512", "--out", tmp_path / "tok.json", "--seq-len", "32", "--cache-dir",
                          tmp_path / "cache", "--compare", "none", "--metrics-out", tmp_path / "m.json", cwd=REPO)
    job = slurm.wait(job_id)
    assert job["JobState"] == "COMPLETED" and job["Partition"] == "normal", why(job, slurm)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["vocab_size"] == 512 and metrics["val_round_trip_failures"] == 0 and metrics["num_train_tokens"] > 0
    assert (tmp_path / "tok.json").exists() and any((tmp_path / "cache").iterdir())


@pytest.mark.slow
def test_usr1_checkpoints_requeues_resumes_and_keeps_one_log(slurm, corpus, tmp_path):
    common = ["--tokens", str(300 * 8 * 32), "--log-every", "1"]  # ~300 tiny steps: the signal lands mid-run
    job_id = slurm.sbatch("--gres=none", "-o", tmp_path / "%x-%j.out", "slurm/gpt.sh",
                          *tiny_args(corpus, tmp_path / "cut", *common, "--ckpt-every", "5"), cwd=REPO)
    wait_for_file(tmp_path / "cut", "ckpt-*[0-9]")
    slurm.run("scancel", "--batch", "--signal=USR1", str(job_id))  # what --signal=B:USR1@90 delivers
    job = slurm.wait(job_id, timeout=300, states=("COMPLETED",))  # not FAILED on the way (a requeue race)
    log = log_of(job)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", log + slurm.logs()
    assert "USR1: checkpointing" in log and "requeueing job" in log
    assert "(restart 0)" in log and "(restart 1)" in log  # both parts in the one file

    cut = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    reference = gpt_train.main(tiny_args(corpus, tmp_path / "ref", *common, "--ckpt-every", "0"))
    assert cut["resumed"] and cut["tokens_seen"] == reference["tokens_seen"]
    assert cut["final_train_loss"] == pytest.approx(reference["final_train_loss"], abs=1e-3)


@pytest.mark.slow
def test_scancel_leaves_a_resumable_checkpoint(slurm, corpus, tmp_path):
    args = tiny_args(corpus, tmp_path / "run", "--tokens", str(1000 * 8 * 32), "--ckpt-every", "0")
    job_id = slurm.sbatch("--gres=none", "-o", tmp_path / "%x-%j.out", "slurm/gpt.sh", *args, cwd=REPO)
    wait_for_file(tmp_path / "run", "events.out.tfevents.*")  # the loop has started
    time.sleep(1)
    slurm.run("scancel", str(job_id))  # TERM to every process of the job
    job = slurm.wait(job_id)
    assert job["JobState"] == "CANCELLED" and job["Restarts"] == "0", why(job, slurm)
    state = json.loads((latest_checkpoint(tmp_path / "run")[0] / "trainer_state.json").read_text())
    assert 0 < state["step"] < 1000  # --ckpt-every 0: only the signal wrote it
    resumed = gpt_train.main(args)
    assert resumed["resumed"] and resumed["steps"] == 1000


@pytest.mark.slow
def test_two_nodes_one_gpu_each_by_default_match_one_process(slurm, corpus, tmp_path):
    """gpt_multi.sh as its header's first line submits it: 2 nodes x 1 GPU (a course cluster's nodes,
    where the old default of 4 GPUs a node is refused at submission)."""
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        slurm.sbatch("--gres=gpu:4", "-o", tmp_path / "%x-%j.out", "slurm/gpt_multi.sh", cwd=REPO)
    common = ["--tokens", str(12 * 8 * 32), "--fused-adamw", "off"]
    job_id = slurm.sbatch("-o", tmp_path / "%x-%j.out", "slurm/gpt_multi.sh",
                          *tiny_args(corpus, tmp_path / "two", *common), cwd=REPO)
    job = slurm.wait(job_id)
    assert job["JobState"] == "COMPLETED", why(job, slurm)
    assert "GPUs 0," in log_of(job) and "x 1 processes" in log_of(job)  # one GPU granted a node, one rank each
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    one = gpt_train.main(tiny_args(corpus, tmp_path / "one", *common))
    assert two["world_size"] == 2 and job["NumNodes"] == "2" and two["tokens_seen"] == one["tokens_seen"]
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], abs=1e-3)


@pytest.mark.slow
def test_two_nodes_usr1_checkpoint_requeue_and_resume(slurm, corpus, tmp_path):
    common = ["--tokens", str(300 * 8 * 32), "--fused-adamw", "off", "--log-every", "1"]
    job_id = slurm.sbatch("--nodes=2", "--gres=none", "-o", tmp_path / "%x-%j.out", "slurm/gpt_multi.sh",
                          *tiny_args(corpus, tmp_path / "two", *common, "--ckpt-every", "5"), cwd=REPO)
    wait_for_file(tmp_path / "two", "ckpt-*[0-9]")
    slurm.run("scancel", "--batch", "--signal=USR1", str(job_id))  # the batch shell: it stops the ranks
    job = slurm.wait(job_id, timeout=300, states=("COMPLETED",))
    log = log_of(job)
    assert job["Restarts"] == "1" and "USR1: checkpointing" in log and "(restart 1)" in log, why(job, slurm)
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    one = gpt_train.main(tiny_args(corpus, tmp_path / "one", *common, "--ckpt-every", "0"))
    assert two["resumed"] and two["world_size"] == 2 and two["tokens_seen"] == one["tokens_seen"]
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], abs=1e-3)


@pytest.mark.slow
def test_launchers_run_from_a_repository_path_with_a_space(slurm, tiny_mnist, tmp_path):
    """Slurm records the submitted path and the arguments in one field, joined by spaces: the launcher
    must find itself (and common.sh beside it) in "lab 5/slurm/", not in "lab"."""
    (tmp_path / "lab 5").symlink_to(REPO)
    job_id = slurm.sbatch("--gres=none", "-o", tmp_path / "%x-%j.out", tmp_path / "lab 5" / "slurm" / "lenet.sh",
                          "--epochs", "1", "--data-dir", tiny_mnist, "--no-download", "--out-dir", tmp_path / "run",
                          "--metrics-out", tmp_path / "m.json", cwd=tmp_path)
    job = slurm.wait(job_id)
    assert job["JobState"] == "COMPLETED", why(job, slurm)
    assert json.loads((tmp_path / "m.json").read_text())["epochs"] == 1


@pytest.mark.parametrize("script", ["gpt.sh", "gpt_multi.sh"])
@pytest.mark.parametrize("flag", [["--out-dir="], ["--out-dir", ""], ["--out-dir", " "]])
def test_an_empty_out_dir_stops_the_launcher_in_one_line(tmp_path, script, flag):
    """Without Slurm: the launcher would print a runs/gpt/ folder and gpt_train.py train into the empty value."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(REPO / "slurm" / script), "--tokens", "100", *flag], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: --out-dir is empty; give a folder, or leave the flag out for a new runs/gpt/ folder"]
    assert "out " not in result.stdout and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, forced", [([], True), (["--text", "x.txt"], True), (["--out", "mine.json"], False),
                                           (["--out=mine.json", "--force"], False)])
def test_tokenizer_sh_replaces_the_default_tokenizer_but_not_one_named_with_out(tmp_path, flags, forced):
    """After the CPU try-out data/tokenizer/tokenizer.json exists: the job must not stop at "pass --force"
    (a GPT job queued afterok on it would wait forever). Its own --out: the student's file, refused as ever."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "ARGS_OUT": str(tmp_path / "args")}
    subprocess.run(["bash", str(REPO / "slurm" / "tokenizer.sh"), *flags], env=env, cwd=tmp_path, check=True,
                   capture_output=True)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[0] == str(REPO / "tokenizer_train.py") and args[1:] == (["--force"] if forced else []) + flags
