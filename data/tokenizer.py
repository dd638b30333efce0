"""open_tokenizer(spec): the one way every script opens a tokenizer, whether `spec` is a tokenizer.json, a
folder (tokenizer.json, or GPT-2's vocab.json + merges.txt) or a hub name ("gpt2": the HF cache, then data_copy(),
then the hub only if it answers within seconds). A path that does not exist is never taken for a hub name, and
nothing hangs offline: a failure is one TokenizerError line naming what was tried."""
import contextlib
import hashlib
import json
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from data import REPO, data_root
from training.errors import UserError, reason

EOT = "<|endoftext|>"
ALLOWED_PARTS = {"normalizer": {None}, "pre_tokenizer": {"ByteLevel"}, "model": {"BPE"},
                 "post_processor": {None, "ByteLevel"}, "decoder": {None, "ByteLevel"}}
OWN_TOKENIZER = REPO / "data" / "tokenizer" / "tokenizer.json"  # tokenizer_train.py writes, gpt_train.py reads


class TokenizerError(UserError):
    """A tokenizer that cannot be found or read."""


def default_tokenizer():
    return str(OWN_TOKENIZER) if OWN_TOKENIZER.exists() else "gpt2"


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    source: str             # the file or folder it was read from
    sha256: str             # of its canonical JSON (Tokenizer.to_str()): keys the token cache, names the tokenizer
    vocab_size: int         # as trained (GPT-2: 50,257)
    padded_vocab_size: int  # the model's, a multiple of 64 (GPT-2: 50,304): whole tiles for the matmuls
    eot: int                # the id of <|endoftext|>


def open_tokenizer(spec):
    spec, path = str(spec), Path(spec).expanduser()
    if path.exists() or looks_like_a_path(spec):
        tokenizer, source = tokenizer_from_path(path), str(path)
    else:
        tokenizer, source = tokenizer_from_hub_name(spec)
    text = tokenizer.to_str()
    check_byte_level_bpe(spec, json.loads(text))
    if (eot := tokenizer.token_to_id(EOT)) is None:
        raise TokenizerError(f"tokenizer {spec} has no {EOT} token")
    size = tokenizer.get_vocab_size()
    top = max(tokenizer.get_vocab().values(), default=-1)
    if top >= size:  # the model has `size` embedding rows: such an id fails steps into training
        raise TokenizerError(f"tokenizer {spec} has ids up to {top:,} for a vocabulary of {size:,} tokens (ids "
                             f"with gaps); a model needs them in 0..{size - 1:,}: retrain it with tokenizer_train.py")
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return LoadedTokenizer(tokenizer, source, sha256, size, -(-size // 64) * 64, eot)


def check_byte_level_bpe(spec, config):
    """Byte-level BPE only, GPT-2's kind and tokenizer_train.py's: other normalizers and pre-tokenizers run regular
    expressions the file chooses, and a crafted one runs for minutes, then panics, on a short text."""
    for part, kinds in ALLOWED_PARTS.items():
        if (kind := (config.get(part) or {}).get("type")) not in kinds:
            raise TokenizerError(f"tokenizer {spec}: its {part} is {kind or 'none'}; only byte-level BPE tokenizers "
                                 f"(as GPT-2's and tokenizer_train.py's) are read, whose work is bounded")


def tokenizer_sha256(tokenizer):
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def looks_like_a_path(spec):
    """A hub name is `name` or `owner/name`; anything else a user typed is meant as a path."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.endswith(".json") or "\\" in spec


def tokenizer_from_path(path):
    """A tokenizer.json, or a folder holding one or vocab.json + merges.txt (built as GPT-2's tokenizer.json)."""
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exceptions for malformed JSON
            raise TokenizerError(f"tokenizer {path}: not a tokenizer.json ({reason(e)})") from None
    if not path.is_dir():
        raise TokenizerError(f"tokenizer {path}: no such file or folder (train one with tokenizer_train.py, "
                             f"or pass 'gpt2' or a folder with tokenizer.json, or vocab.json + merges.txt)")
    vocab, merges = path / "vocab.json", path / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise TokenizerError(f"tokenizer folder {path}: neither tokenizer.json nor vocab.json + merges.txt in it")
    from tokenizers import models
    try:
        tokenizer = byte_level(Tokenizer(models.BPE.from_file(str(vocab), str(merges))))
    except Exception as e:  # malformed JSON or merges: tokenizers raises plain Exceptions
        raise TokenizerError(f"tokenizer folder {path}: vocab.json + merges.txt unreadable ({reason(e)})") from None
    if tokenizer.token_to_id(EOT) is not None:
        tokenizer.add_special_tokens([EOT])  # matched whole in text, as in GPT-2's tokenizer.json
    return tokenizer


def byte_level(tokenizer):
    """`tokenizer` (BPE) split, decoded and post-processed byte by byte, as GPT-2's: any text encodes."""
    from tokenizers import decoders, pre_tokenizers, processors
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def data_copy(name):
    """Where a hub tokenizer's offline copy is looked for: beside the data sets (gpt2: $LAB5_DATA/gpt2-tokenizer/)."""
    return data_root() / f"{name.split('/')[-1]}-tokenizer"


def local_copy(name):
    """A hub tokenizer's copy here (the HF cache's tokenizer.json, else data_copy), or None."""
    from huggingface_hub import try_to_load_from_cache
    try:
        cached = try_to_load_from_cache(name, "tokenizer.json")
    except ValueError:  # HFValidationError: not a name the hub could hold either
        raise TokenizerError(f"tokenizer {name!r}: no such file or folder, and not a hub name") from None
    if isinstance(cached, str):
        return Path(cached)
    return data_copy(name) if data_copy(name).is_dir() else None


def tokenizer_from_hub_name(name):
    from huggingface_hub import constants
    if found := local_copy(name):
        return tokenizer_from_path(found), str(found)
    local = data_copy(name)
    offline = constants.HF_HUB_OFFLINE
    if offline or not hub_reachable():
        raise TokenizerError(f"tokenizer {name!r}: no such file or folder, no local copy (HF cache "
                             f"{constants.HF_HUB_CACHE}, {local}) and the hub is "
                             f"{'off (HF_HUB_OFFLINE)' if offline else 'unreachable'}; put the tokenizer's folder "
                             f"(tokenizer.json, or vocab.json + merges.txt) at {local} or pass its path")
    try:
        return Tokenizer.from_pretrained(name), f"hub:{name}"
    except Exception as e:  # tokenizers raises plain Exceptions for a name the hub does not hold
        raise TokenizerError(f"tokenizer {name!r}: {reason(e)}") from None


def hub_reachable(host="huggingface.co", timeout=3.0):
    """Whether the hub answers within `timeout` s (offline its client hangs); a thread: getaddrinfo has no timeout."""
    answer = []

    def probe():
        with contextlib.suppress(OSError), socket.create_connection((host, 443), timeout=timeout):
            answer.append(True)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer)

