"""The Web of Science text pipeline of tokenizer_train.py and gpt_train.py (their tokenizer: data/tokenizer.py).

    X.txt (one abstract per line)
      -> read once, hashed as read: documents (UTF-8 checked,   read_corpus(), checked_line()
         blank lines dropped) and what they are, by content
         (stand-in, WOS46985, other)
      -> train / validation split by document, seeded         load_splits()
      -> token ids, documents joined by <|endoftext|>,         tokenize_blocks()
         in int32 tensors of blocks of seq_len + 1 tokens      tokens_per_block()
      -> cached as .npy (verified against their manifest),    token_blocks(), read_packed()
         batched in a seeded order                             epoch_loader()

The token cache is keyed by the hash of the bytes the documents were read from (corpus-<sha256>): the file is never
read a second time, so a file replaced meanwhile cannot put its text under another's name.
"""
import hashlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data import REPO, data_root, files
from data.tokenizer import EOT, tokenizer_sha256
from training import errors

WOS_PAGE = "https://data.mendeley.com/datasets/9rw3vkcfy4/6"
WOS_ZIP_URL = ("https://data.mendeley.com/public-files/datasets/9rw3vkcfy4/files/"
               "c9ea673d-5542-44c0-ab7b-f1311f7d61df/file_downloaded")  # WebOfScience.zip
MAX_DOC_BYTES = 1_000_000  # an abstract is ~1-2 KB; a megabyte on one line is not one document
MAX_WORD_CHARS = 1000  # the longest chemical names: a few hundred; BPE's training slows with longer words
LONG_WORD = re.compile(rf"(?<!\S)\S{{{MAX_WORD_CHARS + 1}}}")  # tried from a word's start only: linear time
WOS46985_DOCUMENTS = 46_985
STANDIN_SHA256 = "621b305827935bdf51ad2582d89300500e2c8d69c9901d8d936baa11fe835f08"  # shared/data/wos-standin


class TextError(errors.UserError):
    """Missing or unusable text."""


def default_text():
    return data_root() / "WebOfScience" / "WOS46985" / "X.txt"


def default_cache():
    """The repository's data/cache, with LAB5_DATA set too: a shared data folder is read, never written."""
    return REPO / "data" / "cache"


def resolve_text(path=None, download=True):
    """The X.txt to use: --text, else the default location (downloaded there if missing and allowed)."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            what = (" is a folder: give the X.txt inside it" if path.is_dir() else
                    " is not a plain file (a device, a pipe): give a text file" if path.exists() else ": no such file")
            raise TextError(f"--text {path}{what}")
        return path
    path = default_text()
    if not path.is_file() and download:
        try:
            download_wos(path)
        except Exception as e:  # offline, proxy, changed archive layout: say what to do instead
            print(f"warning: WOS download failed ({type(e).__name__}: {e})", file=sys.stderr)
    if not path.is_file():
        raise TextError(f"{path} not found: download WebOfScience.zip from {WOS_PAGE}, unpack it so that "
                        f"this file exists (or set LAB5_DATA), or pass --text PATH")
    return path


def download_wos(dest):
    """WebOfScience.zip's WOS46985/X.txt to dest; through a temporary file: a failure leaves nothing behind."""
    request = urllib.request.Request(WOS_ZIP_URL, headers={"User-Agent": "Mozilla/5.0"})
    print(f"downloading {WOS_PAGE} (WebOfScience.zip, ~60 MB) ...", file=sys.stderr)
    with tempfile.TemporaryFile() as archive:
        with urllib.request.urlopen(request, timeout=60) as response:
            shutil.copyfileobj(response, archive)
        z = zipfile.ZipFile(archive)
        while not (member := next((n for n in z.namelist() if n.endswith("WOS46985/X.txt")), None)):
            z = zipfile.ZipFile(z.open(next(n for n in z.namelist() if n.endswith(".zip"))))  # a zip in the zip
        files.write_atomic(dest, z.read(member))


@dataclass(frozen=True)
class Corpus:
    """A text read once: what it is (name, documents, bytes, sha256, basis) and its documents come from the same bytes,
    so a file replaced after the read changes neither."""
    identity: dict
    documents: list


