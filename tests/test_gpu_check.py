"""benchmarks/gpu_check.sh where it can run here: its refusals, before any work (the checks need a GPU)."""
import shutil
import subprocess

import pytest

from conftest import REPO


def gpu_check(*args, **kw):
    return subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=60, **kw)


@pytest.mark.parametrize("args, code, message", [
    (["--fast"], 2, "unknown argument --fast"),
    ([], 2, "--out OUTDIR is required"),
])
def test_bad_arguments_are_one_line(args, code, message):
    result = gpu_check(*args)
    assert result.returncode == code and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_a_gpu_it_stops_at_once_and_writes_nothing(tmp_path):
    result = gpu_check("--out", tmp_path / "out")
    assert result.returncode == 1 and "no NVIDIA GPU here" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["LAB5_MNIST", "LAB5_TEXT"])
def test_prepare_names_a_missing_input_before_any_download(tmp_path, missing):
    (tmp_path / "mnist").mkdir()
    for name in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]:
        (tmp_path / "mnist" / f"{name}.gz").write_bytes(b"")
    (tmp_path / "X.txt").write_text("a\nb\n")
    env = {"PATH": "/usr/bin:/bin", "LAB5_MNIST": str(tmp_path / "mnist"), "LAB5_TEXT": str(tmp_path / "X.txt"),
           missing: str(tmp_path / "nowhere")}
    result = gpu_check("--prepare", tmp_path / "prep", env=env)
    assert result.returncode == 1 and f"(set {missing})" in result.stderr and str(tmp_path / "nowhere") in result.stderr
    assert not (tmp_path / "prep").exists()  # nothing made, nothing downloaded
