"""data/wos.py: reading and checking X.txt, the split, tokenised blocks and their cache, batches, download."""
import functools
import hashlib
import os

import pytest
import torch
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from tokenizers import Tokenizer

from conftest import REPO, generated_docs
from data import wos
from data.blocks import Packing, epoch_loader, token_blocks
from data.tokenizer import EOT


def splits_of(path, **kw):
    return wos.load_splits(wos.read_corpus(path), **kw)


def test_split_is_by_document_disjoint_and_stable(text_file, tmp_path):
    a = splits_of(text_file, val_fraction=0.05, seed=1)
    b = splits_of(text_file, val_fraction=0.05, seed=1)
    train, val = a["train"], a["validation"]
    assert len(val) == 20 and len(train) == 380
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(generated_docs(400))
    assert b["validation"] == val  # same file, same seed: the same documents, in a new cache
    assert splits_of(text_file, val_fraction=0.05, seed=2)["validation"] != val


def test_the_split_is_datasets_train_test_split(text_file):
    """The split of HF datasets' train_test_split(shuffle=True, seed): the documents earlier runs trained on."""
    datasets = pytest.importorskip("datasets")
    docs = wos.read_corpus(text_file).documents
    theirs = datasets.Dataset.from_dict({"text": docs}).train_test_split(test_size=20, shuffle=True, seed=3)
    ours = splits_of(text_file, val_fraction=0.05, seed=3)
    assert ours == {"train": theirs["train"]["text"], "validation": theirs["test"]["text"]}


def test_blank_lines_skipped_and_a_few_invalid_utf8_lines_replaced_with_warning(tmp_path, capsys):
    """One damaged line in 103 (under 1%: not another encoding) is read with replacement characters."""
    path = tmp_path / "X.txt"
    others = "\n".join(generated_docs(100)).encode()
    path.write_bytes(b"first doc\n\n   \nsecond \xff\xfe doc\r\nthird doc\n\n" + others)
    splits = splits_of(path, val_fraction=0.34)
    docs = sorted(splits["train"] + splits["validation"])
    assert docs == sorted(["first doc", "second \ufffd\ufffd doc", "third doc"] + generated_docs(100))
    assert "warning: 1 lines of" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [(b"", "is empty"), (b"\n  \n\n", "is empty"),
                                              (b"just one line\n\n", "1 usable line")])
def test_unusable_files_are_rejected(tmp_path, content, message):
    path = tmp_path / "X.txt"
    path.write_bytes(content)
    with pytest.raises(wos.TextError, match=message):
        splits_of(path)


def test_missing_text_names_what_to_download(tmp_path, monkeypatch):
    with pytest.raises(wos.TextError, match="no such file"):
        wos.resolve_text(tmp_path / "nope.txt")
    with pytest.raises(wos.TextError, match="is a folder: give the X.txt inside it"):
        wos.resolve_text(tmp_path)
    with pytest.raises(wos.TextError, match="not a plain file"):
        wos.resolve_text("/dev/null")
    monkeypatch.setenv("LAB5_DATA", str(tmp_path))
    with pytest.raises(wos.TextError, match=r"WebOfScience/WOS46985/X.txt not found: download WebOfScience.zip"):
        wos.resolve_text(None, download=False)


