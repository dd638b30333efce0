"""data/tokenizer.py: every form a tokenizer comes in (file, folder, hub name via the cache or a local copy),
and every way it can be wrong, as one line."""
import time

import huggingface_hub.constants as hf_constants
import pytest

import tokenizer_train
from conftest import generated_docs
from data import tokenizer


def open_tokenizer_of(spec):
    return tokenizer.open_tokenizer(spec).tokenizer


def test_load_tokenizer_errors_are_clear(tmp_path, small_tokenizer, offline):
    with pytest.raises(tokenizer.TokenizerError, match="no such file"):
        open_tokenizer_of(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(tokenizer.TokenizerError, match="not a tokenizer.json"):
        open_tokenizer_of(str(bad))
    good = tmp_path / "good.json"
    tokenizer_train.save_atomic(small_tokenizer, good)
    assert open_tokenizer_of(str(good)).token_to_id(tokenizer.EOT) is not None


GPT2_IDS = {"Hello world": [15496, 995]}  # GPT-2's known ids (data/README.md)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No hub and no local copies: a test that reaches for the network fails."""
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "empty-data"))
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: pytest.fail("the hub was asked"))


def assert_gpt2(loaded):
    assert (loaded.vocab_size, loaded.padded_vocab_size, loaded.eot) == (50257, 50304, 50256)
    assert loaded.tokenizer.encode("Hello world").ids == GPT2_IDS["Hello world"]


def test_tokenizer_from_a_file_and_from_a_folder(shared_data, offline):
    folder = shared_data / "gpt2-tokenizer"
    by_file, by_folder = tokenizer.open_tokenizer(folder / "tokenizer.json"), tokenizer.open_tokenizer(str(folder))
    assert_gpt2(by_file), assert_gpt2(by_folder)
    assert by_file.sha256 == by_folder.sha256 == tokenizer.tokenizer_sha256(by_file.tokenizer)


def test_tokenizer_from_a_folder_without_tokenizer_json(shared_data, offline, tmp_path):
    """vocab.json + merges.txt alone, as the error messages advise: no tokenizer_config.json needed."""
    folder = tmp_path / "slow"
    folder.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (folder / name).write_bytes((shared_data / "gpt2-tokenizer" / name).read_bytes())
    two_files = tokenizer.open_tokenizer(str(folder))
    assert_gpt2(two_files)
    reference = tokenizer.open_tokenizer(shared_data / "gpt2-tokenizer" / "tokenizer.json").tokenizer
    text = "Deep  learning <|endoftext|> été 2024!\n"
    assert two_files.tokenizer.encode(text).ids == reference.encode(text).ids  # the special token whole too
    (folder / "merges.txt").unlink()
    with pytest.raises(tokenizer.TokenizerError, match="neither tokenizer.json nor vocab.json"):
        tokenizer.open_tokenizer(str(folder))


@pytest.mark.parametrize("typed", ["data/tokenizr/tokenizer", "./tok", "~/no-such-tokenizer", "runs/a/b/tok.json"])
def test_a_mistyped_path_is_one_line_never_a_hub_lookup(typed, offline):
    with pytest.raises(tokenizer.TokenizerError, match="no such file or folder") as error:
        tokenizer.open_tokenizer(typed)
    assert "\n" not in str(error.value)


def test_a_name_the_hub_could_not_hold_is_one_line(offline):
    with pytest.raises(tokenizer.TokenizerError, match="not a hub name"):
        tokenizer.open_tokenizer("not a name!")


def test_hub_name_found_beside_the_data_sets(shared_data, offline, tmp_path, monkeypatch):
    """'gpt2' offline: $LAB5_DATA/gpt2-tokenizer/, where the scripts find MNIST and the corpus too."""
    monkeypatch.setenv("LAB5_DATA", str(tmp_path))
    (tmp_path / "gpt2-tokenizer").symlink_to(shared_data / "gpt2-tokenizer")
    loaded = tokenizer.open_tokenizer("gpt2")
    assert_gpt2(loaded)
    assert loaded.source == str(tmp_path / "gpt2-tokenizer")


