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
        mnist.load(img, write_idx(tmp_path / "lab9", labels[:9]))
    with pytest.raises(MNISTError, match="outside 0..9"):
        mnist.load(img, write_idx(tmp_path / "lab", labels + 5))


def test_dataset_batches_are_normalised_gathers(tiny_mnist):
    paths = mnist.find_mnist(tiny_mnist, download=False)
    ds = mnist.load(*paths["test"])
    x, y = ds[torch.tensor([3, 1, 4])]
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(y, mnist.read_idx(paths["test"][1]).long()[[3, 1, 4]])
    expected = (mnist.read_idx(paths["test"][0])[1].float() / 255 - mnist.MEAN) / mnist.STD
    assert torch.allclose(x[1, 0], expected)
    loader = mnist.Batches(ds, 64, shuffle=True, seed=3)
    seen = torch.cat([yb for _, yb in loader])
    assert len(seen) == len(ds) and sorted(seen.tolist()) == sorted(ds.tensors[1].tolist())
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


# --------------------------------------------------------------------- malformed files

def test_a_gz_that_inflates_past_its_header_is_refused_in_bounded_memory(tmp_path):
    """A valid header over 64 MB of zeros (1.5 GB inflated) is refused without inflating it whole; a header
    that promises more than MNIST holds is refused before any payload."""
    import gzip
    import struct
    import tracemalloc
    cases = {"long": (10, 28, 28), "huge": (2**20, 28, 28)}
    for name, dims in cases.items():
        with gzip.open(tmp_path / f"{name}.gz", "wb", compresslevel=1) as f:
            f.write(bytes([0, 0, 8, 3]) + struct.pack(">3I", *dims))
            for _ in range(64):
                f.write(bytes(1 << 20))
    for name, message in (("long", r"not 7,840 bytes after its header, which says \(10, 28, 28\) \(truncated"),
                          ("huge", "more than MNIST's files hold")):
        tracemalloc.start()
        try:
            with pytest.raises(MNISTError, match=message):
                mnist.read_idx(tmp_path / f"{name}.gz")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"{name}: {peak:,} bytes"


@pytest.mark.parametrize("n_train, n_test, message", [
    (0, 0, "train-images-idx3-ubyte.gz holds 0 images; lenet5.py needs at least 1 train images"),
    (20, 0, "t10k-images-idx3-ubyte holds 0 images; lenet5.py needs at least 8 test images"),
    (20, 7, "t10k-images-idx3-ubyte holds 7 images; lenet5.py needs at least 8 test images"),
])
def test_lenet5_on_empty_or_tiny_idx_files_is_one_line_and_leaves_no_run_folder(tmp_path, capsys, n_train, n_test,
                                                                                 message):
    """Fewer digits than the 8 feature-map digits, or none: one line, not an IndexError or ZeroDivisionError."""
    import lenet5
    from conftest import write_tiny_mnist
    data = write_tiny_mnist(tmp_path / "mnist", n_train=n_train, n_test=n_test)
    with pytest.raises(SystemExit) as stop:
        lenet5.main(["--data-dir", str(data), "--no-download", "--device", "cpu", "--out-dir", str(tmp_path / "run")])
    assert str(stop.value.code).startswith("error: ") and message in str(stop.value.code)
    assert "\n" not in str(stop.value.code) and not (tmp_path / "run").exists()
