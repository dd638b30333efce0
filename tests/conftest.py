"""Shared test fixtures: the repository on sys.path, the real data under ../shared/data, tiny MNIST files,
a generated corpus with its tokenizer, and a private Slurm cluster."""
import contextlib
import gzip
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

# One thread a process, for the tests and every process they start (inherited): they run ranks, Slurm
# jobs and servers side by side on what may be a 2-core machine, where a process's OpenMP threads wait
# on each other behind other load and crawl.
# Before torch is imported; an explicit setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ctrl-C reaches the processes the tests start even when pytest itself runs in the background of a
# script (`.ci/run &`), where the shell starts it with SIGINT ignored and every child would inherit that
# (a Python child then never sees KeyboardInterrupt, a bash child cannot trap INT). A Python handler is
# reset to the default on exec, an ignored signal is not.
signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the real data: LAB5_DATA, as the scripts read it (a relative path: from where pytest started), else
# ../shared/data; out of the environment, so that the scripts under test find only the data a test gives them
SHARED_DATA = Path(os.environ.pop("LAB5_DATA", "") or os.environ.get("LAB5_SHARED_DATA")  # (its former name)
                   or REPO.parent / "shared" / "data").resolve()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: over ~10 s here (real training runs, Slurm, a browser, builds); "
                                       "the quick subset is pytest -m 'not slow' tests")


def require_or_skip(reason, required_by):
    """Skip a test for a missing `reason`, or fail it where CI sets the env `required_by` to 1."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason} ({required_by}=1)")
    pytest.skip(reason)


def wait_for(ready, timeout=120, poll=0.02, proc=None):
    """Poll `ready()` until true, the timeout passes or `proc` exits; returns ready()'s last value."""
    deadline = time.time() + timeout
    while not (done := ready()) and (proc is None or proc.poll() is None) and time.time() < deadline:
        time.sleep(poll)
    return done


