"""tokenizer_train.py: the BPE, its measures, the script (the pipeline it uses: test_wos.py)."""
import functools
import json
import os
import signal
import subprocess
import sys
import time

import huggingface_hub.constants as hf_constants
import pytest
from transformers import PreTrainedTokenizerFast

import tokenizer_train
from conftest import REPO, generated_docs, run_script, tmpfs, wait_for
from conftest import in_process as main_in_process
from data import tokenizer, wos
from data.blocks import Packing, token_blocks
from data.tokenizer import EOT, open_tokenizer

in_process = functools.partial(main_in_process, tokenizer_train.main)  # in_process(capsys, *args)


# ------------------------------------------------------------------ tokenizer

def test_bpe_round_trip_and_load_through_transformers(small_tokenizer, tmp_path):
    path = tmp_path / "tok" / "tokenizer.json"
    tokenizer_train.save_atomic(small_tokenizer, path)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOT)
    assert tok.vocab_size == 512 and tok.eos_token_id == small_tokenizer.token_to_id(EOT)
    for text in ["Kalomi nupe ratoving.", "Ünïcödé — 中文字符, emoji 🚀, tabs\tand  spaces", "  leading space"]:
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text
    assert tokenizer_train.measures(small_tokenizer, generated_docs(50, seed=9))["val_round_trip_failures"] == 0


def test_bytes_per_token_counts_utf8_bytes(small_tokenizer):
    docs = generated_docs(20, seed=3)
    n_tokens = sum(len(small_tokenizer.encode(d).ids) for d in docs)
    expected = sum(len(d.encode()) for d in docs) / n_tokens
    assert tokenizer_train.measures(small_tokenizer, docs)["val_bytes_per_token"] == pytest.approx(expected)
    assert expected > 1.5  # BPE merges do compress the generated syllables


# ------------------------------------------------------------------ the script

@pytest.mark.slow
def test_script_on_standin_corpus(shared_data, tmp_path):
    out, metrics_path = tmp_path / "tokenizer.json", tmp_path / "metrics.json"
    args = ["--text", str(shared_data / "wos-standin" / "X.txt"), "--vocab-size", "4096", "--out", str(out),
            "--cache-dir", str(tmp_path / "cache"), "--compare", "none", "--metrics-out", str(metrics_path)]
    metrics = tokenizer_train.main(args)
    assert json.loads(metrics_path.read_text()) == metrics
    assert metrics["vocab_size"] == 4096 and metrics["val_round_trip_failures"] == 0
    assert metrics["num_train_docs"] + metrics["num_val_docs"] == 6925 and metrics["num_val_docs"] == 35
    assert 3.0 < metrics["val_bytes_per_token"] < 6.0  # English prose: ~4 bytes per token
    assert metrics["gpt2_val_bytes_per_token"] is None and not metrics["tokenize_from_cache"]
    assert metrics["corpus"]["name"] == "stand-in" and metrics["corpus"]["documents"] == 6925
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out))
    assert tok.decode(tok("The kernel's PCI host bridge.")["input_ids"]) == "The kernel's PCI host bridge."
    with pytest.raises(SystemExit, match="exists; pass --force"):
        tokenizer_train.main(args)
    assert tokenizer_train.main(args + ["--force"])["tokenize_from_cache"]  # same tokenizer: cache reused


