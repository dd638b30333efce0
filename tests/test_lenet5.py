import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

import lenet5
from conftest import REPO, free_port, run_script, wait_for, write_tiny_mnist
from conftest import in_process as main_in_process
from data import files
from training import rundir

in_process = functools.partial(main_in_process, lenet5.main)  # in_process(capsys, *args)


# --------------------------------------------------------------------- model

def test_model_shapes_and_parameter_count():
    model = lenet5.LeNet5(lenet5.make_gelu("torch", torch.device("cpu")))
    x = torch.randn(5, 1, 28, 28)
    c1, c2 = model.features(x)
    assert c1.shape == (5, 6, 24, 24) and c2.shape == (5, 16, 8, 8)
    assert model(x).shape == (5, 10)
    # conv 6*25+6, conv 16*6*25+16, fc 256*120+120, 120*84+84, 84*10+10
    assert sum(p.numel() for p in model.parameters()) == 156 + 2416 + 30840 + 10164 + 850


# --------------------------------------------------------------------- training runs

def test_training_on_tiny_set_learns_and_writes_metrics(tiny_mnist, tmp_path):
    out = tmp_path / "metrics.json"
    metrics = lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--epochs", "3", "--batch-size", "32",
                           "--out-dir", str(tmp_path / "run"), "--metrics-out", str(out), "--save",
                           str(tmp_path / "model.pt"), "--device", "cpu"])
    written = json.loads(out.read_text())
    assert written == json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["epochs"] == 3 and written["device"] == "cpu" and written["act"] == "torch"
    assert written["params"] == 44426 and written["engine"] == "plain" and written["train_seconds"] > 0
    assert metrics["history"][-1]["test_loss"] < 0.5  # chance level is ln(10) = 2.30
    assert written["test_accuracy"] > 0.9
    state = torch.load(tmp_path / "model.pt")
    assert state["conv1.weight"].shape == (6, 1, 5, 5)
    assert json.loads((tmp_path / "run" / "args.json").read_text())["epochs"] == 3


