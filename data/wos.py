"""The Web of Science text pipeline, shared by tokenizer_train.py and gpt_train.py.

    X.txt (one abstract per line)
      -> documents: UTF-8 checked, blank lines dropped          check_text(), load_splits()
      -> train / validation split by document, seeded          load_splits()    (datasets, cached)
      -> token ids, documents joined by <|endoftext|>           tokenize_blocks() (datasets map, cached)
      -> fixed blocks of block_size tokens
      -> batches in a seeded order, one epoch = one permutation  epoch_loader()

Everything after reading is done by `datasets`, whose fingerprints key the cache under
data/cache/: a second run loads the blocks instead of tokenising again, and a changed text file
(path, size or mtime) or tokenizer gets new fingerprints and is tokenised afresh.
"""
import hashlib
import os
import socket
import sys
import time
import urllib.request
import zipfile
from itertools import chain
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader
from tokenizers import Tokenizer
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
OWN_TOKENIZER = REPO / "data" / "tokenizer" / "tokenizer.json"  # tokenizer_train.py writes, gpt_train.py reads
WOS_PAGE = "https://data.mendeley.com/datasets/9rw3vkcfy4/6"
WOS_ZIP_URL = ("https://data.mendeley.com/public-files/datasets/9rw3vkcfy4/files/"
               "c9ea673d-5542-44c0-ab7b-f1311f7d61df/file_downloaded")  # WebOfScience.zip


def default_tokenizer():
    """gpt_train.py's tokenizer: the own one (OWN_TOKENIZER) once tokenizer_train.py has made it, else GPT-2's."""
    return str(OWN_TOKENIZER) if OWN_TOKENIZER.exists() else "gpt2"


class TextError(Exception):
    """Missing or unusable text: reported as one line, never as a traceback."""


def data_root():
    return Path(os.environ.get("LAB5_DATA", REPO / "data"))


def default_text():
    return data_root() / "WebOfScience" / "WOS46985" / "X.txt"


def default_cache():
    return data_root() / "cache"


# ----------------------------------------------------------------------------- the file

def download_wos(dest):
    """Fetch WebOfScience.zip and unpack WOS46985/X.txt to dest (where there is internet)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / "WebOfScience.zip.part"
    request = urllib.request.Request(WOS_ZIP_URL, headers={"User-Agent": "Mozilla/5.0"})
    print(f"downloading {WOS_PAGE} (WebOfScience.zip, ~60 MB) ...", file=sys.stderr)
    with urllib.request.urlopen(request, timeout=60) as response, open(archive, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    with zipfile.ZipFile(archive) as outer:
        names = outer.namelist()
        member = next((n for n in names if n.endswith("WOS46985/X.txt")), None)
        if member is not None:
            data = outer.read(member)
        else:  # some versions nest the data set in a second WebOfScience.zip
            inner = next(n for n in names if n.endswith(".zip"))
            with zipfile.ZipFile(outer.open(inner)) as z:
                data = z.read(next(n for n in z.namelist() if n.endswith("WOS46985/X.txt")))
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    archive.unlink()


def resolve_text(path=None, download=True):
    """The X.txt to use: --text, else the default location (downloaded there if missing and allowed)."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise TextError(f"--text {path}: no such file")
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


MAX_DOC_BYTES = 1_000_000  # an abstract is ~1-2 KB; a megabyte on one line is not one document


def check_text(path):
    """Validate X.txt before datasets reads it: not empty, >= 2 usable lines, no line over
    MAX_DOC_BYTES (one document per line: a file without line breaks would exhaust the memory of
    BPE training and tokenisation); invalid UTF-8 is counted in one warning (datasets decodes it
    with replacement characters). Returns the count of usable lines."""
    raw = Path(path).read_bytes()
    if not raw.strip():
        raise TextError(f"{path} is empty")
    usable = invalid = 0
    for number, line in enumerate(raw.splitlines(), 1):  # \n, \r\n and \r, like datasets' universal newlines
        if len(line) > MAX_DOC_BYTES:
            raise TextError(f"{path}: line {number} has {len(line):,} bytes; expected one document (an abstract) per "
                            f"line, at most {MAX_DOC_BYTES:,} bytes")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            text = line.decode("utf-8", errors="replace")
            invalid += 1
        usable += bool(text.strip())
    if invalid:
        print(f"warning: {invalid} lines of {path} are not valid UTF-8; decoded with replacement characters",
              file=sys.stderr)
    if usable < 2:
        raise TextError(f"{path} has {usable} usable line(s); need at least 2 (one document per line)")
    return usable


# ----------------------------------------------------------------------------- datasets

def load_splits(path, val_fraction=0.005, seed=0, cache_dir=None):
    """DatasetDict(train, validation) of {"text"}: one row per document, split by document.

    The split is datasets' seeded `train_test_split`, so the same file and seed always give the
    same documents in each part; its indices are cached with the rest.
    """
    check_text(path)
    cache_dir = Path(cache_dir or default_cache())
    raw = datasets.load_dataset("text", data_files={"documents": str(Path(path).resolve())}, split="documents",
                                cache_dir=str(cache_dir), encoding_errors="replace")
    docs = raw.map(lambda b: {"text": [t.strip() for t in b["text"]]}, batched=True, desc="strip")
    docs = docs.filter(lambda b: [bool(t) for t in b["text"]], batched=True, desc="drop blank lines")
    n_val = max(1, round(len(docs) * val_fraction))
    if n_val >= len(docs):
        raise TextError(f"{path}: {len(docs)} documents are too few for a validation split of {val_fraction}")
    parts = docs.train_test_split(test_size=n_val, shuffle=True, seed=seed)
    return datasets.DatasetDict(train=parts["train"], validation=parts["test"])