def read_corpus(path, accept_invalid=False):
    """The Corpus of a text, its lines checked one at a time (memory: the documents and one line), named by content,
    never the path: "stand-in" by its known hash, "WOS46985" for 46,985 abstract-sized documents (its hash not known
    here: `basis` says so), else "other"."""
    sha, docs, invalid = hashlib.sha256(), [], 0
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_DOC_BYTES + 1), b""), 1):
            sha.update(line)
            raw = line.rstrip(b"\n")
            doc = checked_line(path, number, raw)
            invalid += doc.encode("utf-8") != raw  # a byte not UTF-8 became U+FFFD
            if doc := doc.strip():  # blank lines dropped (and \r of \r\n)
                docs.append(doc)
        size = f.tell()
    check_documents(path, docs, invalid, accept_invalid)
    sha, median_words = sha.hexdigest(), statistics.median_high(len(d.split()) for d in docs)
    if sha == STANDIN_SHA256:
        name, basis = "stand-in", "its sha256 is the known one"
    elif len(docs) == WOS46985_DOCUMENTS and 50 <= median_words <= 1000:
        name, basis = "WOS46985", (f"{len(docs):,} documents of {median_words} words (median), as WOS46985/X.txt; "
                                   f"its sha256 is not checked (not known here)")
    else:
        name, basis = "other", f"{len(docs):,} documents, not WOS46985's {WOS46985_DOCUMENTS:,} abstracts"
    return Corpus({"name": name, "documents": len(docs), "bytes": size, "sha256": sha, "basis": basis}, docs)


def checked_line(path, number, raw):
    """Line `number` decoded (bad bytes as U+FFFD), if it is one document of UTF-8 text (not UTF-16, not binary)
    whose words BPE can train on (its work grows with a word's length)."""
    if len(raw) > MAX_DOC_BYTES:
        raise TextError(f"{path}: line {number} has over {MAX_DOC_BYTES:,} bytes; expected one document (an "
                        f"abstract) per line")
    if raw.count(0) > len(raw) // 8:
        raise TextError(f"{path}: line {number} is {raw.count(0) / len(raw):.0%} NUL bytes: UTF-16 or binary, "
                        f"not UTF-8 text (one document per line); convert it, e.g. iconv -f UTF-16 -t UTF-8")
    doc = raw.decode("utf-8", "replace")
    if LONG_WORD.search(doc):
        raise TextError(f"{path}: line {number} has a word of over {MAX_WORD_CHARS:,} characters (no space in "
                        f"it): BPE's work grows with a word's length; split it or remove the line")
    return doc


def check_documents(path, docs, invalid, accept_invalid):
    """At least 2 documents, and not many lines that were not UTF-8 (another encoding: Latin-1)."""
    if len(docs) < 2:
        raise TextError(f"{path} has 1 usable line; need at least 2 (one document per line)" if docs else
                        f"{path} is empty")
    if invalid > 0.01 * len(docs) and not accept_invalid:
        raise TextError(f"{path}: {invalid:,} of {len(docs):,} lines ({invalid / len(docs):.0%}) are not valid "
                        f"UTF-8; convert it (iconv -f LATIN1 -t UTF-8 {path} > X-utf8.txt), or pass "
                        f"--accept-invalid-utf8 to train on it with the bad bytes as U+FFFD")
    if invalid:
        print(f"warning: {invalid} lines of {path} are not valid UTF-8; decoded with replacement characters",
              file=sys.stderr)


def load_splits(corpus, val_fraction=0.005, seed=0):
    """{"train": documents, "validation": documents}: the corpus split by document, seeded, as datasets'
    train_test_split(test_size, shuffle=True, seed) splits it (the held-out documents first in the permutation)."""
    docs = corpus.documents
    n_val = max(1, round(len(docs) * val_fraction))
    if n_val >= len(docs):
        raise TextError(f"{len(docs)} documents are too few for a validation split of {val_fraction}")
    order = np.random.default_rng(seed).permutation(len(docs))
    return {"train": [docs[i] for i in order[n_val:]], "validation": [docs[i] for i in order[:n_val]]}


def corpus_cache(cache_dir, sha256):
    """Everything cached from one corpus content (the packed blocks, token_blocks() below); refused where another
    user may have written it (their tokens would be trained on)."""
    folder = Path(cache_dir) / f"corpus-{sha256[:32]}"
    files.check_folder(folder, "--cache-dir")
    return folder


def tokens_per_block(seq_len):
    return seq_len + 1  # the inputs and, shifted by one, the targets