@pytest.mark.slow
def test_real_mnist_one_epoch_reaches_98_percent_with_an_accuracy_curve(shared_data, tmp_path):
    """The default recipe, one epoch on the CPU: >= 98%, and TensorBoard draws the accuracy as a curve (the
    training accuracy at every log point: >= 5 in the epoch), as metrics.json does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    metrics = lenet5.main(["--data-dir", str(shared_data), "--no-download", "--epochs", "1",
                           "--out-dir", str(tmp_path / "run"), "--device", "cpu"])
    assert metrics["test_accuracy"] >= 0.98, metrics
    events = EventAccumulator(str(tmp_path / "run")).Reload()
    train = [(e.step, e.value) for e in events.Scalars("accuracy/train")]
    assert len(train) >= 5 and [s for s, _ in train] == [s for s, _ in metrics["train_accuracy_curve"]]
    assert [v for _, v in train] == pytest.approx([v for _, v in metrics["train_accuracy_curve"]])
    assert all(0 <= value <= 1 for _, value in train) and train[-1][1] > 0.95 > train[0][1]  # it learns
    assert [(e.step, e.value) for e in events.Scalars("accuracy/test")] == [(469, pytest.approx(
        metrics["test_accuracy"]))]  # once per epoch


def test_out_dir_is_never_overwritten(tiny_mnist, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("old")
    with pytest.raises(SystemExit, match="not empty"):
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--out-dir", str(run)])
    assert (run / "keep.txt").read_text() == "old"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["plain", "lightning"])  # Lightning catches Ctrl-C itself and exits 1, silent
def test_ctrl_c_is_one_line_and_the_same_command_starts_over(tiny_mnist, tmp_path, engine, capsys):
    """Ctrl-C during training: one line, exit 130, no traceback; the same command again starts over in the
    same --out-dir (the unfinished attempt's files set aside, never mixed in); a finished run stays refused."""
    cmd = [sys.executable, str(REPO / "lenet5.py"), "--data-dir", str(tiny_mnist), "--no-download", "--device", "cpu",
           "--epochs", "2", "--batch-size", "30", "--log-every", "1", "--out-dir", str(tmp_path / "run"),
           "--engine", engine]  # 40 steps: 8 s of the slowed logging below, for the Ctrl-C to land in
    slow = ("import runpy, sys, time; from training import lenet; log = lenet.log_point\n"
            "lenet.log_point = lambda *a, **k: (time.sleep(0.2), log(*a, **k))[1]\n"
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", slow, *cmd[1:]], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: list((tmp_path / "run").glob("events.out.tfevents.*")), proc=proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == (f"interrupted (Ctrl-C): run the command again to start over; the same "
                                            f"--out-dir sets {tmp_path / 'run'}'s files aside")  # under the bar
    first_events = {p.name for p in (tmp_path / "run").glob("events.out.tfevents.*")}
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "held an earlier attempt (stopped before its metrics.json)" in again.stderr
    aside = list((tmp_path / "run").glob("earlier-attempt-*"))
    assert len(aside) == 1 and {p.name for p in aside[0].glob("events.out.tfevents.*")} == first_events
    assert not first_events & {p.name for p in (tmp_path / "run").glob("events.out.tfevents.*")}  # this run's only
    third = in_process(capsys, *cmd[2:])  # the refusal needs no third process
    assert third.returncode == 1 and "holds a finished run of lenet5.py" in third.stderr


@pytest.mark.parametrize("script", ["lenet5.py", "tokenizer_train.py"])
def test_ctrl_c_during_the_imports_is_one_line(tmp_path, script):
    """Ctrl-C in the first second (torch still importing): one line and 130, not an import traceback."""
    proc = subprocess.Popen([sys.executable, str(REPO / script), "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines() == ["interrupted (Ctrl-C) while starting: nothing was written"] and out == ""


# --------------------------------------------------------------------- TensorBoard, really served

def get_json(url, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_tensorboard_serves_scalars_and_images(tiny_mnist, tmp_path):
    logdir = tmp_path / "runs"
    lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--epochs", "2", "--batch-size", "50",
                 "--log-every", "2", "--out-dir", str(logdir / "tiny"), "--device", "cpu"])
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                               "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/data/plugin"
        deadline = time.time() + 60
        while (scalars := get_json(f"{base}/scalars/tags")).get("tiny") is None and time.time() < deadline:
            time.sleep(0.5)
        tags = scalars["tiny"]
        assert {"loss/train", "accuracy/train", "train/lr", "loss/test", "accuracy/test"} <= set(tags)
        images = get_json(f"{base}/images/tags")["tiny"]
        assert {"layers/conv1_filters", "layers/conv1_feature_maps", "layers/conv2_feature_maps"} <= set(images)
        accuracy = get_json(f"{base}/scalars/scalars?run=tiny&tag=accuracy/test")
        assert len(accuracy) == 2 and all(0 <= point[2] <= 1 for point in accuracy)  # [time, step, value]
        graphs = get_json(f"{base}/graphs/info")
        assert graphs["tiny"]["run_graph"] is True  # the model graph from add_graph
    finally:
        server.terminate()
        server.wait(timeout=10)


# --------------------------------------------------------------------- errors a user can cause

@pytest.mark.parametrize("args, message", [(["--epochs", "0"], "--epochs: must be >= 1, got 0"),
                                           (["--act", "relu"], "invalid choice"),
                                           (["--lr", "fast"], "--lr: expected a number, got 'fast'"),
                                           (["--lr", "nan"], "--lr: expected a finite number"),
                                           (["--lr", "inf"], "--lr: expected a finite number"),
                                           (["--lr", "0"], "--lr: must be > 0, got 0")])
def test_bad_flags_exit_2_with_message(args, message, capsys):
    # the first case as a user runs it; the others in this process (the same parser, the same exit)
    result = run_script("lenet5.py", *args) if args == ["--epochs", "0"] else in_process(capsys, *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1


def test_missing_data_is_one_clear_line(tmp_path):
    result = run_script("lenet5.py", "--data-dir", str(tmp_path), "--no-download", "--out-dir", str(tmp_path / "run"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # a single line, no traceback
    assert "MNIST files missing" in result.stderr and "train-images-idx3-ubyte" in result.stderr


def test_corrupt_data_is_one_clear_line(tiny_mnist, tmp_path, capsys):
    labels = tiny_mnist / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-5])
    result = in_process(capsys, "--data-dir", tiny_mnist, "--no-download", "--out-dir", tmp_path / "run")
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "truncated" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_shows_defaults(capsys):
    result = in_process(capsys, "--help")
    assert result.returncode == 0 and "(default: 2)" in result.stdout and "(default: 128)" in result.stdout


def test_sbatch_scripts_parse():
    scripts = sorted((REPO / "slurm").glob("*.sh")) + sorted((REPO / "benchmarks").glob("*.sh"))
    assert scripts
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script


@pytest.mark.slow
def test_sbatch_script_runs_without_slurm_and_forwards_flags(tiny_mnist, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(REPO / "slurm" / "lenet.sh"), "--data-dir", str(tiny_mnist), "--no-download",
                             "--epochs", "1", "--device", "cpu", "--out-dir", str(tmp_path / "run"),
                             "--metrics-out", str(tmp_path / "m.json")],
                            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "m.json").read_text())["epochs"] == 1
    assert "job none" in result.stdout


def test_a_diverging_run_stops_with_one_line(tiny_mnist, tmp_path, capsys):
    result = in_process(capsys, "--data-dir", tiny_mnist, "--no-download", "--device", "cpu", "--lr", "1e6",
                        "--log-every", "1", "--out-dir", tmp_path / "run", "--metrics-out", tmp_path / "m.json")
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("error: training loss at step")
    assert "diverged; try a lower --lr" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "m.json").exists()


