"""The Web of Science text pipeline, shared by tokenizer_train.py and gpt_train.py (the tokenizer
they read it with: data/tokenizer.py).

    X.txt (one abstract per line)
      -> what it is, by content (stand-in, WOS46985, other) corpus_identity()
      -> documents: UTF-8 checked, blank lines dropped     check_text(), load_splits()
      -> train / validation split by document, seeded     load_splits()     (datasets, cached)
      -> token ids, documents joined by <|endoftext|>      tokenize_blocks() (datasets map, cached per tokenizer)
      -> fixed blocks of seq_len + 1 tokens                tokens_per_block()
      -> packed into tensors, cached as .npy (read without datasets), batched in a seeded order: data/blocks.py

Everything after reading is done by `datasets` (imported only there: the rest works without it; a warm
start reads data/blocks.py's packed cache and never imports it).
Its cache of the text sits under the repository's data/cache/ (LAB5_DATA or not), in one folder per
corpus content (corpus-<its sha256>: a file rewritten in place with the same size and mtime is a new
corpus); the token blocks sit beside it in one folder per tokenizer (tokens-v1-<its sha256>), so a
second run loads them instead of tokenising again. Every cached token file is verified when used, by
content (a manifest of sha256s) and structure; a damaged one is rebuilt once, or refused in one line
naming the folder to delete.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
import zipfile
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

from data import data_root, files
from data.tokenizer import EOT, tokenizer_sha256

REPO = Path(__file__).resolve().parents[1]
WOS_PAGE = "https://data.mendeley.com/datasets/9rw3vkcfy4/6"
WOS_ZIP_URL = ("https://data.mendeley.com/public-files/datasets/9rw3vkcfy4/files/"
               "c9ea673d-5542-44c0-ab7b-f1311f7d61df/file_downloaded")  # WebOfScience.zip


class TextError(files.UserError):
    """Missing or unusable text: reported as one line, never as a traceback."""


def need_datasets():
    """The `datasets` package, imported only where the corpus is read: the scripts and benchmarks that
    need no corpus run where it is missing (a bare GPU image)."""
    try:
        import datasets
    except ImportError as e:
        raise TextError(f"reading the corpus needs the Python package 'datasets' ({e}); "
                        f"pip install datasets, or see benchmarks/gpu_check.sh --prepare") from None
    return datasets


def default_text():
    return data_root() / "WebOfScience" / "WOS46985" / "X.txt"


def default_cache():
    """The repository's data/cache, as the docs say, with LAB5_DATA set too: a shared data folder is read,
    never written."""
    return REPO / "data" / "cache"


# ----------------------------------------------------------------------------- the file

def download_wos(dest):
    """Fetch WebOfScience.zip and unpack WOS46985/X.txt to dest (where there is internet). The archive goes
    to a temporary folder: a failed download leaves nothing in the data folder, not even dest's folder."""
    request = urllib.request.Request(WOS_ZIP_URL, headers={"User-Agent": "Mozilla/5.0"})
    print(f"downloading {WOS_PAGE} (WebOfScience.zip, ~60 MB) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="wos-") as scratch:
        data = fetch_x_txt(request, Path(scratch) / "WebOfScience.zip")
    files.write_atomic(dest, data)


def fetch_x_txt(request, archive):
    """WOS46985/X.txt's bytes from the archive at `request`, downloaded to `archive`."""
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
    return data


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


MAX_DOC_BYTES = 1_000_000  # an abstract is ~1-2 KB; a megabyte on one line is not one document


def check_text(path):
    """Validate X.txt before datasets reads it: not empty, >= 2 usable lines, no line over MAX_DOC_BYTES (one
    document per line: a file without line breaks would exhaust the memory of BPE training and tokenisation),
    not UTF-16/32 (a byte-order mark, or a line of NUL bytes: ASCII in UTF-16 is every other byte 0, which would
    pass as UTF-8 with a few bad lines); invalid UTF-8 is counted in one warning (datasets decodes it with
    replacement characters). Returns the count of usable lines."""
    raw = Path(path).read_bytes()
    if not raw.strip():
        raise TextError(f"{path} is empty")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise TextError(f"{path} is UTF-16 or UTF-32 (byte-order mark {raw[:2].hex(' ')}), not UTF-8: convert it, "
                        f"e.g. iconv -f UTF-16 -t UTF-8 {path} > X-utf8.txt")
    usable = invalid = 0
    for number, line in enumerate(raw.splitlines(), 1):  # \n, \r\n and \r, like datasets' universal newlines
        if len(line) > MAX_DOC_BYTES:
            raise TextError(f"{path}: line {number} has {len(line):,} bytes; expected one document (an abstract) per "
                            f"line, at most {MAX_DOC_BYTES:,} bytes")
        if line.count(0) > len(line) // 8:
            raise TextError(f"{path}: line {number} is {line.count(0) / len(line):.0%} NUL bytes: UTF-16 or binary, "
                            f"not UTF-8 text (one document per line); convert it, e.g. iconv -f UTF-16 -t UTF-8")
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


WOS46985_DOCUMENTS = 46_985
KNOWN_CORPORA = {  # sha256 -> name, for corpora whose content is known here
    "621b305827935bdf51ad2582d89300500e2c8d69c9901d8d936baa11fe835f08": "stand-in",  # ../shared/data/wos-standin
}


def corpus_identity(path):
    """What a corpus is, from its content (never its path): {documents, bytes, sha256, name, basis}.
    name: "stand-in" by its known hash; "WOS46985" for 46,985 abstract-sized documents, WOS46985/X.txt's
    count (its hash is not known to this code, so that is the most the name can claim: `basis` says so);
    anything else "other", never WOS."""
    raw = Path(path).read_bytes()
    docs = [line for line in raw.splitlines() if line.strip()]
    sha = hashlib.sha256(raw).hexdigest()
    words = sorted(len(d.split()) for d in docs)
    median_words = words[len(words) // 2] if words else 0
    if sha in KNOWN_CORPORA:
        name, basis = KNOWN_CORPORA[sha], "its sha256 is the known one"
    elif len(docs) == WOS46985_DOCUMENTS and 50 <= median_words <= 1000:
        name, basis = "WOS46985", (f"{len(docs):,} documents of {median_words} words (median), as WOS46985/X.txt; "
                                   f"its sha256 is not checked (not known here)")
    else:
        name, basis = "other", f"{len(docs):,} documents, not WOS46985's {WOS46985_DOCUMENTS:,} abstracts"
    return {"name": name, "documents": len(docs), "bytes": len(raw), "sha256": sha, "basis": basis}


# ----------------------------------------------------------------------------- datasets

def load_splits(path, val_fraction=0.005, seed=0, cache_dir=None, sha256=None):
    """DatasetDict(train, validation) of {"text"}: one row per document, split by document with datasets'
    seeded `train_test_split` (the same file and seed, the same parts). Cached in corpus_cache(), one folder per
    corpus content (`sha256`: pass it, or the file is hashed here): datasets' own key (path, mtime) misses a
    file rewritten in place (`cp -p`). A damaged cache is rebuilt once, then refused in one line."""
    check_text(path)
    cache_dir = Path(cache_dir or default_cache())
    files.check_output_dir(cache_dir, "--cache-dir")
    corpus_dir = corpus_cache(cache_dir, sha256 or files.sha256_file(path))
    return rebuilt_once(lambda fresh: read_splits(path, val_fraction, seed, corpus_dir, fresh),
                        f"the datasets cache of {path} under {cache_dir}", corpus_dir)


def rebuilt_once(build, named, folder):
    """build(fresh=False); after a DamagedCache a warning calling the cache `named`, and build(fresh=True);
    damaged again: one TextError naming `folder` to delete."""
    try:
        return build(False)
    except DamagedCache as e:
        print(f"warning: {named} is damaged ({e}); rebuilding it", file=sys.stderr)
    try:
        return build(True)
    except DamagedCache as e:
        raise TextError(f"the cache {folder} is damaged ({e}) and its rebuild too: delete {folder} and run again") \
            from None


def corpus_cache(cache_dir, sha256):
    """cache_dir/corpus-<the text's sha256, 32 hex digits>: everything cached from one corpus content
    (datasets' tables of its text, the token blocks of each tokenizer beside them)."""
    return Path(cache_dir) / f"corpus-{sha256[:32]}"


def read_splits(path, val_fraction, seed, cache_dir, fresh):
    """load_splits' work; `fresh`: regenerate every cached file instead of loading it."""
    datasets = need_datasets()
    with arrow_damage(cache_dir / "text", "documents"):
        raw = datasets.load_dataset("text", data_files={"documents": str(Path(path).resolve())}, split="documents",
                                    cache_dir=str(cache_dir), encoding_errors="replace",
                                    download_mode="force_redownload" if fresh else None)
        docs = raw.map(lambda b: {"text": [t.strip() for t in b["text"]]}, batched=True, desc="strip",
                       load_from_cache_file=not fresh)
        docs = docs.filter(lambda b: [bool(t) for t in b["text"]], batched=True, desc="drop blank lines",
                           load_from_cache_file=not fresh)
        n_val = max(1, round(len(docs) * val_fraction))
        if n_val >= len(docs):
            raise TextError(f"{path}: {len(docs)} documents are too few for a validation split of {val_fraction}")
        parts = docs.train_test_split(test_size=n_val, shuffle=True, seed=seed, load_from_cache_file=not fresh)
    return datasets.DatasetDict(train=parts["train"], validation=parts["test"])


@contextmanager
def arrow_damage(folder, what):
    """A cached file that cannot be read becomes DamagedCache; the system's errors (a full disk:
    an OSError with an errno) one TextError naming the folder."""
    import pyarrow
    try:
        yield
    except (pyarrow.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise TextError(f"the cache {folder}: {e.strerror} ({e.filename or what})") from None
        # a truncated or garbled file: ArrowInvalid, or pyarrow's OSError without an errno
        raise DamagedCache(f"{what}: {str(e).splitlines()[0][:160]}") from None


def tokens_per_block(seq_len):
    """Tokens per cached block for a model of context seq_len: the inputs and, shifted by one, the targets."""
    return seq_len + 1


def check_blocks_fit(splits, block_size):
    """Before a tokenizer is trained: TextError, naming --seq-len, if a split cannot fill one block of
    block_size tokens whatever the tokenizer (a byte-level token is at least one byte, plus one
    <|endoftext|> a document)."""
    for name, split in splits.items():
        room = 0
        for text in split["text"]:
            room += len(text.encode("utf-8")) + 1
            if room >= block_size:
                break
        else:
            raise TextError(f"the {name} split ({len(split):,} document{'s' * (len(split) != 1)}, {room:,} bytes) "
                            f"cannot fill one block of "
                            f"{block_size} tokens (--seq-len {block_size - 1} + 1): give a smaller --seq-len, "
                            f"--seq-len 0 (no token cache), or more text")


TOKEN_CACHE_VERSION = 1  # part of the cache folder's name: bump it when tokenize() or group() change their output


class DamagedCache(Exception):
    """A cached file that cannot be read, or holds what no tokenisation writes."""


def tokenize_blocks(splits, tokenizer, block_size, num_proc=None):
    """(DatasetDict of {"input_ids": block_size token ids}, {split: {docs, tokens, bytes, from_cache}}).
    Documents are joined by <|endoftext|>; as in HF's run_clm, each map batch of 1000 documents drops its last
    partial block (< 0.5% of the tokens). Cached per tokenizer (token_cache_folder()) and verified however it was
    obtained (cache_manifest, verify_tokens): a damaged cache is rebuilt once, then refused in one line."""
    if tokenizer.token_to_id(EOT) is None:
        raise TextError(f"the tokenizer has no {EOT} token")
    if num_proc is None:  # worker processes pay off only on a large corpus
        num_proc = min(8, os.cpu_count() or 1) if len(splits["train"]) > 20_000 else None
    folder = token_cache_folder(splits["train"], tokenizer)

    def build(fresh):
        if fresh:  # datasets' map has no "regenerate": the damaged files go first
            shutil.rmtree(folder, ignore_errors=True)
        return tokenize_splits(splits, tokenizer, block_size, num_proc, folder)
    return rebuilt_once(build, f"the token cache {folder}", folder)


def token_cache_folder(split, tokenizer):
    """<the split's datasets cache folder>/tokens-v<version>-<sha256 of the tokenizer, 16 hex digits>:
    one folder per tokenizer (and corpus), so that two tokenizers never share or evict a cache."""
    if not split.cache_files:  # an in-memory dataset (built in a test): nothing cached
        return None
    parent = Path(split.cache_files[0]["filename"]).parent
    return parent / f"tokens-v{TOKEN_CACHE_VERSION}-{tokenizer_sha256(tokenizer)[:16]}"


def tokenize_splits(splits, tokenizer, block_size, num_proc, folder):
    datasets = need_datasets()
    tokenize, group = block_makers(tokenizer, block_size)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    blocks, stats = datasets.DatasetDict(), {}
    started = time.time()
    for name, split in splits.items():
        stem = f"{split._fingerprint[:16]}-{name}"
        ids = cached_map(split, tokenize, folder, f"{stem}-ids", num_proc=num_proc, desc=f"tokenize {name}")
        blocks[name] = cached_map(ids, group, folder, f"{stem}-blocks{block_size}", features=features,
                                  num_proc=num_proc, desc=f"blocks of {block_size} ({name})")
        verify_tokens(ids, blocks[name], len(split), block_size, tokenizer.get_vocab_size())
        if len(blocks[name]) == 0:
            raise TextError(f"the {name} split has {sum(ids['n_tokens']):,} tokens, too few for one block of "
                            f"{block_size} (--seq-len {block_size - 1} + 1): give a smaller --seq-len, or more text")
        stats[name] = {"docs": len(ids), "tokens": sum(ids["n_tokens"]), "bytes": sum(ids["n_bytes"]),
                       # a cache file older than this call was reused, not rebuilt
                       "from_cache": all(os.path.getmtime(f["filename"]) < started for f in blocks[name].cache_files)}
    return blocks, stats


def block_makers(tokenizer, block_size):
    """The two map functions: documents -> ids (+ end of text), and ids -> blocks of block_size."""
    eot = tokenizer.token_to_id(EOT)

    def tokenize(batch):
        ids = [e.ids + [eot] for e in tokenizer.encode_batch(batch["text"], add_special_tokens=False)]
        return {"ids": ids, "n_tokens": [len(x) - 1 for x in ids],
                "n_bytes": [len(t.encode("utf-8")) for t in batch["text"]]}

    def group(batch):
        ids = list(chain.from_iterable(batch["ids"]))
        usable = len(ids) - len(ids) % block_size
        return {"input_ids": [ids[i:i + block_size] for i in range(0, usable, block_size)]}

    return tokenize, group


def cached_map(dataset, function, folder, stem, **kwargs):
    """dataset.map(function) cached as folder/stem.arrow (loaded when it exists); unreadable, or not what
    was written (cache_manifest): DamagedCache."""
    where, before = None, set()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        where = str(folder / f"{stem}.arrow")
        before = set(folder.glob("*.arrow"))  # what existed is loaded, and must match its manifest
    # the fingerprint is the file's key (short: datasets appends the worker's rank to it)
    fingerprint = hashlib.sha256(f"{folder and folder.name}-{stem}".encode()).hexdigest()[:32]
    with arrow_damage(folder, f"{stem}.arrow"):
        result = dataset.map(function, batched=True, remove_columns=dataset.column_names, cache_file_name=where,
                             new_fingerprint=fingerprint, **kwargs)
    if folder is not None:
        cache_manifest(folder / f"{stem}.manifest.json", [Path(f["filename"]) for f in result.cache_files], before)
    return result


def cache_manifest(manifest, paths, before):
    """Cached blocks are trusted by content, as checkpoints are: `paths` that existed `before` the map must
    match the manifest (rewritten in place, valid ids or not, they are DamagedCache); files made now are
    recorded in it. Hashing costs a read of the files (~30 ms for the stand-in's)."""
    loaded = [f for f in paths if f in before]
    if loaded:
        try:
            expected = json.loads(files.read_small(manifest, 1 << 20))
        except (OSError, ValueError):  # missing, a planted link or device, not JSON
            expected = None
        if not isinstance(expected, dict):
            raise DamagedCache(f"{manifest.name} is missing or unreadable")
        if changed := files.first_changed(expected, loaded):
            raise DamagedCache(f"{changed.name} does not match its manifest")
    if len(loaded) < len(paths):
        files.write_json(manifest, {f.name: files.file_record(f) for f in paths})


def verify_tokens(ids, blocks, n_docs, block_size, vocab_size):
    """DamagedCache unless both tables are sound Arrow, one row of ids per document, every block
    block_size long, every id inside the vocabulary (an id beyond it fails only at the embedding,
    steps into training)."""
    import pyarrow
    import pyarrow.compute as pc
    try:
        for dataset, column in ((ids, "ids"), (blocks, "input_ids")):
            table = dataset.data.table
            table.validate(full=True)
            low, high = pc.min_max(pc.list_flatten(table.column(column))).values()
            if low.is_valid and (low.as_py() < 0 or high.as_py() >= vocab_size):
                raise DamagedCache(f"token ids {low}..{high} outside the vocabulary 0..{vocab_size - 1}")
        lengths = pc.unique(pc.list_value_length(blocks.data.table.column("input_ids"))).to_pylist()
    except pyarrow.ArrowException as e:
        raise DamagedCache(str(e).splitlines()[0][:160]) from None
    if lengths not in ([], [block_size]):
        raise DamagedCache(f"blocks of {sorted(lengths)[:4]} tokens, not {block_size}")
    if len(ids) != n_docs:
        raise DamagedCache(f"{len(ids)} tokenised documents for {n_docs}")
