"""training/lifecycle.py's clock and every script's: `process_seconds` is the process as `time` sees it (from its
start as the OS records it, imports included), its `phases` sum to it, and a slow phase shows in its own slot."""
import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_script, tiny_args, wait_for
from training import lifecycle

SUM_TOLERANCE = 0.02  # the phases sum to the process time within 2% (rounding to the millisecond aside)
TICK = 0.02  # the OS records a process's start in clock ticks (10 ms): it may read up to a tick early


def timed(cmd, **kw):
    """(CompletedProcess, wall seconds from the parent: fork to exit)."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    return done, time.perf_counter() - t0


def assert_clock(metrics, wall, names):
    """process_seconds within the parent's wall time (the process's last second: its exit), phases summing
    to it, the expected phases each present."""
    phases, process = metrics["phases"], metrics["process_seconds"]
    assert wall - 1.0 <= process <= wall + TICK, (process, wall)
    assert abs(sum(phases.values()) - process) <= SUM_TOLERANCE * process, phases
    assert set(names) <= set(phases) and all(v >= 0 for v in phases.values()), phases
    assert phases["startup"] + phases["imports"] > 0.2  # the interpreter and torch's import are counted


def test_phases_give_every_second_to_one_phase_and_nest():
    phases = lifecycle.Phases(imports=(0.01, 0.02))
    phases.switch("data")
    with phases.of("evaluation"):
        time.sleep(0.05)
    phases.switch("loop")
    time.sleep(0.02)
    spent, now = phases.record()
    assert list(spent) == ["startup", "imports", "inputs", "data", "evaluation", "loop"]
    assert spent["evaluation"] >= 0.05 and spent["loop"] >= 0.02 and spent["startup"] == 0.01
    assert abs(sum(spent.values()) - now) < 0.01


def test_process_seconds_count_from_the_process_start_not_from_the_import():
    code = "import time; time.sleep(0.6); from training.lifecycle import process_seconds; print(process_seconds())"
    done, wall = timed([sys.executable, "-c", code], cwd=REPO)
    assert 0.6 <= float(done.stdout) <= wall + TICK


@pytest.mark.slow
def test_gpt_train_process_seconds_and_phases(corpus, tmp_path):
    out = tmp_path / "run"
    done, wall = timed([sys.executable, str(REPO / "gpt_train.py"), *tiny_args(corpus, out, "--tokens", "4096",
                                                                               "--eval-every", "4")])
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((out / "metrics.json").read_text())
    assert_clock(m, wall, ["inputs", "data", "model", "loop", "evaluation", "final_save", "sampling", "teardown"])
    assert m["phases"]["loop"] >= m["train_seconds"] and m["process_seconds_total"] == m["process_seconds"]
    assert f"{m['process_seconds']:.1f} s end to end" in done.stdout  # the summary line's end to end: this clock


@pytest.mark.slow
def test_a_resumed_run_counts_every_process_to_its_exit(corpus, tmp_path):
    """Stopped by SIGTERM (its checkpoints made 2 s slower to write: a lab-shape checkpoint is GBs), then run
    again: process_seconds_total holds both processes (the stopped one up to its last checkpoint, an earlier slow
    write included), and the summary line's "end to end" is that total, as its loop time is both processes' loops."""
    out, common = tmp_path / "run", ["--tokens", str(60 * 8 * 32), "--ckpt-every", "20", "--log-every", "1"]
    slow = ("import runpy, sys, time; from training import checkpoints; save = checkpoints.save_checkpoint\n"
            "checkpoints.save_checkpoint = lambda *a, **k: (time.sleep(2.0), save(*a, **k))[1]\n"
            "sys.argv = ['gpt_train.py'] + sys.argv[1:]; runpy.run_path('gpt_train.py', run_name='__main__')")
    t0 = time.perf_counter()
    first = subprocess.Popen([sys.executable, "-c", slow, *tiny_args(corpus, out, *common)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: list(out.glob("ckpt-0000020")), proc=first)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    first_wall = time.perf_counter() - t0
    done, second_wall = timed([sys.executable, str(REPO / "gpt_train.py"), *tiny_args(corpus, out, *common)])
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["process_seconds"] + 2.0 <= m["process_seconds_total"] <= first_wall + second_wall
    assert f"{m['process_seconds_total']:.1f} s end to end over all its processes, this one " in done.stdout


@pytest.mark.slow
def test_a_slow_phase_shows_in_its_own_slot(corpus, tmp_path):
    """The data phase made 6 s slower (a slow file system): the data slot takes it, no other slot does (6 s: a
    loaded 2-core machine's imports took 4.1 s)."""
    out = tmp_path / "run"
    wrapper = ("import runpy, sys, time; from data import wos; read = wos.read_packed\n"
               "wos.read_packed = lambda *a, **k: (time.sleep(6.0), read(*a, **k))[1]\n"
               "sys.argv = ['gpt_train.py'] + sys.argv[1:]; runpy.run_path('gpt_train.py', run_name='__main__')")
    done, wall = timed([sys.executable, "-c", wrapper, *tiny_args(corpus, out, "--tokens", "2048")], cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((out / "metrics.json").read_text())
    assert_clock(m, wall, ["data"])
    assert m["phases"]["data"] >= 6.0 and max(v for k, v in m["phases"].items() if k != "data") < 6.0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["plain", "lightning"])
def test_lenet5_process_seconds_and_phases(tiny_mnist, tmp_path, engine):
    done, wall = timed([sys.executable, str(REPO / "lenet5.py"), "--data-dir", str(tiny_mnist), "--no-download",
                        "--device", "cpu", "--epochs", "1", "--engine", engine, "--out-dir", str(tmp_path / "run"),
                        "--metrics-out", str(tmp_path / "m.json")])
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((tmp_path / "m.json").read_text())
    assert m == json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert_clock(m, wall, ["inputs", "data", "model", "logging", "loop", "evaluation", "teardown"])
    assert m["phases"]["loop"] >= m["train_seconds"]


@pytest.mark.slow
def test_tokenizer_train_process_seconds_and_phases(text_file, tmp_path):
    done, wall = timed([sys.executable, str(REPO / "tokenizer_train.py"), "--text", str(text_file), "--out",
                        str(tmp_path / "tok.json"), "--vocab-size", "512", "--compare", "none", "--seq-len", "32",
                        "--cache-dir", str(tmp_path / "cache"), "--metrics-out", str(tmp_path / "m.json")])
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((tmp_path / "m.json").read_text())
    assert_clock(m, wall, ["inputs", "data", "loop", "evaluation", "cache", "final_save", "teardown"])
    assert m["phases"]["loop"] >= m["train_seconds"]


@pytest.mark.slow
def test_sample_process_seconds_and_phases(corpus, tmp_path):
    import gpt_train
    run = tmp_path / "run"
    gpt_train.main(tiny_args(corpus, run, "--tokens", "2048", "--sample-tokens", "0"))
    done, wall = timed([sys.executable, "-m", "training.sample", str(run), "--prompt", "The", "--tokens", "8",
                        "--metrics-out", str(tmp_path / "m.json")], cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((tmp_path / "m.json").read_text())
    assert_clock(m, wall, ["inputs", "model", "sampling", "teardown"])
    assert done.stdout.strip() == "The" + m["text"] and m["new_tokens"] == 8


def test_help_is_quick_to_start(tmp_path):
    """--help pays for the imports only: no optimizer (torch._dynamo), no TensorBoard, no torchvision."""
    code = ("import sys, lenet5\nfor m in ('torch._dynamo', 'torchvision', 'torch.utils.tensorboard'):\n"
            "    assert m not in sys.modules, m\n")
    done = run_script("lenet5.py", "--help")
    assert done.returncode == 0 and "--metrics-out" in done.stdout
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True).returncode == 0
