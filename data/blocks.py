"""The token blocks gpt_train.py trains on: one int32 tensor (blocks, seq_len + 1) per split, cached as .npy
files in the corpus's cache folder (the one cache of the tokens), verified against their manifest. A batch is one
gather."""
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data import files, wos
from data.tokenizer import tokenizer_sha256
from training import errors

VERSION = 1  # part of the folder's name: bump it when the tokenisation or the packing change
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class Packing:
    """How a corpus becomes blocks, and where they are cached: with the corpus and the tokenizer, their cache's key."""
    block_size: int  # seq_len + 1: wos.tokens_per_block
    val_fraction: float = 0.005
    seed: int = 0
    cache_dir: Path = None  # None: wos.default_cache()


def token_blocks(corpus, tokenizer, packing, tokenizer_hash=None):
    """({split: tensor}, stats) of a wos.Corpus: the verified cache, else made and cached.
    tokenizer_hash: the tokenizer's sha256 where the caller has it (hashing GPT-2's costs a warm start ~50 ms)."""
    block_size = packing.block_size
    tokenizer_hash = tokenizer_hash or tokenizer_sha256(tokenizer)
    folder = wos.corpus_cache(packing.cache_dir or wos.default_cache(), corpus.identity["sha256"]) / \
        f"packed-v{VERSION}-{tokenizer_hash[:16]}-{block_size}-{packing.val_fraction}-{packing.seed}"
    try:
        return read_packed(folder, block_size, tokenizer.get_vocab_size())
    except (OSError, ValueError, KeyError, TypeError) as e:
        if folder.exists():  # a damaged cache (a missing one is the usual first run)
            print(f"warning: the token cache {folder} is damaged ({e}); packing it again", file=sys.stderr)
    splits = wos.load_splits(corpus, packing.val_fraction, packing.seed)
    blocks, stats = wos.tokenize_blocks(splits, tokenizer, block_size)
    try:  # the .npy files, then the manifest: a folder whose manifest does not match is never read
        for name in SPLITS:
            files.write_atomic(folder / f"{name}.npy", lambda f: np.save(f, blocks[name].numpy(), allow_pickle=False))
        files.write_manifest(folder, [folder / f"{name}.npy" for name in SPLITS], stats=stats)
    except (OSError, errors.OutputError) as e:
        print(f"warning: the token cache was not written ({e}); the next run packs again", file=sys.stderr)
        stats = {**stats, "unwritten": str(e)}  # (tokenizer_train.py: the cache is its output)
    return blocks, stats


def read_packed(folder, block_size, vocab_size):
    """The packed blocks and their stats; ValueError where a file is not its manifest's or not a vocabulary's."""
    if problem := files.manifest_problem(folder, [f"{name}.npy" for name in SPLITS]):
        raise ValueError(problem)
    blocks = {}
    for name in SPLITS:
        array = np.load(folder / f"{name}.npy", allow_pickle=False)
        if array.dtype != np.int32 or array.ndim != 2 or array.shape[1] != block_size or not len(array) or \
                array.min() < 0 or array.max() >= vocab_size:
            raise ValueError(f"{name}.npy holds no blocks of {block_size} ids inside the vocabulary")
        blocks[name] = torch.from_numpy(array)
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
