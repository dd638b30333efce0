"""benchmarks/gpu_check.sh where a CPU can show it: its refusals before any work, --prepare, the wheel
choice and the checks of a prepared folder, and rehearsals (--rehearse, the same steps at the smallest
sizes) writing their results under OUT as each step ends, cut steps included. The rehearsals are few and
each serves several tests (module-scoped fixtures); a step whose real work another test covers is faked."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import REPO, generated_docs, write_tiny_mnist

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check_tools

STEPS = ["build", "tokenizer", "gpt-own-vocab", "lenet-torch", "lenet-cpp", "gpt-own-vocab-regional-compile",
         "compile-ab", "ladder", "gpt-own-vocab-fp16", "cuda-tests", "gpt-gpt2-vocab", "gelu-bench", "lenet-lightning",
         "report"]


def gpu_check(*args, timeout=60, **kw):
    return subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kw)


def tools(command, *args, **kw):
    """A gpu_check_tools.py command, as gpu_check.sh runs it."""
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check_tools.py"), command,
                           *map(str, args)], capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("args, code, message", [
    (["--fast"], 2, "unknown argument --fast"),
    ([], 2, "--out OUTDIR is required"),
    (["--out"], 2, "--out needs a value"),
    (["--budget", "ten", "--out", "x"], 2, "--budget takes whole seconds"),
    (["--only", "lenet", "--out", "x"], 2, "--only: no step 'lenet'"),
    (["--cap", "ladder=soon", "--out", "x"], 2, "--cap takes STEP=SECONDS"),
    (["--prepare", "x", "--python", "3"], 2, "--python takes a version like 3.12"),
])
def test_bad_arguments_are_one_line(args, code, message):
    result = gpu_check(*args)
    assert result.returncode == code and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_header_and_runs_nothing(flag, tmp_path):
    result = gpu_check(flag, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("Every GPU-side check") and "--rehearse" in result.stdout
    assert "#" not in result.stdout.splitlines()[0] and not list(tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_a_gpu_it_stops_at_once_and_writes_nothing(tmp_path):
    result = gpu_check("--out", tmp_path / "out")
    assert result.returncode == 1 and "no NVIDIA GPU here" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_or_an_incomplete_from_is_refused_before_any_work(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.json").write_text("{}")
    result = gpu_check("--rehearse", "--out", tmp_path / "out")
    assert result.returncode == 1 and "is not empty" in result.stderr
    (tmp_path / "prep" / "wheels").mkdir(parents=True)
    result = gpu_check("--rehearse", "--from", tmp_path / "prep", "--out", tmp_path / "new")
    assert result.returncode == 1 and "MNIST/raw not found: make DIR with --prepare" in result.stderr
    assert not (tmp_path / "new").exists()


def prepare_inputs(tmp_path):
    write_tiny_mnist(tmp_path / "mnist")
    (tmp_path / "wos-standin").mkdir()
    (tmp_path / "wos-standin" / "X.txt").write_text("\n".join(generated_docs(300)) + "\n\n")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "tokenizer.json").write_text("{}")
    return {"PATH": "/usr/bin:/bin", "LAB5_MNIST": str(tmp_path / "mnist"),
            "LAB5_TEXT": str(tmp_path / "wos-standin" / "X.txt"), "LAB5_GPT2_TOKENIZER": str(tmp_path / "gpt2")}


@pytest.mark.parametrize("missing", ["LAB5_MNIST", "LAB5_TEXT", "LAB5_GPT2_TOKENIZER"])
def test_prepare_names_a_missing_input_before_any_download(tmp_path, missing):
    env = {**prepare_inputs(tmp_path), missing: str(tmp_path / "nowhere")}
    result = gpu_check("--prepare", tmp_path / "prep", env=env)
    assert result.returncode == 1 and f"(set {missing})" in result.stderr and str(tmp_path / "nowhere") in result.stderr
    assert not (tmp_path / "prep").exists()  # nothing made, nothing downloaded


@pytest.mark.slow
def test_prepare_for_another_python_carries_what_a_bare_image_lacks(tmp_path):
    env = {**prepare_inputs(tmp_path), "PATH": os.environ["PATH"]}
    result = gpu_check("--prepare", tmp_path / "prep", "--python", "3.11", env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    prep = tmp_path / "prep"
    assert list((prep / "wheels").iterdir()) == []  # the lent image has every package the lab needs
    assert (prep / ".gitignore").read_text() == "*\n"  # never committed, wherever DIR is
    assert gzip.decompress((prep / "X.txt.gz").read_bytes()) == (tmp_path / "wos-standin" / "X.txt").read_bytes()
    assert sorted(p.name for p in (prep / "MNIST" / "raw").iterdir()) == [
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz"]
    assert f"prepared {prep} for Python 3.11" in result.stdout
    corpus = tmp_path / "wos-standin" / "X.txt"
    assert (prep / "prep.txt").read_text() == f"python 3.11\ncorpus {corpus}\ndocuments 300\n"


def test_only_the_wheels_of_missing_packages_are_installed(tmp_path):
    for name in ["tqdm-99.0-py3-none-any.whl", "torch-9.0-py3-none-any.whl", "no_such_pkg-1.0-py3-none-any.whl"]:
        (tmp_path / name).write_bytes(b"")
    result = tools("missing-wheels", tmp_path)
    assert result.stdout.split() == [str(tmp_path / "no_such_pkg-1.0-py3-none-any.whl")]  # torch: the image's


def make_prep(tmp_path, tokenizer=None):
    """A --prepare folder as gpu_check.sh makes it, for this interpreter, without the download."""
    prep = tmp_path / "prep"
    write_tiny_mnist(prep / "MNIST" / "raw")
    for f in (prep / "MNIST" / "raw").iterdir():
        if f.suffix != ".gz":
            f.with_name(f.name + ".gz").write_bytes(gzip.compress(f.read_bytes()))
            f.unlink()
    (prep / "wheels").mkdir()
    (prep / "X.txt.gz").write_bytes(gzip.compress(("\n".join(generated_docs(300)) + "\n").encode()))
    (prep / "gpt2-tokenizer").mkdir()
    if tokenizer:
        tokenizer.save(str(prep / "gpt2-tokenizer" / "tokenizer.json"))
    else:
        (prep / "gpt2-tokenizer" / "tokenizer.json").write_text("{}")
    (prep / "prep.txt").write_text(f"python {sys.version_info[0]}.{sys.version_info[1]}\n"
                                   "corpus /data/wos-standin/X.txt\ndocuments 300\n")
    return prep


def carried_wheel(folder):
    """A wheel the machine lacks whose requirement nothing meets: installed with --no-deps, then said by pip check."""
    import zipfile
    meta = "Metadata-Version: 2.1\nName: carried\nVersion: 1.0\nRequires-Dist: no-such-pkg\n"
    with zipfile.ZipFile(folder / "carried-1.0-py3-none-any.whl", "w") as z:
        z.writestr("carried/__init__.py", "")
        z.writestr("carried-1.0.dist-info/METADATA", meta)
        z.writestr("carried-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n")
        z.writestr("carried-1.0.dist-info/RECORD", "")


@pytest.fixture(scope="module")
def from_rehearsal(tmp_path_factory, small_tokenizer):
    """One rehearsal from a prepared folder (a carried wheel in it): the tokenizer, the graded GPT run and
    LeNet-5 (the report: the next rehearsal); (its OUT, its output, seconds)."""
    tmp_path = tmp_path_factory.mktemp("from")
    prep = make_prep(tmp_path, small_tokenizer)
    carried_wheel(prep / "wheels")
    t0 = time.time()
    result = gpu_check("--rehearse", "--from", prep, "--out", tmp_path / "out", "--only",
                       "tokenizer,gpt-own-vocab,lenet-torch", "--budget", "400", timeout=450)
    return tmp_path / "out", result, time.time() - t0


@pytest.mark.slow
def test_rehearsal_from_a_prepared_folder_writes_results_as_steps_end(from_rehearsal):
    """The --from layout (MNIST under DIR/MNIST/raw, the corpus gzipped with its source) read as on the
    GPU; LeNet-5 trains; every step has an entry, in the plan's order."""
    out, result, seconds = from_rehearsal
    assert result.returncode == 0, result.stdout[-3000:]
    assert seconds < 400 + 30
    results = json.loads((out / "results.json").read_text())
    names = [s["step"] for s in results["steps"]]
    assert names == STEPS
    status = {s["step"]: s["status"] for s in results["steps"]}
    asked = ("tokenizer", "gpt-own-vocab", "lenet-torch")
    assert all(status[s] == "ok" for s in asked)
    assert all(v == "skipped: not asked (--only)" for k, v in status.items() if k not in asked)
    assert results["corpus"]["source"] == "/data/wos-standin/X.txt" and results["corpus"]["documents"] == 300
    assert results["results"]["lenet_run_torch_rehearsal_cpu"]["test_accuracy"] > 0.1
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert "logs/lenet-torch.log" in tar.getnames()


