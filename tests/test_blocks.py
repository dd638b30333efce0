"""data/blocks.py: the token blocks packed into tensors, cached as .npy and read back without `datasets`,
verified by content; the seeded epoch loader over them."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import tokenizer_train
from conftest import REPO, generated_docs, tiny_args
from data import blocks, files, wos
from data.tokenizer import open_tokenizer


def make(corpus, cache, block_size=33):
    tok = open_tokenizer(corpus / "tok.json").tokenizer
    return blocks.token_blocks(wos.read_corpus(corpus / "X.txt"), tok, blocks.Packing(block_size, 0.05, 0, cache))


def test_the_cached_blocks_are_the_tokenised_blocks_and_a_second_run_reads_them(corpus, tmp_path):
    packed, stats = make(corpus, tmp_path / "cache")
    tok = open_tokenizer(corpus / "tok.json").tokenizer
    splits = wos.load_splits(wos.read_corpus(corpus / "X.txt"), 0.05, 0)
    table, _ = wos.tokenize_blocks(splits, tok, 33)
    for name in ("train", "validation"):
        assert packed[name].dtype == torch.int32 and packed[name].shape[1] == 33
        assert torch.equal(packed[name], table[name])
    again, stats2 = make(corpus, tmp_path / "cache")
    assert all(torch.equal(again[n], packed[n]) for n in packed) and stats2["train"]["from_cache"]
    assert {k: v for k, v in stats2["train"].items() if k != "from_cache"} == \
        {k: v for k, v in stats["train"].items() if k != "from_cache"}


def test_a_warm_start_never_imports_datasets(corpus, tmp_path):
    make(corpus, tmp_path / "cache")
    code = ("import sys; from pathlib import Path; from data import blocks, wos; "
            "from data.tokenizer import open_tokenizer; c = Path(sys.argv[1]); "
            "tok = open_tokenizer(c / 'tok.json').tokenizer; text = wos.read_corpus(c / 'X.txt'); "
            "b, s = blocks.token_blocks(text, tok, blocks.Packing(33, 0.05, 0, sys.argv[2])); "
            "print(s['train']['from_cache'], 'datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / "cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "False"], done.stderr[-1000:]


def test_a_packed_file_rewritten_in_place_is_packed_again(corpus, tmp_path, capsys):
    """Valid ids, the same shape: only the manifest tells (a cache rewritten in place must not pass)."""
    good, _ = make(corpus, tmp_path / "cache")
    folder = next((tmp_path / "cache").glob("corpus-*/packed-v*"))
    array = np.load(folder / "train.npy")
    array[0, :5] = array[1, :5]
    np.save(folder / "train.npy", array)
    again, stats = make(corpus, tmp_path / "cache")
    assert torch.equal(again["train"], good["train"]) and "does not match its manifest" in capsys.readouterr().err
    assert json.loads((folder / "manifest.json").read_text())["train.npy"]["sha256"]


def packed(text_file, tokenizer, tmp_path, block_size=64):
    packing = blocks.Packing(block_size, cache_dir=tmp_path / "cache")
    return blocks.token_blocks(wos.read_corpus(text_file), tokenizer, packing)


def test_the_cache_is_reused_and_keyed_on_the_text_the_tokenizer_and_the_block_size(text_file, small_tokenizer,
                                                                                   tmp_path):
    first, stats = packed(text_file, small_tokenizer, tmp_path)
    assert not stats["train"]["from_cache"]
    again, stats = packed(text_file, small_tokenizer, tmp_path)
    assert stats["train"]["from_cache"] and torch.equal(again["train"], first["train"])
    other = tokenizer_train.train_bpe(generated_docs(400), vocab_size=576)
    assert not packed(text_file, other, tmp_path)[1]["train"]["from_cache"]
    shorter, stats = packed(text_file, small_tokenizer, tmp_path, 32)
    assert not stats["train"]["from_cache"] and shorter["train"].shape[1] == 32
    text_file.write_text(text_file.read_text() + "A new document about kalo.\n")
    assert not packed(text_file, small_tokenizer, tmp_path)[1]["train"]["from_cache"]
    assert len(list((tmp_path / "cache").glob("corpus-*/packed-v*"))) == 4


def ids_beyond_the_vocabulary(folder):
    """Damage from before the manifest was written: the manifest matches, the ids do not fit."""
    manifest = json.loads((folder / "manifest.json").read_text())
    array = np.load(folder / "train.npy")
    array[0, 0] = 100_000
    np.save(folder / "train.npy", array)
    files.write_manifest(folder, [folder / "train.npy", folder / "validation.npy"], stats=manifest["stats"])


DAMAGE = {
    "truncated": lambda f: (f / "train.npy").write_bytes((f / "train.npy").read_bytes()[:1000]),
    "garbled": lambda f: (f / "train.npy").write_bytes(bytes(range(256)) + (f / "train.npy").read_bytes()[256:]),
    "ids beyond the vocabulary": ids_beyond_the_vocabulary,
    "manifest a link to a device": lambda f: ((f / "manifest.json").unlink(), (f / "manifest.json").symlink_to(
        "/dev/zero")),  # read bounded and no-follow (data.files.read_small): a rebuild, not a hang
}


@pytest.mark.parametrize("case, message", [("truncated", "train.npy has 1000 bytes"),
                                           ("garbled", "train.npy does not match its manifest"),
                                           ("ids beyond the vocabulary", "no blocks of 64 ids inside the vocabulary"),
                                           ("manifest a link to a device", "manifest.json is missing or unreadable")])
def test_a_damaged_token_cache_is_packed_again_with_one_warning(text_file, small_tokenizer, tmp_path, capsys, case,
                                                                message):
    """A truncated or garbled cache, or ids out of range: one line naming the cache, not a traceback or an
    IndexError steps into training."""
    first, _ = packed(text_file, small_tokenizer, tmp_path)
    capsys.readouterr()
    DAMAGE[case](next((tmp_path / "cache").glob("corpus-*/packed-v*")))
    again, stats = packed(text_file, small_tokenizer, tmp_path)
    assert not stats["train"]["from_cache"] and torch.equal(again["train"], first["train"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "the token cache" in warnings[0] and "is damaged" in warnings[0]
    assert message in warnings[0]
    assert packed(text_file, small_tokenizer, tmp_path)[1]["train"]["from_cache"]


def test_a_batch_is_one_gather_and_the_epoch_order_is_seeded():
    tensor = torch.arange(40, dtype=torch.int32).reshape(10, 4)
    loader = blocks.epoch_loader(tensor, 3, seed=1, epoch=0)
    got = list(loader)
    assert all(b.dtype == torch.long and b.shape == (3, 4) for b in got) and len(got) == 3  # the last 1 dropped
    order = torch.randperm(10, generator=torch.Generator().manual_seed(1 * 1_000_003)).tolist()
    assert torch.equal(torch.cat(got), tensor[order[:9]].long())
    assert [b.tolist() for b in blocks.epoch_loader(tensor, 3, 1, 0)] == [b.tolist() for b in got]


@pytest.mark.slow
def test_gpt_trains_the_same_from_the_packed_cache(corpus, tmp_path):
    """The first run packs, the second reads the pack: the same losses, element for element."""
    import gpt_train
    args = ["--tokens", "4096", "--cache-dir", str(tmp_path / "cache")]
    first = gpt_train.main(tiny_args(corpus, tmp_path / "a", *args))
    second = gpt_train.main(tiny_args(corpus, tmp_path / "b", *args))
    assert first["loss_curve"] == second["loss_curve"] and first["val_curve"] == second["val_curve"]
