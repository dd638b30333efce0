"""open_tokenizer(spec): the one way every script opens a tokenizer, whether `spec` is a tokenizer.json, a
folder holding a tokenizer.json or a hub name ("gpt2": the HF cache, then data_copy(); never the network, so nothing
hangs offline). A path that does not exist is never taken for a hub name; a failure is one TokenizerError line
naming what was tried."""
import hashlib
import json
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
    """A tokenizer.json, or a folder holding one."""
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"tokenizer {path}: no such file or folder (train one with tokenizer_train.py, or "
                             f"pass 'gpt2' or a folder with a tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exceptions for malformed JSON
        raise TokenizerError(f"tokenizer {path}: not a tokenizer.json ({reason(e)})") from None


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


def tokenizer_from_hub_name(name):
    """A hub tokenizer's copy here: the HF cache's tokenizer.json, else data_copy(). Never the network (a compute
    node has none; `huggingface-cli download` fetches it on a login node)."""
    from huggingface_hub import constants, try_to_load_from_cache
    try:
        cached = try_to_load_from_cache(name, "tokenizer.json")
    except ValueError:  # HFValidationError: not a name the hub could hold either
        raise TokenizerError(f"tokenizer {name!r}: no such file or folder, and not a hub name") from None
    found = Path(cached) if isinstance(cached, str) else data_copy(name)
    if not found.exists():
        raise TokenizerError(f"tokenizer {name!r}: no such file or folder, and no copy here (HF cache "
                             f"{constants.HF_HUB_CACHE}, {found}): huggingface-cli download {name} tokenizer.json, "
                             f"or put the tokenizer's folder (its tokenizer.json) at {found}, or pass its path")
    return tokenizer_from_path(found), str(found)