@pytest.mark.slow
def test_carried_wheels_are_installed_and_their_unmet_requirements_said(from_rehearsal):
    """--no-deps installs only what the machine lacks; what those wheels need is checked by pip, in one line."""
    out, result, _ = from_rehearsal
    log = (out / "gpu_check.log").read_text()
    assert "(--no-deps): carried-1.0-py3-none-any.whl" in log
    assert "requirements not met (pip check): carried 1.0 requires no-such-pkg, which is not installed." in log


FAKE_LENET = """import os, sys, time
if sys.argv[0].endswith("setup.py"):  # the extension's build fails at once
    os._exit(1)
if sys.argv[0].endswith("lenet5.py"):  # --act cpp fails with an awkward message, --act torch runs past its cap
    if "cpp" in sys.argv:
        print("a failure\\twith a tab and a carriage return\\rin it \\xff", file=sys.stderr, flush=True)
        os._exit(1)
    print("LeNet-5 (a stand-in)", flush=True)
    time.sleep(float(os.environ.get("LENET_SECONDS", 600)))
"""


def fake_site(tmp_path, name, text):
    (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / name / "sitecustomize.py").write_text(text)
    return str(tmp_path / name)


@pytest.mark.slow
def test_a_cut_step_a_failed_step_and_a_failed_import_leave_a_line_each_and_the_next_steps_run(
        tmp_path, tiny_mnist, text_file):
    """A step past its cap is cut and says so; a failure's message, a tab, a carriage return and a byte that is
    not UTF-8 in it, is its status and results.json stays valid; a module that does not import fails its step
    with the reason (an image whose tokenizers cannot import); the report after them is still built from the
    results; OUT holds its five files; the last line is the second call for what was cut or failed."""
    fake = tmp_path / "fake" / "tokenizers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'dill'\")\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'fake'}:{fake_site(tmp_path, 'site', FAKE_LENET)}"}
    result = gpu_check("--rehearse", "--mnist", tiny_mnist, "--text", text_file, "--out", tmp_path / "out",
                       "--only", "lenet-torch,lenet-cpp,tokenizer,report", "--cap", "lenet-torch=1", env=env,
                       timeout=200)
    assert result.returncode == 1
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    status = {s["step"]: s["status"] for s in results["steps"]}
    assert status["lenet-torch"].startswith("cut at ") and status["lenet-torch"].endswith("(cap 1 s)")
    assert status["lenet-cpp"] == "failed (exit 1): a failure with a tab and a carriage return in it \u00ff"
    assert status["tokenizer"].startswith("failed (exit ") and "No module named 'dill'" in status["tokenizer"]
    assert status["report"] == "ok"  # results.json kept updating after them
    again = result.stdout.splitlines()[-1]  # the build came along where gelu_ext is not built (and failed)
    assert again.startswith(f"second call: bash benchmarks/gpu_check.sh --rehearse --out {tmp_path / 'out'}-2 --only ")
    assert set(again.split()[-1].split(",")) - {"build"} == {"tokenizer", "lenet-torch", "lenet-cpp", "report"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu_check.log", "logs.tar.gz", "report.tar.gz", "results.json", "runs.tar.gz"]
    with tarfile.open(tmp_path / "out" / "report.tar.gz") as tar:
        assert "report/results.md" in tar.getnames()


FAKE_NVIDIA_SMI = """#!/bin/bash
case "$*" in
    -L) echo "GPU 0: Fake GPU (UUID: GPU-0)" ;;
    *name*) echo "Fake GPU 80GB" ;;
    *-lms*) echo "timestamp, utilization.gpu [%]"; while sleep 0.25; do echo "$(date +%T), 42 %"; done ;;
    *utilization.gpu*nounits*) echo 42 ;;
    "") echo "| Fake GPU 80GB | 42% |" ;;
    *) exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def fake_gpu_run(tmp_path_factory):
    """The GPU path with a stand-in nvidia-smi (torch sees no CUDA device here) and a stand-in LeNet-5 training
    for 2 s: lenet-torch, then the CUDA tests; (tmp folder, result)."""
    tmp_path = tmp_path_factory.mktemp("gpu")
    mnist, text = write_tiny_mnist(tmp_path / "mnist"), tmp_path / "X.txt"
    text.write_text("\n".join(generated_docs(100)) + "\n")
    env = {**fake_bin(tmp_path), "PYTHONPATH": fake_site(tmp_path, "site", FAKE_LENET), "LENET_SECONDS": "2"}
    result = gpu_check("--mnist", mnist, "--text", text, "--out", tmp_path / "out", "--only", "lenet-torch,cuda-tests",
                       env=env, timeout=200)
    return tmp_path, result


@pytest.mark.slow
def test_nvidia_smi_is_logged_during_a_step_and_stopped_after_it(fake_gpu_run):
    """The GPU path's own plumbing: the GPU's name in the results, the 250 ms CSV (a few samples of the seconds-long
    step) and the snapshot taken during the step, both logged only while it runs."""
    tmp_path, result = fake_gpu_run
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["gpu"] == "Fake_GPU_80GB" and results["rehearsal"] is False, result.stdout[-2000:]
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        csv = tar.extractfile("logs/nvidia-smi-lenet-torch.csv").read().decode().splitlines()
        snapshot = tar.extractfile("logs/nvidia-smi-during-lenet-torch.txt").read().decode()
    assert csv[0] == "timestamp, utilization.gpu [%]" and len(csv) >= 4 and snapshot.startswith("| Fake GPU 80GB")
    still = subprocess.run(["pgrep", "-f", str(tmp_path / "bin")], capture_output=True, text=True).stdout
    assert still == "", "nvidia-smi loggers left running"


@pytest.mark.slow
def test_on_a_gpu_machine_cuda_tests_without_cuda_kernels_fail_in_one_line(fake_gpu_run):
    """nvidia-smi answers, but torch sees no CUDA device here (or the extension has no kernels): the
    CUDA tests would all skip and pytest pass; the step fails and says what is missing."""
    tmp_path, result = fake_gpu_run
    assert result.returncode == 1
    status = {s["step"]: s["status"] for s in json.loads((tmp_path / "out" / "results.json").read_text())["steps"]}
    assert status["cuda-tests"].startswith("failed (exit 1): torch ") and "sees no CUDA device" in status["cuda-tests"]


def one_line_error(result, code=1):
    return result.returncode == code and len(result.stderr.strip().splitlines()) == 1


def test_a_prep_for_another_python_is_refused_in_one_line_within_seconds(tmp_path):
    prep = make_prep(tmp_path)
    (prep / "prep.txt").write_text("python 3.9\n")
    t0 = time.time()
    result = gpu_check("--rehearse", "--from", prep, "--out", tmp_path / "out")
    assert one_line_error(result) and "was prepared for Python 3.9" in result.stderr
    assert f"--python {sys.version_info[0]}.{sys.version_info[1]}" in result.stderr
    assert time.time() - t0 < 30 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "X.txt.gz").write_bytes(b"plain text, not gzip\n"), "X.txt.gz: not in gzip format"),
    (lambda p: (p / "X.txt.gz").write_bytes((p / "X.txt.gz").read_bytes()[:-20]), "X.txt.gz: unexpected end"),
])
def test_a_damaged_prep_is_refused_in_one_line_before_any_work(tmp_path, damage, message):
    prep = make_prep(tmp_path)
    damage(prep)
    result = gpu_check("--rehearse", "--from", prep, "--out", tmp_path / "out")
    assert one_line_error(result) and message in result.stderr and "make DIR again with --prepare" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_tab_a_newline_and_any_byte_in_a_message_keep_results_json_valid(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    tools("record", work, "build", "ok", "3")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check_tools.py"), "record", str(work), "ladder",
                    b"failed (exit 1): a\tb\nc\rd \xff", "4"], check=True)
    assert tools("results", work, tmp_path / "results.json").returncode == 0
    steps = json.loads((tmp_path / "results.json").read_text())["steps"]
    assert steps == [{"step": "build", "status": "ok", "seconds": 3},
                     {"step": "ladder", "status": "failed (exit 1): a b c d \ufffd", "seconds": 4}]


def fake_bin(tmp_path, nvidia_smi=None):
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "nvidia-smi").write_text(nvidia_smi or FAKE_NVIDIA_SMI)
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}


def test_a_hang_before_the_first_step_is_cut_by_its_timeout(tmp_path):
    env = {**fake_bin(tmp_path, "#!/bin/bash\nsleep 600\n"), "GPU_CHECK_PRE_TIMEOUT": "2"}
    t0 = time.time()
    result = gpu_check("--text", tmp_path / "x.txt", "--out", tmp_path / "out", env=env)
    assert one_line_error(result) and "nvidia-smi -L did not answer in 2 s" in result.stderr
    assert time.time() - t0 < 20


def test_cuda_ready_names_a_cpu_only_build(monkeypatch, capsys):
    import torch

    import gelu_ext
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gelu_ext, "is_built", lambda: True)
    monkeypatch.setattr(gelu_ext, "built_with_cuda", lambda: False)
    assert gpu_check_tools.cuda_ready() == 1
    out = capsys.readouterr().out
    assert out.startswith("gelu_ext was built without its CUDA kernel") and len(out.splitlines()) == 1


def test_a_second_call_into_a_locked_out_refuses_and_leaves_it_alone(tmp_path):
    import fcntl
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the first gpu_check.sh holds it, before it has written anything
    try:
        result = gpu_check("--rehearse", "--mnist", tmp_path, "--text", __file__, "--out", out)
    finally:
        os.close(fd)
    assert one_line_error(result) and "is in use by another gpu_check.sh" in result.stderr
    assert list(out.iterdir()) == []


def test_a_gpt2_tokenizer_folder_is_read_as_its_tokenizer_json(tmp_path):
    """--gpt2-tokenizer data/gpt2-tokenizer/ (the folder, as every other script takes it): its tokenizer.json."""
    folder = tmp_path / "gpt2-tokenizer"
    folder.mkdir()
    result = gpu_check("--rehearse", "--mnist", tmp_path, "--text", __file__, "--gpt2-tokenizer", folder,
                       "--out", tmp_path / "out")
    assert one_line_error(result) and f"GPT-2 tokenizer {folder}/tokenizer.json not found" in result.stderr


SLOW_LENET = """import os, sys, time
if sys.argv[0].endswith("lenet5.py"):
    open(os.environ["LENET_PID_FILE"], "w").write(str(os.getpid()))
    time.sleep(600)
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_running_step_records_it_and_exits(tmp_path, tiny_mnist, text_file):
    import signal
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_LENET)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "LENET_PID_FILE": str(tmp_path / "pid")}
    proc = subprocess.Popen(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--rehearse", "--mnist", tiny_mnist,
                             "--text", text_file, "--out", tmp_path / "out", "--only", "lenet-torch"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (tmp_path / "pid").exists() and time.time() < deadline:
        time.sleep(0.5)
    pid = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    time.sleep(1)
    with pytest.raises(ProcessLookupError):  # the step's process group went with it
        os.kill(pid, 0)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    status = {s["step"]: s["status"] for s in results["steps"]}
    assert status["lenet-torch"] == "interrupted by SIGINT" and results["interrupted"].startswith("SIGINT at ")


@pytest.mark.slow
def test_the_graded_gpt_step_is_slurm_gpt_sh_and_its_clock_is_the_shells(from_rehearsal):
    """gpt-own-vocab runs slurm/gpt.sh with its defaults after the tokenizer step (its tokenizer and token
    cache), no compile or micro-batch cache; results.json's clocks put the wall time from the check beside
    the run's own process_seconds (its phases sum to it), within a second of each other."""
    out, result, _ = from_rehearsal
    assert result.returncode == 0, result.stdout[-3000:]
    results = json.loads((out / "results.json").read_text())
    clocks = {c["run"]: c for c in results["clocks"]}
    assert set(clocks) == {"gpt_run_4K-own-vocab-cold_rehearsal_cpu", "lenet_run_torch_rehearsal_cpu"}
    for run, c in clocks.items():
        assert abs(c["shell_wall_seconds"] - c["process_seconds"]) <= 1.0, c
        phases = results["results"][run]["phases"]
        assert abs(sum(phases.values()) - c["process_seconds"]) <= 0.02 * c["process_seconds"]
    with tarfile.open(out / "logs.tar.gz") as tar:
        log = tar.extractfile("logs/gpt-own-vocab.log").read().decode()
    assert any(line.startswith("out ") for line in log.splitlines())  # slurm/gpt.sh's own line
    metrics = results["results"]["gpt_run_4K-own-vocab-cold_rehearsal_cpu"]
    flags = {f for f in metrics["command"].split() if f.startswith("--")}
    assert flags == {"--text", "--tokenizer", "--cache-dir", "--out-dir", "--metrics-out", "--preset", "--tokens",
                     "--val-batches"}  # paths and the rehearsal's size: every training setting gpt_train's default


def test_a_rehearsal_checks_the_built_cuda_kernels_without_a_device(monkeypatch, capsys):
    """No GPU here: the rehearsal's build is judged by its compiled kernels (a CPU-only build fails it)."""
    import gelu_ext
    monkeypatch.setattr(gelu_ext, "is_built", lambda: True)
    monkeypatch.setattr(gelu_ext, "built_with_cuda", lambda: True)
    assert gpu_check_tools.cuda_ready("1") == 0 and capsys.readouterr().out.startswith("gelu_ext: CPU + CUDA kernels")
    monkeypatch.setattr(gelu_ext, "built_with_cuda", lambda: False)
    assert gpu_check_tools.cuda_ready("1") == 1
    assert capsys.readouterr().out.startswith("gelu_ext was built without its CUDA kernel")


def test_the_clock_entry_compares_the_wall_time_from_outside_with_the_runs(tmp_path):
    """A run is timed from the check (fork to exit) beside its own process_seconds; a failed run gets no entry."""
    sleep = [sys.executable, "-c", "import time; time.sleep(1.0)"]
    (tmp_path / "m.json").write_text(json.dumps({"process_seconds": 1.0, "phases": {"loop": 1.0}}))
    assert tools("clocked", tmp_path, tmp_path / "m.json", *sleep).returncode == 0
    (tmp_path / "n.json").write_text(json.dumps({"process_seconds": 8.0, "phases": {"loop": 8.0}}))
    assert tools("clocked", tmp_path, tmp_path / "n.json", *sleep).returncode == 0
    assert tools("clocked", tmp_path, tmp_path / "m.json", sys.executable, "-c", "raise SystemExit(3)").returncode == 3
    entries = [json.loads(line) for line in (tmp_path / "clocks.jsonl").read_text().splitlines()]
    assert [(e["run"], e["process_seconds"]) for e in entries] == [("m", 1.0), ("n", 8.0)]
    assert all(1.0 <= e["shell_wall_seconds"] < 3.0 for e in entries)


def test_the_compile_ab_summary_puts_each_run_in_its_cell():
    """The graded run is compile off's first cold run, the regional-compile step regional's; fp16, GPT-2's
    vocabulary and a run without process_seconds are none."""
    runs = {"cold": 10.0, "regional-compile-cold": 30.0, "ab-off-warm-1": 9.0, "fp16": 1.0, "ab-regional-warm-1": 12.0,
            "ab-off-cold-2": 11.0}
    found = {f"gpt_run_4K-own-vocab-{name}_Fake_GPU": {"process_seconds": s} for name, s in runs.items()}
    found |= {"gpt_run_4K-gpt2-vocab-cold_Fake_GPU": {"process_seconds": 5.0},
              "gpt_run_4K-own-vocab-ab-off-warm-2_Fake_GPU": {}}
    ab = gpu_check_tools.compile_ab(found)
    assert ab["median_process_seconds"] == {"off_cold": 10.5, "off_warm": 9.0, "regional_cold": 30.0,
                                            "regional_warm": 12.0}
    assert ab["process_seconds"]["off_cold"] == {"gpt_run_4K-own-vocab-cold_Fake_GPU": 10.0,
                                                 "gpt_run_4K-own-vocab-ab-off-cold-2_Fake_GPU": 11.0}


FAKE_GPT_TRAIN = """import json, os, sys
if sys.argv[0].endswith("gpt_train.py"):  # every GPT run of the check: its flags noted, a metrics file, no training
    with open(os.environ["GPT_ARGV_LOG"], "a") as f:
        f.write(json.dumps({"xdg": os.environ["XDG_CACHE_HOME"], "argv": sys.argv[1:]}) + "\\n")
    out = sys.argv[sys.argv.index("--metrics-out") + 1]
    with open(out, "w") as f:
        json.dump({"process_seconds": 1.0, "final_train_loss": 5.0, "success": True, "steps": 1, "precision": "fp32",
                   "skipped_steps": 0}, f)
    os._exit(0)
"""


@pytest.mark.slow
def test_every_gpt_run_reads_the_tokenizer_steps_token_cache(tmp_path, tiny_mnist, text_file, small_tokenizer):
    """The compile A/B, fp16 and GPT-2-vocabulary runs, like the graded one, read tokenizer.sh's cache: none of
    them re-tokenises (4-5 s each on the H200), so the compile A/B compares compile alone; warm runs reuse
    a cold run's compile and micro-batch caches, cold ones have their own. What compile-ab needs (the cold
    runs whose caches it warms, the tokenizer) comes along without being asked for."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FAKE_GPT_TRAIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "GPT_ARGV_LOG": str(tmp_path / "argv.jsonl")}
    asked = "compile-ab,gpt-own-vocab-fp16,gpt-gpt2-vocab"
    (tmp_path / "gpt2").mkdir()
    small_tokenizer.save(str(tmp_path / "gpt2" / "tokenizer.json"))
    gpu_check("--rehearse", "--mnist", tiny_mnist, "--text", text_file, "--gpt2-tokenizer", tmp_path / "gpt2",
              "--out", tmp_path / "out", "--only", asked, env=env, timeout=400)
    status = {s["step"]: s["status"] for s in json.loads((tmp_path / "out" / "results.json").read_text())["steps"]}
    came = ["tokenizer", "gpt-own-vocab", "gpt-own-vocab-regional-compile"]
    assert all(status[s] == "ok" for s in [*came, *asked.split(",")]), status
    runs = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    metrics = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    tokenizer_cache = metrics["tokenizer_rehearsal_cpu"]["command"].split("--cache-dir ")[1].split()[0]
    assert len(runs) == 6 and {r["argv"][r["argv"].index("--cache-dir") + 1] for r in runs} == {tokenizer_cache}
    xdg = [os.path.basename(r["xdg"]) for r in runs]  # graded, regional cold, off warm, regional warm, fp16, GPT-2's
    assert xdg[2] == xdg[0] and xdg[3] == xdg[1] and len(set(xdg)) == 4
