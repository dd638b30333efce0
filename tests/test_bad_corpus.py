"""data/wos.py's checks of a corpus a user gives: each refusal one line, before the text is split or tokenised, in
memory bounded by one line, not by the file."""
import shutil
import subprocess
import sys

import pytest

import gpt_train
from conftest import REPO, generated_docs
from data import wos

PEAK = ("import resource, sys; sys.path.insert(0, sys.argv[1]); from data import wos\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    wos.read_corpus(sys.argv[2])\nexcept wos.TextError as e:\n    print(e)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)")  # KiB on Linux


def test_a_corpus_on_one_line_is_refused_in_memory_bounded_by_the_check(tmp_path):
    """20 MB of words and no line break: the check reads a line a megabyte at a time. Reading the file whole and
    splitting it into words (as the corpus's identity did first) took over ten times the file."""
    text = tmp_path / "X.txt"
    with open(text, "wb") as f:
        for _ in range(20):
            f.write(b"word " * 200_000)  # 1 MB
    done = subprocess.run([sys.executable, "-c", PEAK, str(REPO), str(text)], capture_output=True, text=True,
                          timeout=300)
    message, grown = done.stdout.splitlines()
    assert message == f"{text}: line 1 has over 1,000,000 bytes; expected one document (an abstract) per line", \
        done.stderr[-2000:]
    assert int(grown) < 10 << 20  # under half the file (its words as Python strings: ~200 MB)


def latin1_corpus(path):
    docs = [d.replace("ka", "ké").replace("lo", "lö") for d in generated_docs(200)]  # most lines: é or ö
    path.write_bytes("\n".join(docs).encode("latin-1"))
    return docs


def test_a_latin1_corpus_is_refused_with_its_rate_the_flag_and_how_to_convert_it(tmp_path, capsys):
    """It used to train on U+FFFD in place of every accented letter, with one warning, and report success."""
    text = tmp_path / "X.txt"
    docs = latin1_corpus(text)
    bad = sum(d != d.encode("latin-1").decode("utf-8", "replace") for d in docs)
    assert bad > 100
    with pytest.raises(wos.TextError) as refused:
        wos.read_corpus(text)
    assert str(refused.value) == (f"{text}: {bad} of 200 lines ({bad / 200:.0%}) are not valid UTF-8; convert it "
                                  f"(iconv -f LATIN1 -t UTF-8 {text} > X-utf8.txt), or pass --accept-invalid-utf8 "
                                  f"to train on it with the bad bytes as U+FFFD")
    import tokenizer_train  # the flag the line names: accepted, with the warning that says what it reads
    tokenizer_train.main(["--text", str(text), "--accept-invalid-utf8", "--compare", "none", "--seq-len", "0",
                          "--vocab-size", "512", "--out", str(tmp_path / "tok.json"), "--cache-dir", str(tmp_path)])
    assert f"warning: {bad} lines of {text} are not valid UTF-8" in capsys.readouterr().err
    assert gpt_train.parse_args(["--accept-invalid-utf8"]).accept_invalid_utf8  # gpt_train.py takes it too
    if shutil.which("iconv"):  # the advice works
        converted = tmp_path / "X-utf8.txt"
        converted.write_bytes(subprocess.run(["iconv", "-f", "LATIN1", "-t", "UTF-8", str(text)],
                                             capture_output=True, check=True).stdout)
        splits = wos.load_splits(wos.read_corpus(converted))
        assert sorted(splits["train"] + splits["validation"]) == sorted(docs)
        assert "warning" not in capsys.readouterr().err


def test_words_too_long_for_bpe_are_one_line_within_seconds(tmp_path):
    """8 lines of a million letters without a space: BPE training ran past 300 s at a gigabyte, printing nothing."""
    text = tmp_path / "X.txt"
    text.write_text(("x" * 1_000_000 + "\n") * 8)
    done = subprocess.run([sys.executable, "tokenizer_train.py", "--text", str(text), "--compare", "none", "--out",
                           str(tmp_path / "tok.json"), "--cache-dir", str(tmp_path / "cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stderr == (f"error: {text}: line 1 has a word of over 1,000 characters (no "
                                                    f"space in it): BPE's work grows with a word's length; split it "
                                                    f"or remove the line\n")
