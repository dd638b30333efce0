"""benchmarks/startup_bench.py: each script timed as a process beside a baseline commit's, interleaved, the
seconds outside the training loop summarised as median and range."""
import json
import signal
import subprocess
import sys

import pytest

from conftest import REPO, wait_for, write_tiny_mnist

sys.path.insert(0, str(REPO / "benchmarks"))
import startup_bench


def test_the_summary_gives_median_range_and_the_ratio_of_the_seconds_outside_the_loop():
    def run(wall, loop, phases=None):
        return {"wall_seconds": wall, "loop_seconds": loop, "outside_loop_seconds": wall - loop,
                "process_seconds": wall - 0.1 if phases else None, "phases": phases}
    runs = {"tiny-20k": {"baseline": [run(10, 2), run(12, 2), run(11, 2)],
                         "current": [run(5, 2, {"loop": 2.0, "data": 1.0}), run(6, 2, {"loop": 2.0, "data": 2.0}),
                                     run(4, 2, {"loop": 2.0, "data": 0.5})]}}
    out = startup_bench.summarise(runs)["tiny-20k"]
    assert out["baseline"]["outside_loop_seconds"] == 9 and out["baseline"]["outside_loop_seconds_range"] == [8, 10]
    assert out["current"]["outside_loop_seconds"] == 3 and out["current"]["phases_median"] == {"loop": 2.0, "data": 1.0}
    assert out["outside_loop_ratio"] == pytest.approx(3 / 9)


@pytest.mark.slow
def test_a_case_runs_beside_the_baseline_commit_and_writes_its_json(tmp_path):
    out, mnist = tmp_path / "b.json", write_tiny_mnist(tmp_path / "mnist", n_train=128, n_test=32)  # one step
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "startup_bench.py"), "--cases", "lenet-1-epoch",
                           "--repeats", "1", "--mnist", str(mnist), "--metrics-out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    case = result["cases"]["lenet-1-epoch"]
    assert result["baseline"].startswith("139e3cc")
    assert len(case["baseline"]["runs"]) == len(case["current"]["runs"]) == 1
    current = case["current"]["runs"][0]
    assert current["phases"] and abs(current["wall_seconds"] - current["process_seconds"]) < 1.0
    assert case["baseline"]["runs"][0]["phases"] is None  # the baseline's metrics had no phases
    worktrees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert "startup-bench" not in worktrees  # the baseline's checkout removed


@pytest.mark.slow
def test_ctrl_c_is_one_line_writes_nothing_and_removes_the_baselines_checkout(tmp_path, tiny_mnist):
    out = tmp_path / "b.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "startup_bench.py"), "--cases",
                             "lenet-1-epoch", "--repeats", "3", "--mnist", str(tiny_mnist), "--metrics-out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def worktrees():
        return subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    assert wait_for(lambda: "startup-bench" in worktrees(), timeout=120, poll=0.2, proc=proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err and not out.exists(), err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C): nothing written; the baseline's checkout is removed"
    assert "startup-bench" not in worktrees()