def test_metrics_json_is_strict():
    assert files.strict({"a": math.nan, "b": [1.0, math.inf], "c": "x"}) == {"a": None, "b": [1.0, None], "c": "x"}


@pytest.mark.parametrize("flag, make, message", [
    ("--save", lambda p: (p / "file").write_text("x") and p / "file" / "model.pt", "--save"),
    ("--metrics-out", lambda p: (p / "folder").mkdir() or p / "folder", "is a folder"),
    ("--out-dir", lambda p: (p / "file").write_text("x") and p / "file", "is a file, not a folder"),
])
def test_unwritable_outputs_fail_before_training(tiny_mnist, tmp_path, flag, make, message, capsys):
    result = in_process(capsys, "--data-dir", tiny_mnist, "--no-download", "--device", "cpu", "--out-dir",
                        tmp_path / "run", flag, make(tmp_path))
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert "epoch 1" not in result.stdout  # nothing was trained, so nothing is lost



@pytest.mark.parametrize("flag", ["--metrics-out", "--save"])
def test_an_output_onto_an_mnist_file_is_refused_and_the_file_kept(tiny_mnist, tmp_path, flag, capsys):
    target = tiny_mnist / "t10k-labels-idx1-ubyte"
    before = target.read_bytes()
    result = in_process(capsys, "--data-dir", tiny_mnist, "--no-download", "--device", "cpu",
                        "--out-dir", tmp_path / "run", flag, target)
    assert result.returncode == 1 and "would overwrite --data-dir" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "epoch 1" not in result.stdout
    assert target.read_bytes() == before

# --------------------------------------------------------------------- PyTorch Lightning (--engine lightning)

def tags_of(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir)).Reload()
    return set(events.Tags()["scalars"]), set(events.Tags()["images"])


@pytest.mark.parametrize("act", ["torch", "cpp"])
def test_lightning_engine_learns_and_writes_what_the_plain_loop_writes(tiny_mnist, tmp_path, act):
    if act == "cpp":
        pytest.importorskip("gelu_ext._C", reason="gelu_ext not built")
    common = ["--data-dir", str(tiny_mnist), "--no-download", "--epochs", "3", "--batch-size", "32", "--device", "cpu",
              "--log-every", "5", "--act", act]
    plain = lenet5.main([*common, "--out-dir", str(tmp_path / "plain")])
    lit = lenet5.main([*common, "--engine", "lightning", "--out-dir", str(tmp_path / "lit")])
    assert lit["engine"] == "lightning" and set(lit) == set(plain)
    assert lit["test_accuracy"] > 0.9 and lit["train_seconds"] > 0
    # the same model, batches, optimizer and schedule: the same test losses, epoch for epoch
    for a, b in zip(plain["history"], lit["history"]):
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
    assert tags_of(tmp_path / "lit") == tags_of(tmp_path / "plain")
    assert not list((tmp_path / "lit").rglob("*.ckpt"))  # no Lightning checkpoints