def in_process(main, capsys, *args):
    """A script's main(args) in this process, read as its process would end (sys.exit("error: ...") prints the
    line and exits 1): a CompletedProcess, as run_script's, without a Python start and torch import per case."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as stop:
        code = stop.code or 0
    out, err = capsys.readouterr()
    if isinstance(code, str):
        code, err = 1, err + code + "\n"
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """An Accelerator's state is per process: reset it after each test, so that the next in-process
    gpt_train.main() starts as a new process would (only where a test imported accelerate)."""
    yield
    state = sys.modules.get("accelerate.state")
    if state:
        state.AcceleratorState._reset_state(True)


@pytest.fixture
def shared_data():
    """The read-only real data; CI sets LAB5_REQUIRE_DATA=1 so its absence fails instead of skipping."""
    if not SHARED_DATA.is_dir():
        require_or_skip(f"no real data at {SHARED_DATA} (LAB5_DATA)", "LAB5_REQUIRE_DATA")
    return SHARED_DATA


def write_idx(path, tensor, gz=False, magic=None):
    """Write a uint8 tensor as an IDX file (optionally gzipped, optionally with a wrong magic)."""
    dims = tuple(tensor.shape)
    header = magic if magic is not None else bytes([0, 0, 0x08, len(dims)])
    payload = header + struct.pack(f">{len(dims)}I", *dims) + tensor.contiguous().numpy().tobytes()
    path = Path(str(path) + ".gz") if gz else Path(path)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def synthetic_digits(n, seed):
    """n 28x28 uint8 images of 10 learnable classes: a fixed random blob per class plus noise."""
    g = torch.Generator().manual_seed(1234)  # same class templates for train and test
    templates = (torch.rand(10, 28, 28, generator=g) > 0.7).float() * 255
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    noise = torch.rand(n, 28, 28, generator=g) * 120
    images = (templates[labels] * 0.6 + noise).clamp(0, 255).to(torch.uint8)
    return images, labels.to(torch.uint8)


def write_tiny_mnist(root, n_train=600, n_test=200):
    """Synthetic digits in MNIST's file names (train images gzipped, the rest plain: both readers)."""
    root.mkdir(parents=True, exist_ok=True)
    splits = ((("train-images-idx3-ubyte", "train-labels-idx1-ubyte"), n_train, 1, True),
              (("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), n_test, 2, False))
    for (images_name, labels_name), n, seed, gz in splits:
        images, labels = synthetic_digits(n, seed)
        write_idx(root / images_name, images, gz=gz)
        write_idx(root / labels_name, labels)
    return root


@pytest.fixture
def tiny_mnist(tmp_path):
    """A data dir with 600 train / 200 test synthetic digits."""
    return write_tiny_mnist(tmp_path / "mnist")


def run_script(script, *args, timeout=300, **kw):
    """One of the repository's scripts, run as a user runs it; the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def start_script(script, *args, **kw):
    """The same in the background (a Popen with text pipes), for tests that signal it."""
    return subprocess.Popen([sys.executable, str(REPO / script), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "qua", "ther", "ing", "ment"]


def generated_docs(n, seed=0):
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(300)]
    return [" ".join(rng.choices(words, k=rng.randint(20, 60))).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Generated text and a 512-token BPE trained on it: small enough for seconds-long GPT runs."""
    import tokenizer_train
    root = tmp_path_factory.mktemp("gpt")
    text = root / "X.txt"
    text.write_text("\n".join(generated_docs(300)) + "\n")
    tokenizer_train.save_atomic(tokenizer_train.train_bpe(generated_docs(300), vocab_size=512), root / "tok.json")
    return root


def tiny_args(corpus, out_dir, *extra):
    """gpt_train.py flags for a seconds-long fp32 run on `corpus` (later flags override earlier ones)."""
    return ["--preset", "tiny", "--text", str(corpus / "X.txt"), "--tokenizer", str(corpus / "tok.json"),
            "--cache-dir", str(corpus / "cache"), "--out-dir", str(out_dir), "--n-embd", "32", "--seq-len", "32",
            "--micro-batch", "4", "--global-batch", "8", "--compile", "off", "--precision", "fp32",
            "--eval-every", "1000", "--val-batches", "2", "--log-every", "2", *extra]


@pytest.fixture(scope="session")
def slurm_session():
    """A real two-node Slurm cluster (tests/slurm_cluster.py), started once; CI sets
    LAB5_REQUIRE_SLURM=1 so that a machine without one fails instead of skipping."""
    import slurm_cluster
    reason = slurm_cluster.unavailable()
    if reason:
        require_or_skip(f"Slurm required: {reason}", "LAB5_REQUIRE_SLURM")
    cluster = slurm_cluster.SlurmCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_session):
    """The cluster with idle nodes; whatever a test leaves running is cancelled before the next one."""
    slurm_session.wait_idle()
    yield slurm_session
    slurm_session.cancel_all()


@pytest.fixture
def text_file(tmp_path):
    """An X.txt of 400 generated documents."""
    path = tmp_path / "X.txt"
    path.write_text("\n".join(generated_docs(400)) + "\n")
    return path


@pytest.fixture(scope="session")
def small_tokenizer():
    """A 512-token BPE of text_file's documents, trained once per test run."""
    import tokenizer_train
    return tokenizer_train.train_bpe(generated_docs(400), vocab_size=512)


@contextlib.contextmanager
def tmpfs(where, size, read_only=False):
    """A real small or read-only disk on `where` for the block (a tmpfs: root, as in CI, ignores file
    modes, so only a mount makes a folder unwritable); the test skips where mount is not permitted."""
    options = ("ro," if read_only else "") + f"size={size}"
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                 capture_output=True).returncode == 0
    except FileNotFoundError:  # no mount command
        mounted = False
    if not mounted:
        pytest.skip("mount -t tmpfs not permitted here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)
