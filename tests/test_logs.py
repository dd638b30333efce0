"""What a person reads while a job runs: the scripts' output in a file (a Slurm log: stdout and stderr into one
.out) is one short line per log point, with no progress bar's '\r' redraws; on a terminal the bars stay; and
TensorBoard's first tag group (sorted by name, as its SCALARS page shows them) is the loss or the accuracy."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from conftest import REPO, tiny_args

MAX_LINE = 300


def run_into_file(script, *args, tmp_path, env=None, cwd=None, timeout=600):
    """`script` run as a Slurm job runs it: stdout and stderr into one file; (the exit code, the file's text)."""
    log = tmp_path / f"{script}.out"
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, str(REPO / script), *map(str, args)], stdout=out,
                              stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout).returncode
    return code, log.read_text()


def assert_reads_line_by_line(text):
    assert "\r" not in text, text[:2000]
    long = [line for line in text.splitlines() if len(line) > MAX_LINE]
    assert not long, long[0][:500]
    assert "" not in text.rstrip("\n").splitlines(), text  # no blank line


def first_tag_group(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    return min(EventAccumulator(str(run_dir)).Reload().Tags()["scalars"]).split("/")[0]


def test_gpt_train_in_a_file_is_a_line_a_log_point_and_opens_tensorboard_on_the_loss(corpus, tmp_path):
    """8 steps, a point every 2: four lines `step N/8 | loss | tok/s | ETA` (the step's clock stops before its log
    point: at step 2 its own steady step is timed, so every line has an ETA), the fresh token cache's datasets bars
    silent, and the events' first group `loss` (loss/train, loss/val)."""
    run = tmp_path / "run"
    code, text = run_into_file("gpt_train.py", *tiny_args(corpus, run, "--tokens", str(8 * 8 * 32), "--cache-dir",
                                                          tmp_path / "cache"), tmp_path=tmp_path)
    assert code == 0, text[-3000:]
    assert_reads_line_by_line(text)
    points = re.findall(r"^step (\d)/8 \| loss \d+\.\d{3} \| [\d,]+ tok/s \| ETA (\?|\d+:\d\d:\d\d)$", text,
                        re.MULTILINE)
    assert [step for step, _ in points] == ["2", "4", "6", "8"], text
    assert "?" not in [eta for _, eta in points] and points[-1][1] == "0:00:00", text
    assert first_tag_group(run) == "loss"


@pytest.mark.parametrize("engine", ["plain", pytest.param("lightning", marks=pytest.mark.slow)])
def test_lenet5_in_a_file_is_a_line_a_log_point_and_opens_tensorboard_on_the_accuracy(engine, tiny_mnist, tmp_path):
    """600 images in batches of 50, 2 epochs: 24 steps, a line every 4 (both engines log alike: Lightning's own
    bar stays off), each epoch's line; the events' first group `accuracy` (accuracy/train, accuracy/test)."""
    run = tmp_path / "run"
    code, text = run_into_file("lenet5.py", "--data-dir", tiny_mnist, "--no-download", "--epochs", "2",
                               "--batch-size", "50", "--log-every", "4", "--engine", engine, "--out-dir", run,
                               "--device", "cpu", tmp_path=tmp_path)
    assert code == 0, text[-3000:]
    assert_reads_line_by_line(text)
    points = re.findall(r"^step (\d+)/24 \| loss \d\.\d{4} \| accuracy [\d.]+% \| ETA \d+:\d\d:\d\d$", text,
                        re.MULTILINE)
    assert points == [str(step) for step in range(4, 25, 4)], text
    assert re.search(r"^epoch 2: test loss [\d.]+, accuracy", text, re.MULTILINE)
    assert first_tag_group(run) == "accuracy"


def test_tokenizer_train_in_a_file_finds_gpt2_beside_the_data_and_ends_naming_what_it_wrote(
        shared_data, text_file, tmp_path):
    """LAB5_DATA relative to the folder the script starts in, holding gpt2-tokenizer/ (the HF cache empty, the
    hub off): GPT-2 found there, no blank line (the BPE trainer's bar) and no '\r' (datasets' map bars), and the
    last line names the tokenizer.json and the token cache."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gpt2-tokenizer").symlink_to(shared_data / "gpt2-tokenizer")
    out, cache = tmp_path / "tok.json", tmp_path / "cache"
    env = {**os.environ, "LAB5_DATA": "data", "HF_HUB_CACHE": str(tmp_path / "no-hf-cache"), "HF_HUB_OFFLINE": "1"}
    code, text = run_into_file("tokenizer_train.py", "--text", text_file, "--vocab-size", "512", "--out", out,
                               "--seq-len", "31", "--cache-dir", cache, "--metrics-out", tmp_path / "m.json",
                               tmp_path=tmp_path, env=env, cwd=tmp_path)
    assert code == 0, text[-3000:]
    assert_reads_line_by_line(text)
    assert "no such file" not in text and "(gpt2: " in text, text
    cache_folder, = cache.glob("corpus-*")
    assert text.splitlines()[-1] == f"wrote {out} and the token cache for --seq-len 31 in {cache_folder}"


def test_on_a_terminal_the_bar_stays_and_no_log_lines_are_printed(tiny_mnist, tmp_path):
    """The same run on a pseudo-terminal of 100 columns: tqdm's bar (redrawn with '\r'), and no plain log-point
    lines."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty has 0 columns: no bar
    proc = subprocess.Popen([sys.executable, str(REPO / "lenet5.py"), "--data-dir", str(tiny_mnist), "--no-download",
                             "--epochs", "1", "--batch-size", "50", "--log-every", "4", "--out-dir",
                             str(tmp_path / "run"), "--device", "cpu"], stdout=child, stderr=child)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert proc.wait(timeout=300) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert re.search(r"\repoch 1: +\d+%\|.*\| \d+/12 \[", text), text[-2000:]
    assert not re.search(r"^step \d+/12 \|", text, re.MULTILINE), text[-2000:]