@pytest.mark.slow
@pytest.mark.parametrize("form", ["folder", "file"])
def test_compare_with_gpt2_offline_from_a_folder_or_a_file(shared_data, tmp_path, form, monkeypatch, capsys):
    """GPT-2's bytes per token next to the own, with no network (the folder as a user
    runs it, offline; the file in this process, the hub's client switched off the same way)."""
    gpt2 = shared_data / "gpt2-tokenizer"
    metrics_path = tmp_path / "m.json"
    compare = gpt2 if form == "folder" else gpt2 / "tokenizer.json"
    args = ["--text", shared_data / "wos-standin" / "X.txt", "--vocab-size", "1024", "--out", tmp_path / "t.json",
            "--seq-len", "0", "--cache-dir", tmp_path / "cache", "--compare", compare, "--metrics-out", metrics_path]
    if form == "folder":
        result = run_script("tokenizer_train.py", *args, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    else:
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        result = in_process(capsys, *args)
    assert result.returncode == 0, result.stderr[-800:]
    metrics = json.loads(metrics_path.read_text())
    assert metrics["compare_vocab_size"] == 50257 and metrics["compare_sha256"] == open_tokenizer(gpt2).sha256
    assert metrics["val_bytes_per_token"] < metrics["gpt2_val_bytes_per_token"] < 6.0  # 1K merges compress less
    ratio = metrics["val_token_ratio_per_doc"]  # own tokens / GPT-2 tokens, document by document
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["median"] > 1
    assert 0 <= metrics["val_docs_own_fewer_tokens"] < metrics["num_val_docs"] / 2


def test_compare_without_a_local_copy_is_a_one_line_note(text_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    metrics = tokenizer_train.main(["--text", str(text_file), "--vocab-size", "512", "--out",
                                    str(tmp_path / "t.json"), "--seq-len", "0", "--cache-dir", str(tmp_path / "cache"),
                                    "--compare", "gpt2"])
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: no comparison")]
    assert len(notes) == 1 and "put the tokenizer's folder" in notes[0]
    assert metrics["gpt2_val_bytes_per_token"] is None and metrics["compare_sha256"] is None
    assert metrics["val_token_ratio_per_doc"] is None


def test_the_cache_written_is_the_one_gpt_train_reads(text_file, tmp_path):
    """--seq-len as gpt_train's: blocks of seq_len + 1 tokens, loaded from the cache, not re-grouped."""
    out, cache = tmp_path / "t.json", tmp_path / "cache"
    metrics = tokenizer_train.main(["--text", str(text_file), "--vocab-size", "512", "--out", str(out),
                                    "--seq-len", "31", "--cache-dir", str(cache), "--compare", "none"])
    assert not metrics["tokenize_from_cache"]
    packing = Packing(wos.tokens_per_block(31), cache_dir=cache)  # what gpt_train.py --seq-len 31 does
    blocks, stats = token_blocks(wos.read_corpus(text_file), open_tokenizer(out).tokenizer, packing)
    assert stats["train"]["from_cache"] and stats["validation"]["from_cache"]
    assert blocks["train"].shape[1] == 32 and stats["train"]["tokens"] == metrics["num_train_tokens"]


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_writes_nothing(text_file, tmp_path):
    """Ctrl-C while training (made slow here): one line, exit 130, no traceback, no --out."""
    out, ready = tmp_path / "t.json", tmp_path / "training"
    slow = ("import pathlib, runpy, sys, time; import tokenizer_train as t; train = t.train_bpe\n"
            f"def slow(*a, **k): pathlib.Path({str(ready)!r}).touch(); time.sleep(30); return train(*a, **k)\n"
            "t.train_bpe = slow; sys.argv = ['tokenizer_train.py'] + sys.argv[1:]; t.main(); sys.exit(0)")
    proc = subprocess.Popen([sys.executable, "-c", slow, "--text", str(text_file), "--vocab-size", "512", "--out",
                             str(out), "--compare", "none", "--seq-len", "0"], cwd=REPO, stderr=subprocess.PIPE,
                            text=True)
    wait_for(ready.exists, proc=proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and not out.exists(), err[-2000:]
    assert err.strip().splitlines()[-1] == (f"interrupted (Ctrl-C): {out} is written when training ends (the token "
                                            f"cache after it): run the command again, with --force if {out} exists")


@pytest.mark.parametrize("args, message", [(["--vocab-size", "1000"], "multiple of 64"),
                                           (["--val-fraction", "0.9"], "--val-fraction"),
                                           (["--vocab-size", "many"], "--vocab-size: expected an integer")])
def test_bad_flags(args, message, capsys):
    result = in_process(capsys, *args)
    assert result.returncode == 2 and message in result.stderr


def test_missing_text_is_one_line(tmp_path):  # as a user runs it: the process's one line
    result = run_script("tokenizer_train.py", "--text", str(tmp_path / "missing.txt"),
                        "--out", str(tmp_path / "t.json"))
    assert result.returncode == 1 and result.stderr.strip() == f"error: --text {tmp_path / 'missing.txt'}: no such file"


def test_a_corpus_without_line_breaks_is_refused_before_training(tmp_path, capsys):
    text = tmp_path / "X.txt"
    text.write_bytes(b"word " * 400_000 + b"\nA short second document.\n")  # 2 MB on one line
    started = time.perf_counter()
    result = in_process(capsys, "--text", text, "--out", tmp_path / "t.json", "--compare", "none",
                        "--cache-dir", tmp_path / "cache")
    assert result.returncode == 1 and time.perf_counter() - started < 60
    assert result.stderr.strip() == (f"error: {text}: line 1 has over 1,000,000 bytes; expected one document (an "
                                     f"abstract) per line")
    assert not (tmp_path / "t.json").exists()


def test_a_utf16_corpus_is_one_line(tmp_path, capsys):
    text = tmp_path / "X.txt"
    text.write_bytes("\n".join(generated_docs(40)).encode("utf-16"))
    result = in_process(capsys, "--text", text, "--out", tmp_path / "t.json", "--compare", "none",
                        "--cache-dir", tmp_path / "cache")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {text}: line 1 is ") and "NUL bytes: UTF-16 or binary" in result.stderr


def test_a_token_cache_that_cannot_be_made_keeps_the_trained_tokenizer(tmp_path):
    """Enough bytes for a block, too few tokens once trained: the tokenizer stays, with a
    warning naming --seq-len, and the metrics say why there is no cache."""
    text, out, metrics_out = tmp_path / "X.txt", tmp_path / "t.json", tmp_path / "m.json"
    text.write_text("\n".join(generated_docs(60)) + "\n")
    metrics = tokenizer_train.main(["--text", str(text), "--out", str(out), "--compare", "none", "--val-fraction",
                                    "0.1", "--seq-len", "1024", "--vocab-size", "512", "--cache-dir",
                                    str(tmp_path / "cache"), "--metrics-out", str(metrics_out)])
    assert open_tokenizer(out).sha256 == metrics["tokenizer_sha256"]
    assert "too few for one block of 1025 (--seq-len 1024 + 1): give a smaller --seq-len" in \
        metrics["token_cache_problem"]
    assert json.loads(metrics_out.read_text())["num_train_tokens"] is None


def test_a_token_cache_the_disk_could_not_take_is_not_claimed_written(text_file, tmp_path, monkeypatch, capsys):
    """The cache's files fail to write (a full disk): the last line names the tokenizer only, never the cache,
    and the metrics say why there is none."""
    from data import files

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files, "write_manifest", full)
    metrics = tokenizer_train.main(["--text", str(text_file), "--out", str(tmp_path / "t.json"), "--compare", "none",
                                    "--seq-len", "64", "--vocab-size", "512", "--cache-dir", str(tmp_path / "cache")])
    assert "No space left on device" in metrics["token_cache_problem"] and metrics["num_train_tokens"] is None
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 't.json'}"


@pytest.mark.parametrize("flag, make, message", [
    ("--out", lambda p: (p / "folder").mkdir() or p / "folder", "is a folder"),
    ("--metrics-out", lambda p: (p / "file").write_text("x") and p / "file" / "m.json", "cannot be written"),
])
def test_unwritable_outputs_fail_before_training(text_file, tmp_path, flag, make, message, capsys):
    result = in_process(capsys, "--text", text_file, "--compare", "none", "--out", tmp_path / "t.json", flag,
                        make(tmp_path))
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert "training" not in result.stdout and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("clash", ["--text", "--compare"])
def test_an_output_that_is_an_input_is_refused_before_work(text_file, small_tokenizer, tmp_path, clash, capsys):
    """--metrics-out (or --out --force) onto the corpus or the compared tokenizer."""
    compare = tmp_path / "compare.json"
    tokenizer_train.save_atomic(small_tokenizer, compare)
    before = {p: p.read_bytes() for p in (text_file, compare)}
    target = text_file if clash == "--text" else compare
    result = in_process(capsys, "--text", text_file, "--compare", compare, "--out", tmp_path / "t.json",
                        "--force", "--cache-dir", tmp_path / "cache", "--metrics-out", target)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: --metrics-out {target} would overwrite {clash} {target} (an input)")
    assert {p: p.read_bytes() for p in before} == before and not (tmp_path / "cache").exists()


def test_a_read_only_cache_dir_is_one_line_before_work(text_file, tmp_path, capsys):
    """Said before any work (root ignores file modes, so a read-only mount; skipped where mount is not permitted)."""
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    with tmpfs(cache, "64k", read_only=True):
        result = in_process(capsys, "--text", text_file, "--compare", "none", "--out", tmp_path / "t.json",
                            "--cache-dir", cache)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr[-800:]
    assert result.stderr.startswith(f"error: --cache-dir {cache} cannot be written (Read-only file system)")
    assert "training" not in result.stdout


@pytest.mark.parametrize("flags, message", [
    (["--vocab-size", str(2**40)], "--vocab-size: must be in [512, 1048576]"),
    (["--vocab-size", "2147483584"], "--vocab-size: must be in [512, 1048576]"),  # past int32 once rounded
    (["--vocab-size", "1000"], "--vocab-size: must be a multiple of 64"),
    (["--seed", "-1"], "--seed: must be in [0, 4294967296)"),
])
def test_numeric_flags_out_of_range_are_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        tokenizer_train.parse_args(flags)
    assert stop.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]


