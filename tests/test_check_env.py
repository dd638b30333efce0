"""training.check_env: each line ok or what to do, no GPU fine on a login node, nothing downloaded."""
import json
import subprocess
import sys

import pytest
import torch

import tokenizer_train
from conftest import REPO
from training import check_env

torch_cuda = pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch: no CUDA major to compare")


def fake_tool(folder, name, output):
    """An executable `name` in `folder` that prints `output`."""
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\ncat <<'END'\n{output}\nEND\n")
    tool.chmod(0o755)
    return tool


@pytest.fixture
def no_gpu(monkeypatch):
    """A login node: no GPU, no driver answering."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(check_env, "driver_cuda", lambda: None)


@pytest.fixture
def gpt_inputs(tmp_path, text_file, small_tokenizer):
    tok = tmp_path / "tok.json"
    tokenizer_train.save_atomic(small_tokenizer, tok)
    return ["--text", str(text_file), "--tokenizer", str(tok)]


def test_ready_for_gpt_on_a_node_without_gpu_and_the_json_says_so(no_gpu, gpt_inputs, tmp_path, capsys):
    out = tmp_path / "env.json"
    assert check_env.main(["--for", "gpt", *gpt_inputs, "--metrics-out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "gpu        note  no GPU on this node (fine on a login node; jobs get one)" in lines
    assert lines[-1] == "ready for gpt"
    saved = json.loads(out.read_text())
    assert saved["ready"] is True and {c["name"]: c["status"] for c in saved["checks"]}["gpu"] == "note"
    assert {c["name"] for c in saved["checks"]} >= {"python", "packages", "torch", "driver", "corpus", "tokenizer"}
    assert list(saved["phases"]) == ["startup", "inputs", "checks"]  # the clock every script's metrics carry
    assert sum(saved["phases"].values()) == pytest.approx(saved["process_seconds"], abs=0.01)


def test_missing_corpus_says_where_to_put_it_and_exits_1(no_gpu, gpt_inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "empty"))
    assert check_env.main(["--for", "gpt", *gpt_inputs[2:]]) == 1  # no --text: the default path
    lines = capsys.readouterr().out.splitlines()
    corpus, = [line for line in lines if line.startswith("corpus")]
    assert corpus.startswith(f"corpus     todo  {tmp_path / 'empty' / 'WebOfScience' / 'WOS46985' / 'X.txt'} not found")
    assert "pass --text PATH" in corpus and lines[-1] == "not ready for gpt: corpus"
    assert not (tmp_path / "empty").exists()  # nothing downloaded or made


def test_a_hub_tokenizer_not_on_this_machine_is_a_todo_without_a_download(no_gpu, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from data import tokenizer
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(tokenizer, "LOCAL_TOKENIZERS", tmp_path)
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: pytest.fail("the hub was asked"))
    check = check_env.check_tokenizer("gpt2")
    assert check.status == "todo" and f"put its folder at {tmp_path / 'gpt2-tokenizer'}" in check.detail


def test_mnist_found_as_lenet5_finds_it(tiny_mnist):
    assert check_env.check_mnist(tiny_mnist) == check_env.ok("mnist", str(tiny_mnist))
    missing = check_env.check_mnist(tiny_mnist / "nothing")
    assert missing.status == "todo" and "MNIST files missing" in missing.detail


@torch_cuda
def test_nvcc_of_another_cuda_major_is_flagged_with_the_ways_out(tmp_path, monkeypatch):
    other = f"{int(torch.version.cuda.split('.')[0]) + 1}.0"
    fake_tool(tmp_path / "cuda" / "bin", "nvcc", f"Cuda compilation tools, release {other}, V{other}.1")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    check = check_env.check_nvcc(torch, check_env.find_nvcc())
    assert check.status == "todo" and f"is CUDA {other}, torch's is {torch.version.cuda}" in check.detail
    assert f"module load cuda/{torch.version.cuda}" in check.detail and "GELU_EXT_CPU_ONLY=1" in check.detail
    assert check_env.check_nvcc(torch, check_env.find_nvcc(), act="torch").status == "note"  # op unused: fine
    same = f"{torch.version.cuda.split('.')[0]}.9"
    fake_tool(tmp_path / "cuda" / "bin", "nvcc", f"Cuda compilation tools, release {same}, V{same}.1")
    assert check_env.check_nvcc(torch, check_env.find_nvcc()).status == "ok"


@torch_cuda
def test_a_driver_older_than_torchs_cuda_is_a_todo(tmp_path, monkeypatch):
    major, minor = check_env.major_minor(torch.version.cuda)
    older = f"{major - 1}.{minor}"
    fake_tool(tmp_path, "nvidia-smi", f"| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: {older} |")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert check_env.driver_cuda() == older
    check = check_env.check_driver(torch, older)
    assert check.status == "todo" and f"torch needs {torch.version.cuda}" in check.detail
    assert check_env.check_driver(torch, torch.version.cuda).status == "ok"


def test_packages_below_their_floor_say_what_to_do(tmp_path):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("pytest>=999  # a comment\nno-such-package-here>=1\nninja\n")
    check = check_env.check_packages(reqs)
    assert check.status == "todo" and check.detail.endswith(": pip install -r requirements.txt")
    assert f"pytest {pytest.__version__} < 999" in check.detail and "no-such-package-here missing" in check.detail
    reqs.write_text("torch>=999\n")
    detail = check_env.check_packages(reqs).detail
    assert "an environment of its own with a torch built for this cluster's driver" in detail
    assert not check_env.older("2.4.0+cu121", "2.4") and check_env.older("2.3.1", "2.4")


def test_metrics_out_on_a_folder_is_one_line_before_any_check(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"^error: --metrics-out .* is a folder"):
        check_env.main(["--metrics-out", str(tmp_path)])
    assert capsys.readouterr().out == ""


def test_runs_as_a_module(tiny_mnist):
    done = subprocess.run([sys.executable, "-m", "training.check_env", "--for", "lenet5",
                           "--data-dir", str(tiny_mnist)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stderr == "" and f"mnist      ok    {tiny_mnist}" in done.stdout.splitlines()
    assert done.stdout.splitlines()[-1].startswith(("ready for lenet5", "not ready for lenet5"))


@torch_cuda
def test_lenet5_asks_for_the_compiled_gelu_only_for_act_cpp(no_gpu, tmp_path, monkeypatch, capsys):
    """The CPU try-out never builds gelu_ext: `--for lenet5` (default --act torch) is ready without it, even
    where the node's nvcc is of another CUDA major than torch (a cu121 torch beside CUDA 13: only a build
    of the op would mind)."""
    import gelu_ext
    from conftest import write_tiny_mnist
    mnist = write_tiny_mnist(tmp_path / "mnist", n_train=20, n_test=10)
    monkeypatch.setattr(gelu_ext, "is_built", lambda: False)
    other = f"{int(torch.version.cuda.split('.')[0]) + 1}.0"
    fake_tool(tmp_path / "cuda" / "bin", "nvcc", f"Cuda compilation tools, release {other}, V{other}.1")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert check_env.main(["--for", "lenet5", "--data-dir", str(mnist)]) == 0
    lines = capsys.readouterr().out.splitlines()
    gelu = next(line for line in lines if line.startswith("gelu_ext"))
    assert gelu.split()[1] == "note" and "only lenet5.py --act cpp needs it" in gelu and "circular" not in gelu
    assert lines[-1] == "ready for lenet5"
    assert check_env.main(["--for", "lenet5", "--act", "cpp", "--data-dir", str(mnist)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.startswith("gelu_ext")).split()[1] == "todo"
    assert lines[-1] == "not ready for lenet5: nvcc, gelu_ext"