def test_blocks_have_the_right_length_and_content(text_file, small_tokenizer, tmp_path):
    splits = splits_of(text_file, val_fraction=0.1)
    blocks, stats = wos.tokenize_blocks(splits, small_tokenizer, block_size=64)
    joined = "".join(d + EOT for d in splits["train"])
    assert blocks["train"].dtype == torch.int32 and blocks["train"].shape[1] == 64
    for row in blocks["train"][::7].tolist():
        assert small_tokenizer.decode(row, skip_special_tokens=False) in joined
    first = small_tokenizer.decode(blocks["train"][0].tolist(), skip_special_tokens=False)
    assert joined.startswith(first)  # block 0 is the start of the first document
    total = stats["train"]["tokens"] + stats["train"]["docs"]  # + one end-of-text per document
    assert total - 64 * len(blocks["train"]) < 64 * ((stats["train"]["docs"] + 999) // 1000)
    assert stats["train"]["bytes"] == sum(len(d.encode()) for d in splits["train"])


@pytest.fixture
def blocks(text_file, small_tokenizer, tmp_path):
    return wos.tokenize_blocks(splits_of(text_file), small_tokenizer, 32)[0]["train"]


def batches(loader):
    return [b.tolist() for b in loader]


def test_batch_order_is_seeded_per_epoch(blocks):
    a0 = batches(epoch_loader(blocks, 4, seed=0, epoch=0))
    assert a0 == batches(epoch_loader(blocks, 4, seed=0, epoch=0))
    assert a0 != batches(epoch_loader(blocks, 4, seed=0, epoch=1))
    assert a0 != batches(epoch_loader(blocks, 4, seed=1, epoch=0))
    assert len(a0) == len(blocks) // 4 and all(len(b) == 4 and len(b[0]) == 32 for b in a0)
    assert torch.is_tensor(next(iter(epoch_loader(blocks, 4, 0, 0))))


@pytest.mark.parametrize("epoch", [0, 3])  # past the first epoch too
def test_resume_sees_exactly_the_remaining_batches(blocks, epoch):
    full = batches(epoch_loader(blocks, 4, seed=5, epoch=epoch))
    resumed = batches(skip_first_batches(epoch_loader(blocks, 4, seed=5, epoch=epoch), 7))
    assert resumed == full[7:]


def test_rank_shards_do_not_overlap(blocks):
    loader = epoch_loader(blocks, 4, seed=0, epoch=0)
    shards = [batches(prepare_data_loader(epoch_loader(blocks, 4, seed=0, epoch=0), num_processes=2,
                                          process_index=rank, put_on_device=False)) for rank in (0, 1)]
    rows = [tuple(row) for shard in shards for batch in shard for row in batch]
    whole = [tuple(row) for batch in batches(loader) for row in batch]
    assert len(shards[0]) == len(shards[1]) == len(whole) // 8
    assert len(set(rows)) == len(rows) and set(rows) <= set(whole)


def test_an_epoch_cut_to_whole_global_batches_splits_alike_on_any_process_count(blocks):
    one = batches(epoch_loader(blocks, 4, seed=0, epoch=2, whole=8))
    assert len(one) * 4 == len(blocks) - len(blocks) % 8  # whole global batches of 8, the rest left out
    shards = [batches(prepare_data_loader(epoch_loader(blocks, 4, seed=0, epoch=2, whole=8), num_processes=2,
                                          process_index=rank, put_on_device=False)) for rank in (0, 1)]
    assert [b for pair in zip(*shards) for b in pair] == one  # round k on 2 processes = micro-batches 2k, 2k+1


def test_wos_download_unpacks_x_txt(tmp_path, monkeypatch):
    """The download path against a local HTTP server serving a WebOfScience.zip of the real layout."""
    import http.server
    import threading
    import zipfile
    archive = tmp_path / "served" / "WebOfScience.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("WebOfScience/WOS46985/X.txt", "first abstract\nsecond abstract\n")
        z.writestr("WebOfScience/WOS11967/X.txt", "not this one\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(archive.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(wos, "WOS_ZIP_URL", f"http://127.0.0.1:{server.server_port}/WebOfScience.zip")
        monkeypatch.setenv("LAB5_DATA", str(tmp_path / "data"))
        path = wos.resolve_text(None, download=True)
    finally:
        server.shutdown()
    assert path == tmp_path / "data" / "WebOfScience" / "WOS46985" / "X.txt"
    assert path.read_text() == "first abstract\nsecond abstract\n"
    assert not list((tmp_path / "data").rglob("*.part"))


def test_failed_wos_download_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wos, "WOS_ZIP_URL", "http://127.0.0.1:9/WebOfScience.zip")
    monkeypatch.setenv("LAB5_DATA", str(tmp_path))
    with pytest.raises(wos.TextError, match="not found: download WebOfScience.zip from https://data.mendeley.com"):
        wos.resolve_text(None, download=True)
    assert "warning: WOS download failed" in capsys.readouterr().err


# ------------------------------------------------------------------ what a corpus is, from its content

def test_the_standin_is_named_by_its_content_wherever_it_lies(shared_data, tmp_path):
    """Unpacked to WOS46985/X.txt, the stand-in is still the stand-in."""
    disguised = tmp_path / "WebOfScience" / "WOS46985" / "X.txt"
    disguised.parent.mkdir(parents=True)
    disguised.write_bytes((shared_data / "wos-standin" / "X.txt").read_bytes())
    identity = wos.read_corpus(disguised).identity
    assert identity["name"] == "stand-in" and identity["documents"] == 6925 and identity["bytes"] == 7260668
    disguised.write_bytes(disguised.read_bytes() + b"One more paragraph.\n")
    assert wos.read_corpus(disguised).identity["name"] == "other"  # no longer the known content


@pytest.mark.parametrize("documents, words, name", [(46_985, 150, "WOS46985"), (46_984, 150, "other"),
                                                    (46_985, 3, "other")])
def test_wos_only_for_its_count_of_abstract_sized_documents(tmp_path, documents, words, name):
    path = tmp_path / "X.txt"
    # blank lines between some documents: not counted
    path.write_text("".join(f"doc{i} " + "word " * words + "\n" + "\n" * (i % 2) for i in range(documents)))
    identity = wos.read_corpus(path).identity
    assert identity["name"] == name and identity["documents"] == documents
    assert identity["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ("not checked" in identity["basis"]) == (name == "WOS46985")  # it says what the name rests on


@pytest.mark.parametrize("encoding, message", [("utf-16", r"line 1 is \d+% NUL bytes: UTF-16"),
                                               ("utf-16-be", r"line 1 is \d+% NUL bytes: UTF-16")])
def test_a_utf16_corpus_is_refused(tmp_path, encoding, message):
    """UTF-16 must not pass as UTF-8 with a few bad lines (and ten times the blocks)."""
    path = tmp_path / "X.txt"
    path.write_bytes("\n".join(generated_docs(50)).encode(encoding))
    with pytest.raises(wos.TextError, match=message):
        wos.read_corpus(path)


def test_with_lab5_data_the_cache_is_the_repositorys_and_a_failed_download_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB5_DATA", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    assert wos.default_cache() == REPO / "data" / "cache"  # where README and --help say

    def offline(*args, **kwargs):
        raise OSError("no internet")
    monkeypatch.setattr(wos.urllib.request, "urlopen", offline)
    with pytest.raises(wos.TextError, match="WOS46985/X.txt not found"):
        wos.resolve_text(None, download=True)
    assert list((tmp_path / "data").iterdir()) == []  # no empty WebOfScience/WOS46985/


# ------------------------------------------------------------------ caches that lie

def test_a_corpus_rewritten_with_the_same_size_and_mtime_is_read_afresh(text_file, small_tokenizer, tmp_path):
    """`cp -p` or `rsync -t` over the corpus keeps its size and mtime: keyed on the content, the cache never trains
    the old text while the metrics record the new one's sha256."""
    packing = Packing(64, cache_dir=tmp_path / "cache")
    old_blocks, _ = token_blocks(wos.read_corpus(text_file), small_tokenizer, packing)
    before = text_file.stat()
    new = text_file.read_bytes().replace(b"ka", b"zu")  # the same size, another text
    text_file.write_bytes(new)
    os.utime(text_file, ns=(before.st_atime_ns, before.st_mtime_ns))
    again = splits_of(text_file)
    docs = sorted(again["train"] + again["validation"])
    assert docs == sorted(line.strip() for line in new.decode().splitlines() if line.strip())
    blocks, stats = token_blocks(wos.read_corpus(text_file), small_tokenizer, packing)
    assert not stats["train"]["from_cache"] and not torch.equal(blocks["train"], old_blocks["train"])


def test_a_corpus_replaced_after_it_was_read_cannot_enter_the_cache_under_its_name(text_file, tmp_path, monkeypatch):
    """Another user's --text swapped for their own text right after it was hashed: the documents tokenised are the
    bytes hashed, so the token cache under the genuine content's name holds the genuine text."""
    genuine = wos.read_corpus(text_file)
    read_corpus = wos.read_corpus

    def read_then_swap(path, accept_invalid=False):
        corpus = read_corpus(path, accept_invalid)
        theirs = tmp_path / "theirs.txt"
        theirs.write_text("attacker text\n" * 400)
        os.replace(theirs, path)  # as the file's owner may, at any time
        return corpus
    monkeypatch.setattr(wos, "read_corpus", read_then_swap)
    import tokenizer_train
    out = tmp_path / "tok.json"
    metrics = tokenizer_train.main(["--text", str(text_file), "--compare", "none", "--vocab-size", "512", "--seq-len",
                                    "63", "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert text_file.read_text().startswith("attacker text")  # swapped after the hash
    assert metrics["corpus"] == genuine.identity
    tokenizer = Tokenizer.from_file(str(out))
    blocks, stats = token_blocks(genuine, tokenizer, Packing(64, cache_dir=tmp_path / "cache"))
    assert stats["train"]["from_cache"]  # the cache tokenizer_train.py wrote under the genuine content's name
    cached = tokenizer.decode(blocks["train"].flatten().tolist(), skip_special_tokens=False)
    assert "attacker" not in cached and cached.split(EOT)[0] in genuine.documents


def test_a_word_too_long_for_bpe_is_refused_in_one_line_at_once(tmp_path):
    """8 lines of a million letters: BPE training ran for minutes at a gigabyte and printed nothing."""
    path = tmp_path / "X.txt"
    path.write_text(("x" * 1_000_000 + "\n") * 8)
    with pytest.raises(wos.TextError) as refused:
        wos.read_corpus(path)
    assert str(refused.value) == (f"{path}: line 1 has a word of over 1,000 characters (no space in it): BPE's work "
                                  f"grows with a word's length; split it or remove the line")
    path.write_text(" ".join(["y" * 1000] * 8) + "\nsecond document\n")  # at the limit: read
    assert wos.read_corpus(path).identity["documents"] == 2


def test_utf16_after_the_first_mib_is_refused_naming_its_line(tmp_path):
    """The whole file is checked, not its first MiB: a later UTF-16 part must not train as NUL-riddled text."""
    path = tmp_path / "X.txt"
    head = "\n".join(generated_docs(6000)) + "\n"
    assert len(head.encode()) > 1 << 20
    path.write_bytes(head.encode() + "\n".join(generated_docs(20, seed=1)).encode("utf-16-le"))
    line = head.count("\n") + 1
    with pytest.raises(wos.TextError, match=rf"X.txt: line {line} is \d+% NUL bytes: UTF-16 or binary, not UTF-8"):
        wos.read_corpus(path)
