"""The end of a GPT run (gpt_train.finish): a run is finished (metrics.json) only once its weights are saved in
final/, and its checkpoints go only after that, so a kill or a full disk at any moment of the end leaves a run the
same command finishes, never one that counts as finished without weights and cannot resume."""
import json

import pytest

import gpt_train
from conftest import tiny_args
from training import final


class Killed(BaseException):
    """A SIGKILL's effect in-process: nothing catches it, nothing of the run's files is cleaned up."""


def kill_while_writing_final(net, tokenizer, folder):
    (folder / final.HF_WEIGHTS).write_bytes(b"half a safetensors file")
    raise Killed


def kill_after_final(*args, **kwargs):
    final.save_final(*args, **kwargs)
    raise Killed


def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("moment", ["while final/ is written", "after final/ is renamed", "full disk at final/"])
def test_a_run_stopped_at_its_end_is_finished_by_the_same_command(corpus, tmp_path, monkeypatch, capsys, moment):
    """8 steps, a checkpoint at step 4: the stopped run is not finished (no metrics.json), keeps its checkpoint
    (a full disk says to resume from it), and the same command resumes it to final/ and metrics.json, whose
    weights load."""
    run = tmp_path / "run"
    args = tiny_args(corpus, run, "--tokens", "2048", "--ckpt-every", "4")
    if moment == "after final/ is renamed":
        monkeypatch.setattr(gpt_train, "save_final", kill_after_final)
    else:
        monkeypatch.setattr(final, "write_final", full_disk if moment.startswith("full") else kill_while_writing_final)
    with pytest.raises(SystemExit if moment.startswith("full") else Killed) as stopped:
        gpt_train.main(args)
    if moment.startswith("full"):
        assert str(stopped.value.code).endswith(f"ckpt-0000004 in {run} is intact: free space there, then run the "
                                                f"same command to resume from it and save final/")
    assert not (run / "metrics.json").exists() and [p.name for p in run.glob("ckpt-*")] == ["ckpt-0000004"]
    monkeypatch.undo()
    capsys.readouterr()

    results = gpt_train.main(args)
    assert "resuming at step 4" in capsys.readouterr().out
    assert results["steps"] == json.loads((run / "metrics.json").read_text())["steps"] == 8
    assert not list(run.glob("ckpt-*")) and not (run / "final.tmp").exists()
    model, _ = final.load_run(run, None, "cpu")
    assert sum(p.numel() for p in model.parameters()) > 0