def test_hub_name_found_in_the_hf_cache_first(offline, small_tokenizer, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--gpt2" / "snapshots" / "abc123"
    tokenizer_train.save_atomic(small_tokenizer, snapshot / "tokenizer.json")
    (tmp_path / "hub" / "models--gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--gpt2" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "data"))  # a copy beside the data too: the cache wins
    other = tokenizer_train.train_bpe(generated_docs(50), 576)
    tokenizer_train.save_atomic(other, tmp_path / "data" / "gpt2-tokenizer" / "tokenizer.json")
    loaded = tokenizer.open_tokenizer("gpt2")
    assert loaded.source == str(snapshot / "tokenizer.json") and loaded.vocab_size == loaded.padded_vocab_size == 512


def test_hub_name_without_a_local_copy_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(tokenizer, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(tokenizer.TokenizerError) as error:
        tokenizer.open_tokenizer("gpt2")
    message = str(error.value)
    assert "\n" not in message and "unreachable" in message and f"at {tmp_path / 'data' / 'gpt2-tokenizer'}" in message


def test_the_hub_probe_never_hangs_on_a_name_lookup(monkeypatch):
    def hangs(*args, **kwargs):  # a name lookup that never answers (until long after the probe gave up)
        time.sleep(30)
        raise OSError("timed out")
    monkeypatch.setattr(tokenizer.socket, "create_connection", hangs)
    started = time.perf_counter()
    assert tokenizer.hub_reachable(timeout=0.5) is False and time.perf_counter() - started < 5


def sparse_ids(small_tokenizer, path):
    """The tokenizer with <|endoftext|> (in every document's end) moved to id 5000, past its 512 tokens."""
    import json
    data = json.loads(small_tokenizer.to_str())
    data["model"]["vocab"][tokenizer.EOT] = 5000
    for added in data["added_tokens"]:
        if added["content"] == tokenizer.EOT:
            added["id"] = 5000
    path.write_text(json.dumps(data))
    return path


def test_a_tokenizer_with_ids_past_its_vocabulary_is_named_not_the_token_cache(small_tokenizer, corpus, tmp_path):
    """Ids with gaps (one >= the vocabulary size): the tokenizer is named, before any work, not blamed on "the
    token cache is damaged: delete it" after a rebuild."""
    import gpt_train
    from conftest import tiny_args
    path = sparse_ids(small_tokenizer, tmp_path / "sparse.json")
    with pytest.raises(tokenizer.TokenizerError, match=f"^tokenizer {path} has ids up to 5,000 for a vocabulary of "
                                                       "512 tokens"):
        tokenizer.open_tokenizer(str(path))
    with pytest.raises(SystemExit) as stop:
        gpt_train.main(tiny_args(corpus, tmp_path / "run", "--tokenizer", str(path), "--cache-dir",
                                 str(tmp_path / "cache")))
    assert str(stop.value.code).startswith(f"error: tokenizer {path} has ids up to 5,000") and \
        "token cache" not in str(stop.value.code)
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("part", ["pre_tokenizer", "normalizer"])
def test_a_tokenizer_that_runs_its_own_regular_expression_is_refused_before_it_encodes(tmp_path, part):
    """A pre-tokenizer (or normalizer) whose regular expression backtracks catastrophically: encoding a short text
    ran 88 s, then panicked in Rust. Only byte-level BPE, whose splitting is built in, is read."""
    from tokenizers import Regex, normalizers, pre_tokenizers
    crafted = tokenizer_train.train_bpe(generated_docs(50), vocab_size=512)
    if part == "pre_tokenizer":
        crafted.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+$"), "isolated")
    else:
        crafted.normalizer = normalizers.Replace(Regex("(a+)+$"), "")
    path = tmp_path / "tokenizer.json"
    crafted.save(str(path))
    started = time.perf_counter()
    with pytest.raises(tokenizer.TokenizerError) as refused:
        tokenizer.open_tokenizer(path)
    kind = "Split" if part == "pre_tokenizer" else "Replace"
    assert str(refused.value) == (f"tokenizer {path}: its {part} is {kind}; only byte-level BPE tokenizers (as "
                                  f"GPT-2's and tokenizer_train.py's) are read, whose work is bounded")
    assert time.perf_counter() - started < 5