def tokenize_blocks(splits, tokenizer, block_size):
    """({split: int32 tensor (blocks, block_size)}, {split: {docs, tokens, bytes, from_cache}}). As in HF's run_clm,
    each batch of 1000 documents drops its last partial block (< 0.5% of the tokens)."""
    if (eot := tokenizer.token_to_id(EOT)) is None:
        raise TextError(f"the tokenizer has no {EOT} token")
    blocks, stats = {}, {}
    for name, docs in splits.items():
        parts, tokens = [], 0
        for i in range(0, len(docs), 1000):
            encodings = tokenizer.encode_batch(docs[i:i + 1000], add_special_tokens=False)  # threads in Rust
            ids = np.concatenate([np.array(e.ids + [eot], dtype=np.int32) for e in encodings])
            tokens += len(ids) - len(encodings)
            parts.append(ids[:len(ids) - len(ids) % block_size].reshape(-1, block_size))
        blocks[name] = torch.from_numpy(np.concatenate(parts))
        if not len(blocks[name]):
            raise TextError(f"the {name} split has {tokens:,} tokens, too few for one block of {block_size} "
                            f"(--seq-len {block_size - 1} + 1): give a smaller --seq-len, or more text")
        stats[name] = {"docs": len(docs), "tokens": tokens, "bytes": sum(len(d.encode("utf-8")) for d in docs),
                       "from_cache": False}
    return blocks, stats


# ----------------------------------------------------------------------------- the token blocks and their cache

VERSION = 1  # part of the folder's name: bump it when the tokenisation or the packing change
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class Packing:
    """How a corpus becomes blocks, and where they are cached: with the corpus and the tokenizer, their cache's key."""
    block_size: int  # seq_len + 1: tokens_per_block
    val_fraction: float = 0.005
    seed: int = 0
    cache_dir: Path = None  # None: default_cache()


def token_blocks(corpus, tokenizer, packing, tokenizer_hash=None):
    """({split: tensor}, stats) of a Corpus: the verified cache, else made and cached.
    tokenizer_hash: the tokenizer's sha256 where the caller has it (hashing GPT-2's costs a warm start ~50 ms)."""
    block_size = packing.block_size
    tokenizer_hash = tokenizer_hash or tokenizer_sha256(tokenizer)
    folder = corpus_cache(packing.cache_dir or default_cache(), corpus.identity["sha256"]) / \
        f"packed-v{VERSION}-{tokenizer_hash[:16]}-{block_size}-{packing.val_fraction}-{packing.seed}"
    try:
        return read_packed(folder)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if folder.exists():  # a damaged cache (a missing one is the usual first run)
            print(f"warning: the token cache {folder} is damaged ({e}); packing it again", file=sys.stderr)
    splits = load_splits(corpus, packing.val_fraction, packing.seed)
    blocks, stats = tokenize_blocks(splits, tokenizer, block_size)
    try:  # the .npy files, then the manifest: a folder whose manifest does not match is never read
        for name in SPLITS:
            files.write_atomic(folder / f"{name}.npy", lambda f: np.save(f, blocks[name].numpy(), allow_pickle=False))
        files.write_manifest(folder, [folder / f"{name}.npy" for name in SPLITS], stats=stats)
    except (OSError, errors.OutputError) as e:
        print(f"warning: the token cache was not written ({e}); the next run packs again", file=sys.stderr)
        stats = {**stats, "unwritten": str(e)}  # (tokenizer_train.py: the cache is its output)
    return blocks, stats


def read_packed(folder):
    """The packed blocks and their stats; ValueError where a file is not its manifest's. Their shape and ids are
    the folder name's (block size, tokenizer): only its owner may write it (corpus_cache)."""
    if problem := files.manifest_problem(folder, [f"{name}.npy" for name in SPLITS]):
        raise ValueError(problem)
    blocks = {name: torch.from_numpy(np.load(folder / f"{name}.npy", allow_pickle=False)) for name in SPLITS}
    stats = json.loads(files.read_small(folder / files.MANIFEST, 1 << 20))["stats"]
    return blocks, {name: {**stats[name], "from_cache": True} for name in SPLITS}


class Blocks(Dataset):
    """The packed blocks as a Dataset whose batch is one gather (DataLoader calls __getitems__)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __len__(self):
        return len(self.tensor)

    def __getitems__(self, indices):
        return self.tensor[torch.as_tensor(indices)]


def epoch_loader(blocks, batch_size, seed, epoch, whole=1, **loader_kwargs):
    """One epoch in the order (seed, epoch) fixes: a loader per epoch makes the position two integers (a resume is
    `skip_first_batches(loader, batch)`). `whole`: the epoch cut to a multiple of it (the global batch: split alike).
    A last partial batch is dropped unless drop_last=False."""
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
    order = order[:len(order) - len(order) % whole]
    loader_kwargs.setdefault("drop_last", True)
    return DataLoader(Blocks(blocks), batch_size=batch_size, sampler=order, collate_fn=torch.Tensor.long,
                      **loader_kwargs)