# ------------------------------------------------------------------ the save after the work

def quick_args(text_file, tmp_path, out):
    return ["--text", str(text_file), "--out", str(out), "--force", "--compare", "none", "--seq-len", "0",
            "--vocab-size", "512", "--cache-dir", str(tmp_path / "cache")]


def test_a_folder_named_like_the_temporary_file_does_not_stop_the_save(text_file, tmp_path):
    """tokenizer.json.tmp, a fixed name: a folder there ended the run in a Rust error after the work."""
    out = tmp_path / "t.json"
    (tmp_path / "t.json.tmp").mkdir()
    metrics = tokenizer_train.main(quick_args(text_file, tmp_path, out))
    assert open_tokenizer(out).sha256 == metrics["tokenizer_sha256"] and (tmp_path / "t.json.tmp").is_dir()


def test_a_full_disk_at_the_save_is_one_line_and_keeps_the_old_tokenizer(text_file, small_tokenizer, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    with tmpfs(disk, "64k"):
        out = disk / "t.json"
        tokenizer_train.main(quick_args(text_file, tmp_path, out))  # the old tokenizer, this program's
        old = out.read_bytes()
        with open(disk / "filler", "wb") as f:  # room for the probe (an empty file), not for a tokenizer
            f.write(b"x" * (64 * 1024 - len(old) - 8192))
        with pytest.raises(SystemExit) as stop:
            tokenizer_train.main(quick_args(text_file, tmp_path, out) + ["--vocab-size", "576"])
        assert str(stop.value.code) == f"error: cannot write {out}: No space left on device"
        assert out.read_bytes() == old and sorted(p.name for p in disk.iterdir()) == ["filler", "t.json"]