def tokenize_blocks(splits, tokenizer, block_size, num_proc=None):
    """(DatasetDict of {"input_ids": block_size token ids}, {split: {docs, tokens, bytes, from_cache}}).

    Documents are joined by <|endoftext|>. `tokenizer` is a `tokenizers.Tokenizer` (load_tokenizer);
    it is part of datasets' fingerprint of the map, so a new tokenizer means a new cache. As in HF's run_clm, each map batch of 1000
    documents drops its last partial block (< 0.5% of the tokens).
    """
    eot = tokenizer.token_to_id(EOT)
    if eot is None:
        raise TextError(f"the tokenizer has no {EOT} token")
    if num_proc is None:  # worker processes pay off only on a large corpus
        num_proc = min(8, os.cpu_count() or 1) if len(splits["train"]) > 20_000 else None

    def tokenize(batch):
        ids = [e.ids + [eot] for e in tokenizer.encode_batch(batch["text"], add_special_tokens=False)]
        return {"ids": ids, "n_tokens": [len(x) - 1 for x in ids],
                "n_bytes": [len(t.encode("utf-8")) for t in batch["text"]]}

    def group(batch):
        ids = list(chain.from_iterable(batch["ids"]))
        usable = len(ids) - len(ids) % block_size
        return {"input_ids": [ids[i:i + block_size] for i in range(0, usable, block_size)]}

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    blocks, stats = datasets.DatasetDict(), {}
    started = time.time()
    for name, split in splits.items():
        ids = split.map(tokenize, batched=True, remove_columns=split.column_names, num_proc=num_proc,
                        desc=f"tokenize {name}")
        blocks[name] = ids.map(group, batched=True, remove_columns=ids.column_names, features=features,
                               num_proc=num_proc, desc=f"blocks of {block_size} ({name})")
        if len(blocks[name]) == 0:
            raise TextError(f"the {name} split has fewer than {block_size} tokens: use a smaller block size")
        stats[name] = {"docs": len(ids), "tokens": sum(ids["n_tokens"]), "bytes": sum(ids["n_bytes"]),
                       # a cache file older than this call was reused, not rebuilt
                       "from_cache": all(os.path.getmtime(f["filename"]) < started for f in blocks[name].cache_files)}
    return blocks, stats


def hub_reachable(host="huggingface.co", timeout=3.0):
    """Whether the HF hub answers at all: offline, its client would retry for half a minute."""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_tokenizer(spec):
    """A `tokenizers.Tokenizer` (the one tokenizer type of this module) from a tokenizer.json path, or
    the fast backend of a hub tokenizer such as "gpt2"."""
    if spec.endswith(".json") or Path(spec).exists():
        if not Path(spec).is_file():
            raise TextError(f"tokenizer {spec}: no such file (train one with tokenizer_train.py)")
        try:
            tokenizer = Tokenizer.from_file(str(spec))
        except Exception as e:  # tokenizers raises plain Exceptions for malformed JSON
            raise TextError(f"tokenizer {spec}: not a tokenizer.json ({str(e).splitlines()[0][:200]})") from e
        if tokenizer.token_to_id(EOT) is None:
            raise TextError(f"tokenizer {spec} has no {EOT} token")
        return tokenizer
    try:  # a local copy in the HF cache first; the hub only if it can be reached
        return AutoTokenizer.from_pretrained(spec, local_files_only=True).backend_tokenizer
    except OSError:
        pass
    if not hub_reachable():
        raise TextError(f"tokenizer {spec!r}: not in the local HF cache and the hub is unreachable; "
                        f"use an own tokenizer.json (tokenizer_train.py)")
    try:
        return AutoTokenizer.from_pretrained(spec).backend_tokenizer
    except OSError as e:
        raise TextError(f"tokenizer {spec!r}: {e}") from e


def corpus_fingerprint(path):
    """A short content hash, for run metadata (the cache itself is keyed by datasets)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------- batches

def epoch_loader(blocks, batch_size, seed, epoch, drop_last=True, whole=1, **loader_kwargs):
    """A DataLoader over one epoch: the permutation of epoch `epoch` is fixed by (seed, epoch).

    A new loader per epoch, instead of a sampler with hidden epoch state, makes the position in
    the data two integers (epoch, batch): resuming is `skip_first_batches(loader, batch)` on the
    loader of that epoch, exact past the first epoch too. accelerate's `prepare` shards it.
    `whole`: the epoch is cut to a multiple of this many sequences (the global batch, so that
    every process count splits it alike; a different few sequences are left out each epoch).
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(blocks), generator=g).tolist()
    order = order[:len(order) - len(order) % whole]
    return DataLoader(blocks.with_format("torch"), batch_size=batch_size, sampler=order, drop_last=drop_last,
                      collate_fn=collate, **loader_kwargs)


def collate(rows):
    return torch.stack([row["input_ids"] for row in rows]).long()
