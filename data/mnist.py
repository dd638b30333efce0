"""MNIST for lenet5.py: the IDX files parsed here (every header field checked), the whole set normalised once into
one tensor on the training device; a batch is one gather there, not a PIL image and ToTensor per sample."""
import gzip
import math
import struct
import sys
import zlib

import numpy as np
import torch
from torch.utils.data import TensorDataset

from training.errors import UserError, reason

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),  # split -> (images, labels): the
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}  # official names, torchvision's layout
MEAN, STD = 0.1307, 0.3081  # of the MNIST training pixels, the usual normalisation
MIN_TEST_IMAGES = 8  # lenet5.py's feature-map figures show 8 fixed test digits
MAX_IDX_BYTES = 64 << 20  # MNIST's largest file holds 47,040,016 bytes; nothing larger is read into memory


class MNISTError(UserError):
    """Missing or damaged MNIST files."""


def read_idx(path):
    """One IDX file (magic 0, 0, dtype, ndim; ndim big-endian uint32 sizes; the bytes) as a uint8 tensor. The
    read is bounded by the header: a .gz that inflates to gigabytes stops one byte past what it promises."""
    try:
        with (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read(4)
            if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
                raise MNISTError(f"{path}: not an IDX file (bad magic number)")
            if raw[2] != 0x08:  # MNIST is unsigned bytes; other IDX dtypes are valid files but not MNIST
                raise MNISTError(f"{path}: IDX dtype 0x{raw[2]:02x}, expected 0x08 (unsigned byte)")
            header = f.read(4 * raw[3])
            if len(header) < 4 * raw[3]:
                raise MNISTError(f"{path}: truncated header")
            dims = struct.unpack(f">{raw[3]}I", header)
            expected = math.prod(dims)
            if expected > MAX_IDX_BYTES:
                raise MNISTError(f"{path}: its header {dims} says {expected:,} bytes of images or labels, more than "
                                 f"MNIST's files hold; not an MNIST file")
            payload = f.read(expected + 1)
    except (OSError, EOFError, zlib.error) as e:  # unreadable, or a damaged .gz
        raise MNISTError(f"{path}: cannot read ({e})") from e
    if len(payload) != expected:
        raise MNISTError(f"{path}: not {expected:,} bytes after its header, which says {dims} (truncated or corrupt)")
    return torch.from_numpy(np.frombuffer(bytearray(payload), dtype=np.uint8).reshape(dims))


def find_mnist(data_dir, download):
    """{split: (images, labels)} under data_dir or data_dir/MNIST/raw, downloaded if missing and allowed."""
    roots = [data_dir / "MNIST" / "raw", data_dir]

    def find(name):  # the file or its .gz, under either root
        return next((f for root in roots for f in (root / name, root / f"{name}.gz") if f.is_file()), None)
    names = [name for pair in FILES.values() for name in pair]
    if download and any(find(n) is None for n in names):
        from torchvision.datasets import MNIST as TorchvisionMNIST
        try:
            for train in (True, False):
                TorchvisionMNIST(root=data_dir, train=train, download=True)
        except Exception as e:  # offline, proxy, full disk
            print(f"warning: MNIST download failed ({type(e).__name__}: {reason(e)})", file=sys.stderr)
    if missing := [n for n in names if find(n) is None]:
        raise MNISTError(f"MNIST files missing: put {', '.join(missing)} (or .gz) into {roots[0]}/ "
                         f"(from https://ossci-datasets.s3.amazonaws.com/mnist/), or pass --data-dir")
    return {split: tuple(find(n) for n in pair) for split, pair in FILES.items()}


def load_train_test(paths, device):
    """(train, test) from find_mnist's paths, on `device`; swapped train and test files are refused by their sizes."""
    train, test = (load(*paths[split], device) for split in ("train", "test"))
    for split, ds, least in (("train", train, 1), ("test", test, MIN_TEST_IMAGES)):
        if len(ds) < least:
            raise MNISTError(f"{paths[split][0]} holds {len(ds):,} images; lenet5.py needs at least {least} {split} "
                             f"images (MNIST's files hold 60,000 train and 10,000 test images)")
    if len(train) < len(test):
        raise MNISTError(f"the training files ({paths['train'][0]}) hold {len(train):,} images, the test files "
                         f"({paths['test'][0]}) {len(test):,}: swapped? MNIST's training set is the larger "
                         f"(60,000 against 10,000); give each file its own name")
    return train, test


def load(images_path, labels_path, device="cpu"):
    """A TensorDataset of the normalised images (N, 1, 28, 28) and the labels, on `device`: `ds[indices]` is a
    batch, one gather."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dim() != 3 or images.shape[1:] != (28, 28):
        raise MNISTError(f"{images_path}: shape {tuple(images.shape)}, expected (N, 28, 28)")
    if labels.dim() != 1:
        raise MNISTError(f"{labels_path}: shape {tuple(labels.shape)}, expected (N,)")
    if len(images) != len(labels):
        raise MNISTError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    if len(labels) and labels.max() > 9:
        raise MNISTError(f"{labels_path}: label {labels.max().item()} outside 0..9")
    images = images.to(device).unsqueeze(1).float().div_(255).sub_(MEAN).div_(STD)
    return TensorDataset(images, labels.to(device).long())


class Batches:
    """One pass over `dataset`: a seeded permutation, drawn on the CPU, copied to the device once and sliced."""

    def __init__(self, dataset, batch_size, shuffle, seed=0):
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self):
        return math.ceil(len(self.dataset) / self.batch_size)

    def __iter__(self):
        n = len(self.dataset)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        order = order.to(self.dataset.tensors[1].device)
        for i in range(0, n, self.batch_size):
            yield self.dataset[order[i:i + self.batch_size]]