@pytest.mark.slow
def test_lightning_real_mnist_one_epoch_reaches_98_percent(shared_data, tmp_path):
    metrics = lenet5.main(["--data-dir", str(shared_data), "--no-download", "--epochs", "1", "--engine", "lightning",
                           "--device", "cpu", "--out-dir", str(tmp_path / "run")])
    assert metrics["test_accuracy"] >= 0.98, metrics


# --------------------------------------------------------------------- a full disk under the run folder

def test_a_full_disk_at_the_event_file_stops_in_one_line(tiny_mnist, tmp_path, monkeypatch, capsys):
    import errno

    from tensorboard.summary.writer import record_writer
    real_write, calls = record_writer.RecordWriter.write, []

    def write(self, data):  # the disk fills up part-way through the second epoch's logging
        calls.append(1)
        if len(calls) > 30:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)
    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--device", "cpu", "--epochs", "3",
                     "--batch-size", "50", "--log-every", "2", "--out-dir", str(run)])
    assert str(stop.value.code) == f"error: writing the run's logs in {run} failed (No space left on device)"
    assert "Traceback" not in capsys.readouterr().err and not (run / "metrics.json").exists()


# --------------------------------------------------------------------- benchmarks/lenet_bench.py

@pytest.fixture
def bench(tmp_path):
    """benchmarks/lenet_bench.py, imported, and tiny MNIST in torchvision's layout (plain files) for its baseline."""
    import gzip
    sys.path.insert(0, str(REPO / "benchmarks"))
    import lenet_bench
    raw = write_tiny_mnist(tmp_path / "mnist" / "MNIST" / "raw", n_train=300, n_test=100)
    gz = raw / "train-images-idx3-ubyte.gz"
    (raw / "train-images-idx3-ubyte").write_bytes(gzip.decompress(gz.read_bytes()))
    gz.unlink()
    return lenet_bench, tmp_path / "mnist"


