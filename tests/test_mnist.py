"""data/mnist.py: the IDX reader, the MNIST Dataset and its device-side batches, on files the tests write."""
import pytest
import torch

from conftest import synthetic_digits, write_idx
from data import mnist
from data.mnist import MNISTError

# --------------------------------------------------------------------- IDX parsing

def test_read_idx_plain_and_gz(tmp_path):
    images, labels = synthetic_digits(20, seed=0)
    for gz in (False, True):
        path = write_idx(tmp_path / f"img{gz}", images, gz=gz)
        assert torch.equal(mnist.read_idx(path), images)
    assert torch.equal(mnist.read_idx(write_idx(tmp_path / "lab", labels)), labels)


@pytest.mark.parametrize("magic, message", [(b"\x01\x00\x08\x03", "bad magic"), (b"\x00\x00\x0d\x03", "dtype 0x0d")])
def test_read_idx_rejects_bad_header(tmp_path, magic, message):
    path = write_idx(tmp_path / "bad", torch.zeros(2, 28, 28, dtype=torch.uint8), magic=magic)
    with pytest.raises(MNISTError, match=message):
        mnist.read_idx(path)


def test_read_idx_rejects_truncated_and_trailing(tmp_path):
    path = write_idx(tmp_path / "img", torch.zeros(3, 28, 28, dtype=torch.uint8))
    raw = path.read_bytes()
    for broken in (raw[:-1], raw[:10], raw + b"\x00"):
        path.write_bytes(broken)
        with pytest.raises(MNISTError, match="truncated"):
            mnist.read_idx(path)


def test_read_idx_rejects_damaged_gzip(tmp_path):
    path = write_idx(tmp_path / "img", torch.zeros(3, 28, 28, dtype=torch.uint8), gz=True)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(MNISTError, match="cannot read"):
        mnist.read_idx(path)


def test_dataset_rejects_count_mismatch_and_bad_labels(tmp_path):
    images, labels = synthetic_digits(10, seed=0)
    img = write_idx(tmp_path / "img", images)
    with pytest.raises(MNISTError, match="10 images but .* 9 labels"):
        mnist.MNIST(img, write_idx(tmp_path / "lab9", labels[:9]))
    with pytest.raises(MNISTError, match="outside 0..9"):
        mnist.MNIST(img, write_idx(tmp_path / "lab", labels + 5))


def test_dataset_batches_are_normalised_gathers(tiny_mnist):
    paths = mnist.find_mnist(tiny_mnist, download=False)
    ds = mnist.MNIST(*paths["test"])
    x, y = ds[[3, 1, 4]]
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(y, ds.labels[[3, 1, 4]])
    expected = (ds.images[1].float() / 255 - mnist.MEAN) / mnist.STD
    assert torch.allclose(x[1, 0], expected)
    loader = mnist.Batches(ds, 64, shuffle=True, seed=3)
    seen = torch.cat([yb for _, yb in loader])
    assert len(seen) == len(ds) and sorted(seen.tolist()) == sorted(ds.labels.tolist())
    assert [b.tolist() for _, b in mnist.Batches(ds, 64, True, 3)] == \
           [b.tolist() for _, b in mnist.Batches(ds, 64, True, 3)]  # seeded order
    first, second = ([b.tolist() for _, b in loader] for _ in range(2))
    assert first != second  # a new order every pass, as a shuffling DataLoader gives


# --------------------------------------------------------------------- finding the files

def test_failed_download_falls_back_to_the_clear_message(tmp_path, monkeypatch, capsys):
    from torchvision.datasets import MNIST
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens there: fails at once
    with pytest.raises(MNISTError, match="MNIST files missing"):
        mnist.find_mnist(tmp_path, download=True)
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: MNIST download failed") and len(warning.splitlines()) == 1
