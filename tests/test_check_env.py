"""training.check_env: each line ok or what to do, no GPU fine on a login node, nothing downloaded."""
import json
import subprocess
import sys
from types import SimpleNamespace

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


def fake_package(folder, name, version, body):
    """A distribution `name` of `version` on a folder for sys.path, whose import runs `body`."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(body)
    (folder / f"{name}-{version}.dist-info").mkdir()
    (folder / f"{name}-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                                                     f"Version: {version}\n")
    return folder


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


def test_a_hub_tokenizer_not_on_this_machine_is_a_todo_without_a_download(no_gpu, tmp_path, monkeypatch, text_file):
    from huggingface_hub import constants

    from data import tokenizer
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("LAB5_DATA", str(tmp_path))
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: pytest.fail("the hub was asked"))
    corpus, check = check_env.check_data(SimpleNamespace(text=text_file, tokenizer="gpt2"), {"corpus"})
    assert corpus.status == "ok" and check.name == "tokenizer" and check.status == "todo"
    assert f"put its folder at {tmp_path / 'gpt2-tokenizer'}" in check.detail


def test_mnist_found_as_lenet5_finds_it(tiny_mnist):
    assert check_env.check_data(SimpleNamespace(data_dir=tiny_mnist), {"mnist"}) == [
        check_env.ok("mnist", str(tiny_mnist))]
    missing, = check_env.check_data(SimpleNamespace(data_dir=tiny_mnist / "nothing"), {"mnist"})
    assert missing.status == "todo" and "MNIST files missing" in missing.detail


def test_data_that_others_may_replace_is_not_ok(tiny_mnist, tmp_path):
    """A world-writable data folder (a LAB5_DATA anyone may write): a todo naming it, exit 1 for the job."""
    tiny_mnist.chmod(0o777)
    try:
        shared, = check_env.check_data(SimpleNamespace(data_dir=tiny_mnist), {"mnist"})
    finally:
        tiny_mnist.chmod(0o755)
    assert shared.status == "todo" and shared.detail.startswith(
        f"{tiny_mnist}, but {tiny_mnist} is writable by others (mode 777: chmod go-w): anyone could replace the data")


@torch_cuda
def test_a_driver_older_than_torchs_cuda_is_a_todo(tmp_path, monkeypatch):
    major, minor = check_env.release(torch.version.cuda)[:2]
    older = f"{major - 1}.{minor}"
    fake_tool(tmp_path, "nvidia-smi", f"| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: {older} |")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert check_env.driver_cuda() == older
    _, check, _ = check_env.check_torch_driver_gpu(torch, older)
    assert check.name == "driver" and check.status == "todo" and f"torch needs {torch.version.cuda}" in check.detail
    assert check_env.check_torch_driver_gpu(torch, torch.version.cuda)[1].status == "ok"


def test_packages_below_their_floor_say_what_to_do(tmp_path):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("pytest>=999  # a comment\nno-such-package-here>=1\nninja\n")
    python, check = check_env.check_python_and_packages(reqs)
    assert python.status == "ok" and check.status == "todo"
    assert check.detail.endswith(": pip install -r requirements.txt")
    assert f"pytest {pytest.__version__} < 999" in check.detail and "no-such-package-here missing" in check.detail
    reqs.write_text("torch>=999\n")
    detail = check_env.check_python_and_packages(reqs)[1].detail
    assert "an environment of its own with a torch built for this cluster's driver" in detail
    release = check_env.release
    assert release("2.4.0+cu121") >= release("2.4") and release("2.3.1") < release("2.4") == release("2.4.0rc1")


def test_a_package_of_the_right_version_that_does_not_import_is_a_todo(tmp_path, monkeypatch):
    """A CPU torch beside a CUDA torchvision: the versions met their floors, `import torchvision` failed,
    and check_env said `packages ok`. Now each package is imported."""
    fake_package(tmp_path, "fakevision", "1.0", 'raise RuntimeError("operator torchvision::nms does not exist")\n')
    fake_package(tmp_path, "fakefine", "2.0", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("fakefine>=1.5\n")
    assert check_env.check_python_and_packages(reqs)[1] == check_env.ok("packages", "requirements.txt's floors "
                                                                                     "met; each imports")
    reqs.write_text("fakefine>=1.5\nfakevision>=0.19\n")
    check = check_env.check_python_and_packages(reqs)[1]
    assert check.status == "todo" and check.detail.startswith(
        "fakevision 1.0 does not import (RuntimeError: operator torchvision::nms does not exist): reinstall")
    assert "fakefine" not in check.detail


def test_a_broken_torchvision_makes_the_command_not_ready(tmp_path, tiny_mnist, monkeypatch, capsys):
    """The case as it happened, end to end (in this process: test_runs_as_a_module starts one): torchvision of a
    fitting version whose import raises."""
    check_env.check_python_and_packages()  # the other packages imported first, with the real torchvision
    fake_package(tmp_path, "torchvision", "99.0", 'raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision")  # put back after the test
    assert check_env.main(["--for", "lenet5", "--data-dir", str(tiny_mnist)]) == 1
    lines = capsys.readouterr().out.splitlines()
    packages, = [line for line in lines if line.startswith("packages")]
    assert packages.startswith("packages   todo  ")
    assert "torchvision 99.0 does not import (RuntimeError: operator torchvision::nms does not exist)" in packages
    assert lines[-1].startswith("not ready for lenet5: packages")


def test_metrics_out_on_a_folder_is_one_line_before_any_check(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"^error: --metrics-out .* is a folder"):
        check_env.main(["--metrics-out", str(tmp_path)])
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # a process that imports every package of requirements.txt: seconds
def test_runs_as_a_module(tiny_mnist):
    done = subprocess.run([sys.executable, "-m", "training.check_env", "--for", "lenet5",
                           "--data-dir", str(tiny_mnist)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stderr == "" and f"mnist      ok    {tiny_mnist}" in done.stdout.splitlines()
    assert done.stdout.splitlines()[-1].startswith(("ready for lenet5", "not ready for lenet5"))


def test_lenet5_asks_for_the_compiled_gelu_only_for_act_cpp(no_gpu, tmp_path, monkeypatch, capsys):
    """The CPU try-out never builds gelu_ext: `--for lenet5` (default --act torch) is ready without it;
    `--act cpp` is not, and says how to build it."""
    import gelu_ext
    from conftest import write_tiny_mnist
    mnist = write_tiny_mnist(tmp_path / "mnist", n_train=20, n_test=10)
    monkeypatch.setattr(gelu_ext, "is_built", lambda: False)
    assert check_env.main(["--for", "lenet5", "--data-dir", str(mnist)]) == 0
    lines = capsys.readouterr().out.splitlines()
    gelu = next(line for line in lines if line.startswith("gelu_ext"))
    assert gelu.split()[1] == "note" and "only lenet5.py --act cpp needs it" in gelu and "circular" not in gelu
    assert gelu.endswith("pip install --no-build-isolation -e ./gelu_ext") and lines[-1] == "ready for lenet5"
    assert check_env.main(["--for", "lenet5", "--act", "cpp", "--data-dir", str(mnist)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.startswith("gelu_ext")).split()[1] == "todo"
    assert lines[-1] == "not ready for lenet5: gelu_ext"