def test_lenet_bench_recipe_pairs_each_seed_with_a_baseline_epoch(bench, tmp_path):
    lenet_bench, data = bench
    out = tmp_path / "bench.json"
    result = lenet_bench.main(["--data-dir", str(data), "--device", "cpu", "--seeds", "0", "1",
                               "--metrics-out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [r["seed"] for r in result["per_seed"]] == [0, 1] and result["repeats"] == 2
    for r in result["per_seed"]:
        ratio = r["default_train_seconds"] / r["baseline_epoch_seconds"][0]
        assert r["ratio_to_baseline_epoch"] == pytest.approx(ratio)
    assert result["default_accuracy"] == min(r["default_accuracy"] for r in result["per_seed"])
    assert result["recipe"]["epochs"] == result["default_epochs"] == lenet5.parse_args([]).epochs
    times = [r["default_train_seconds"] for r in result["per_seed"]]
    assert result["default_train_seconds_range"] == [min(times), max(times)]


def test_lenet_bench_act_pair_alternates_torch_and_cpp(bench, tmp_path):
    pytest.importorskip("gelu_ext._C", reason="gelu_ext not built")
    lenet_bench, data = bench
    result = lenet_bench.main(["--data-dir", str(data), "--device", "cpu", "--seeds", "0", "1", "--act-pair"])
    assert [r["first"] for r in result["per_seed"]] == ["torch", "cpp"]
    for r in result["per_seed"]:
        assert r["cpp_to_torch"] == pytest.approx(r["cpp_train_seconds"] / r["torch_train_seconds"])
        assert r["cpp_accuracy"] == pytest.approx(r["torch_accuracy"], abs=0.05)  # the same model and data
    ratios = [r["cpp_to_torch"] for r in result["per_seed"]]
    assert result["cpp_to_torch"] == {"median": pytest.approx(sum(ratios) / 2), "range": [min(ratios), max(ratios)]}


def test_lenet_bench_missing_data_is_one_line(bench, tmp_path):
    lenet_bench, _ = bench
    with pytest.raises(SystemExit) as stop:  # sys.exit(line): the process prints it and exits 1
        lenet_bench.main(["--data-dir", str(tmp_path / "empty"), "--device", "cpu"])
    assert str(stop.value.code).startswith("error: MNIST files missing") and "\n" not in str(stop.value.code)


# --------------------------------------------------------------------- the run folder, swapped files

@pytest.mark.parametrize("where", ["repository", "gpt run", "lenet run"])
def test_an_out_dir_that_is_not_new_or_empty_is_refused_with_nothing_written(tiny_mnist, tmp_path, where):
    folder = REPO if where == "repository" else tmp_path / "run"
    if where != "repository":
        folder.mkdir()
        (folder / "run.owner").write_text("gpt_train.py\n" if where == "gpt run" else "lenet5.py\n")
        (folder / "args.json").write_text("{}")
        (folder / "metrics.json").write_text("{}")  # finished (an unfinished lenet5 run is set aside: ctrl_c test)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(SystemExit, match=f"^error: --out-dir {folder} is not empty: it holds "):
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--out-dir", str(folder), "--device", "cpu"])
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_run_that_finishes_while_the_lock_is_taken_is_never_set_aside(tiny_mnist, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.owner").write_text("lenet5.py\n")
    (run / "args.json").write_text("{}")
    real = rundir.claim_run_dir

    def finishing(path, *a, **kw):
        (path / "metrics.json").write_text("{}")  # the other run's last write, its lock released just after
        return real(path, *a, **kw)
    monkeypatch.setattr(rundir, "claim_run_dir", finishing)
    with pytest.raises(SystemExit, match="holds a run of lenet5.py that has just finished"):
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--out-dir", str(run), "--device", "cpu"])
    assert not list(run.glob("earlier-attempt-*")) and (run / "metrics.json").read_text() == "{}"


def test_an_empty_out_dir_is_refused(tiny_mnist, capsys):
    with pytest.raises(SystemExit) as stop:
        lenet5.main(["--data-dir", str(tiny_mnist), "--no-download", "--out-dir", ""])
    assert stop.value.code == 2 and "--out-dir: an empty path" in capsys.readouterr().err


def test_a_failed_lightning_start_leaves_nothing_that_blocks_the_retry(tiny_mnist, tmp_path, monkeypatch):
    run = ["--data-dir", str(tiny_mnist), "--no-download", "--out-dir", str(tmp_path / "run"), "--device", "cpu",
           "--engine", "lightning", "--epochs", "1"]
    monkeypatch.setitem(sys.modules, "lightning", None)  # not installed: import lightning raises ImportError
    monkeypatch.delitem(sys.modules, "training.lenet_lightning", raising=False)  # so never imported either
    with pytest.raises(SystemExit, match="needs the lightning package"):
        lenet5.main(run)
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(lenet5, "REPO", tmp_path / "repo")  # the default folder too
    with pytest.raises(SystemExit, match="needs the lightning package"):
        lenet5.main(run[:4] + run[6:])
    runs = tmp_path / "repo" / "runs" / "lenet5"
    assert not runs.exists() or not list(runs.iterdir())


def test_swapped_train_and_test_files_are_refused_by_their_sizes(tmp_path):
    data = write_tiny_mnist(tmp_path / "mnist", n_train=200, n_test=600)  # the test set larger: swapped
    with pytest.raises(SystemExit, match=r"hold 200 images, the test files .* 600: swapped\?"):
        lenet5.main(["--data-dir", str(data), "--no-download", "--out-dir", str(tmp_path / "run"), "--device", "cpu"])
    assert not (tmp_path / "run").exists()


def test_a_seed_out_of_range_is_a_flag_error(capsys):
    with pytest.raises(SystemExit) as stop:
        lenet5.parse_args(["--seed", str(2**64)])
    assert stop.value.code == 2 and "--seed: must be in [0, 4294967296)" in capsys.readouterr().err
