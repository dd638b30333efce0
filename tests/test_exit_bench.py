"""benchmarks/exit_bench.py: each mode's runs counted and written as strict JSON; bad values and an existing
--metrics-out without --force refused before any run."""
import json
import sys

import pytest

from conftest import REPO, run_script

sys.path.insert(0, str(REPO / "benchmarks"))
import exit_bench


@pytest.mark.slow
def test_one_round_of_the_gpt_train_way_out_is_counted(tmp_path):
    out = tmp_path / "exit.json"
    result = run_script("benchmarks/exit_bench.py", "--runs", "1", "--modes", "no_teardown", "--hogs", "0",
                        "--metrics-out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(out.read_text())
    assert metrics["modes"] == {"no_teardown": {"ok": 1, "aborted": 0, "failed": 0}}
    assert metrics["hogs"] == 0 and "--runs 1" in metrics["command"]


def test_bad_values_are_one_line_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(exit_bench, "one_run", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as e:
        exit_bench.main(["--runs", "0"])
    assert e.value.code == 2 and "argument --runs: must be >= 1, got 0" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit) as e:
        exit_bench.main(["--metrics-out", str(tmp_path / "folder")])
    assert e.value.code == f"error: --metrics-out {tmp_path / 'folder'} is a folder; give a file name"
    (tmp_path / "old.json").write_text('{"modes": {}}')  # an earlier result: replaced only with --force
    with pytest.raises(SystemExit) as e:
        exit_bench.main(["--metrics-out", str(tmp_path / "old.json")])
    assert "exists; pass --force to replace it" in e.value.code
    assert (tmp_path / "old.json").read_text() == '{"modes": {}}'
