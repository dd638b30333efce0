"""LeNet-5 on MNIST: training, test accuracy, TensorBoard curves and intermediate layers.

    python lenet5.py                               # GPU if there is one, else CPU; >= 99.0% test accuracy
    python lenet5.py --act cpp                     # the own C++/CUDA GELU (build: see gelu_ext/README.md)
    python lenet5.py --data-dir ../shared/data --metrics-out lenet.json
    sbatch slurm/lenet.sh --act python             # on the cluster (extra flags are forwarded)
    tensorboard --logdir runs/lenet5               # curves, filters, feature maps, graph, GPU use

MNIST is read by the `MNIST` Dataset below straight from the IDX files (plain or .gz) and
kept as one uint8 tensor on the training device; missing files are downloaded through
torchvision (md5-checked) where there is internet.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

REPO = Path(__file__).resolve().parent
FILES = {  # split -> (images, labels), the official names (torchvision's layout: <root>/MNIST/raw/)
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MEAN, STD = 0.1307, 0.3081  # of the MNIST training pixels, the usual normalisation


class DataError(Exception):
    """Missing or malformed data: reported as one line, never as a traceback."""


# ----------------------------------------------------------------------------- data

def read_idx(path):
    """Parse one IDX file (http://yann.lecun.com/exdb/mnist/) into a uint8 tensor, checking every field."""
    path = Path(path)
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as e:  # unreadable, or a damaged .gz
        raise DataError(f"{path}: cannot read ({e})") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    if raw[2] != 0x08:  # MNIST is unsigned bytes; other IDX dtypes are valid files but not MNIST
        raise DataError(f"{path}: IDX dtype 0x{raw[2]:02x}, expected 0x08 (unsigned byte)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + math.prod(dims)
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, header {dims} says {expected} (truncated or corrupt)")
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def find_mnist(data_dir, download):
    """Paths of the four IDX files under data_dir (or data_dir/MNIST/raw), downloading them if allowed."""
    roots = [data_dir / "MNIST" / "raw", data_dir]

    def lookup(name):
        for root in roots:
            for candidate in (root / name, root / f"{name}.gz"):
                if candidate.is_file():
                    return candidate
        return None

    names = [name for pair in FILES.values() for name in pair]
    if download and any(lookup(n) is None for n in names):
        from torchvision.datasets import MNIST as TorchvisionMNIST  # download + md5 check, nothing else
        try:
            for train in (True, False):
                TorchvisionMNIST(root=data_dir, train=train, download=True)
        except Exception as e:  # offline, proxy, full disk: the message below says what to do instead
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"warning: MNIST download failed ({type(e).__name__}: {reason})", file=sys.stderr)
    missing = [n for n in names if lookup(n) is None]
    if missing:
        raise DataError(f"MNIST files missing: put {', '.join(missing)} (or .gz) into {roots[0]}/ "
                        f"(from https://ossci-datasets.s3.amazonaws.com/mnist/), or pass --data-dir")
    return {split: tuple(lookup(n) for n in pair) for split, pair in FILES.items()}


class MNIST(Dataset):
    """MNIST held as one uint8 tensor; `ds[i]` is one sample, `ds[list_of_indices]` a whole batch.

    Indexing with a batch of indices (see `make_loader`) replaces the per-sample PIL/ToTensor
    pipeline with a single gather + normalise, which is what makes an epoch take seconds.
    """

    def __init__(self, images_path, labels_path):
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.dim() != 3 or images.shape[1:] != (28, 28):
            raise DataError(f"{images_path}: shape {tuple(images.shape)}, expected (N, 28, 28)")
        if labels.dim() != 1:
            raise DataError(f"{labels_path}: shape {tuple(labels.shape)}, expected (N,)")
        if len(images) != len(labels):
            raise DataError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
        if len(labels) and labels.max() > 9:
            raise DataError(f"{labels_path}: label {labels.max().item()} outside 0..9")
        self.images, self.labels = images, labels.long()

    def to(self, device):
        self.images, self.labels = self.images.to(device), self.labels.to(device)
        return self

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        x = self.images[index].unsqueeze(-3).float().div_(255).sub_(MEAN).div_(STD)  # (..., 1, 28, 28)
        return x, self.labels[index]


def make_loader(dataset, batch_size, shuffle, seed=0):
    # batch_size=None turns off per-sample collation: the sampler yields index lists, the dataset gathers.
    if shuffle:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    else:
        sampler = SequentialSampler(dataset)
    return DataLoader(dataset, sampler=BatchSampler(sampler, batch_size, drop_last=False), batch_size=None)


# ----------------------------------------------------------------------------- model

def make_gelu(act, device):
    """The GELU (tanh approximation) implementation chosen by --act."""
    if act == "torch":
        return nn.GELU(approximate="tanh")
    try:
        import gelu_ext
        if act == "python":
            return gelu_ext.PythonGELU()
        module = gelu_ext.GELU()  # raises ExtensionNotBuilt, with the build command, if needed
    except ImportError as e:
        raise DataError(f"--act {act}: {e}") from e
    if device.type == "cuda" and not gelu_ext.built_with_cuda():
        raise DataError("--act cpp on a GPU: gelu_ext was built without its CUDA kernel; rebuild it where "
                        "nvcc is found (see gelu_ext/README.md)")
    return module


class LeNet5(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)  # (B, 1, 28, 28) -> (B, 6, 24, 24), pooled to 12x12
        self.conv2 = nn.Conv2d(6, 16, 5)  # (B, 6, 12, 12) -> (B, 16, 8, 8), pooled to 4x4
        self.fc1 = nn.Linear(16 * 4 * 4, 120)  # 256 = 16 channels x 4 x 4 after the second pool
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.act = act

    def features(self, x):
        """The two conv layers' activations, for the feature-map images."""
        c1 = self.act(self.conv1(x))
        c2 = self.act(self.conv2(F.max_pool2d(c1, 2)))
        return c1, c2

    def forward(self, x):
        _, c2 = self.features(x)
        x = F.max_pool2d(c2, 2).flatten(1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


# ----------------------------------------------------------------------------- training

def train(model, loader, optimizer, scheduler, writer, step, log_every, epoch):
    model.train()
    for x, y in tqdm(loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if step % log_every == 0:  # .item() is a CPU-GPU sync point: only every log_every steps
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalar("train/lr", scheduler.get_last_lr()[0], step)
    return step


@torch.no_grad()
def test(model, loader):
    """Mean cross-entropy and accuracy (fraction) over the whole loader."""
    model.eval()
    loss_sum = torch.zeros((), device=loader.dataset.labels.device)
    correct = torch.zeros((), dtype=torch.long, device=loss_sum.device)
    for x, y in loader:
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    n = len(loader.dataset)
    return loss_sum.item() / n, correct.item() / n


def log_images(writer, model, digits, epoch):
    from torchvision.utils import make_grid
    model.eval()
    with torch.no_grad():
        c1, c2 = model.features(digits)
    filters = model.conv1.weight.detach().cpu()
    writer.add_image("layers/conv1_filters", make_grid(F.interpolate(filters, scale_factor=8), nrow=6,
                                                       normalize=True, scale_each=True, pad_value=1), epoch)
    writer.add_image("layers/input_digits", make_grid(digits.cpu(), nrow=len(digits), normalize=True), epoch)
    for name, maps in (("conv1", c1), ("conv2", c2)):  # one row per digit, one tile per channel
        tiles = maps.detach().cpu().flatten(0, 1).unsqueeze(1)
        writer.add_image(f"layers/{name}_feature_maps",
                         make_grid(tiles, nrow=maps.shape[1], normalize=True, scale_each=True, pad_value=1), epoch)


def log_gpu(writer, device, step):
    """GPU utilisation and memory from NVML, so no nvidia-smi screenshots are needed."""
    if device.type != "cuda":
        return
    writer.add_scalar("gpu/memory_allocated_GiB", torch.cuda.memory_allocated(device) / 2**30, step)
    try:  # needs NVML (the nvidia-ml-py package); absent NVML only loses these two curves
        writer.add_scalar("gpu/utilization_percent", torch.cuda.utilization(device), step)
        writer.add_scalar("gpu/memory_used_GiB", torch.cuda.device_memory_used(device) / 2**30, step)
    except Exception:
        pass


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DataError("--device cuda, but torch sees no CUDA GPU")
    return torch.device(name)


def new_run_dir(out_dir, act):
    if out_dir is None:
        out_dir = REPO / "runs" / "lenet5" / f"{time.strftime('%Y%m%d-%H%M%S')}-{act}"
        while out_dir.exists():
            out_dir = out_dir.with_name(out_dir.name + "+")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"--out-dir {out_dir} is not empty; pick a new one (runs are never overwritten)")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def write_json(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LAB5_DATA", REPO / "data")),
                   help="folder with the MNIST IDX files (or MNIST/raw/ below it); env LAB5_DATA (default: %(default)s)")
    p.add_argument("--no-download", action="store_true", help="never try to download missing files")
    p.add_argument("--act", choices=["torch", "python", "cpp"], default="torch",
                   help="GELU: F.gelu(tanh) | the Python autograd.Function | the C++/CUDA op (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cuda if available, else cpu (default: %(default)s)")
    p.add_argument("--epochs", type=positive(int), default=4, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=positive(int), default=128, help="(default: %(default)s)")
    p.add_argument("--lr", type=positive(float), default=8e-3, help="peak AdamW learning rate of the one-cycle schedule (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="weights and shuffling (default: %(default)s)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="this run's TensorBoard logs and outputs (default: a new runs/lenet5/<time>-<act>/)")
    p.add_argument("--log-every", type=positive(int), default=50, help="steps between train-loss points (default: %(default)s)")
    p.add_argument("--save", type=Path, default=None, help="write the trained state_dict here")
    p.add_argument("--metrics-out", type=Path, default=None, help="write the final metrics here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except DataError as e:
        sys.exit(f"error: {e}")


def run(args):
    torch.manual_seed(args.seed)
    torch.set_flush_denormal(True)
    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest conv
    paths = find_mnist(args.data_dir, download=not args.no_download)
    train_set, test_set = (MNIST(*paths[split]).to(device) for split in ("train", "test"))
    model = LeNet5(make_gelu(args.act, device)).to(device)
    params = sum(p.numel() for p in model.parameters())
    out_dir = new_run_dir(args.out_dir, args.act)
    print(f"LeNet-5 ({params:,} parameters), act={args.act}, device={device}, "
          f"{len(train_set):,} train / {len(test_set):,} test images, logs in {out_dir}")

    train_loader = make_loader(train_set, args.batch_size, shuffle=True, seed=args.seed)
    test_loader = make_loader(test_set, 1000, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    total, warmup = args.epochs * len(train_loader), max(1, args.epochs * len(train_loader) // 5)

    def one_cycle(step):  # linear warm-up over 20% of the steps, then cosine annealing to 0:
        if step < warmup:  # a high peak rate that way converges in a few epochs
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, one_cycle)
    writer = SummaryWriter(out_dir)
    write_json(out_dir / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    digits = test_set[list(range(8))][0]  # a fixed set of test digits for the feature-map images
    with warnings.catch_warnings():  # add_graph traces with torch.jit, which warns it is deprecated
        warnings.simplefilter("ignore")
        writer.add_graph(model, digits)

    step, train_seconds, history = 0, 0.0, []
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        step = train(model, train_loader, optimizer, scheduler, writer, step, args.log_every, epoch)
        if device.type == "cuda":
            torch.cuda.synchronize()  # so the timing covers the GPU work, not just its launch
        train_seconds += time.perf_counter() - t0
        test_loss, test_acc = test(model, test_loader)
        history.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_acc})
        writer.add_scalar("test/loss", test_loss, step)
        writer.add_scalar("test/accuracy", test_acc, step)
        log_images(writer, model, digits, epoch)
        log_gpu(writer, device, step)
        print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {test_acc:.2%} ({train_seconds:.1f} s training)")
    writer.close()

    metrics = {"test_accuracy": test_acc, "test_loss": test_loss, "epochs": args.epochs,
               "train_seconds": round(train_seconds, 3), "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
               "act": args.act, "params": params, "batch_size": args.batch_size, "lr": args.lr,
               "seed": args.seed, "history": history, "out_dir": str(out_dir)}
    write_json(out_dir / "metrics.json", metrics)
    if args.metrics_out:
        write_json(args.metrics_out, metrics)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.save)
    print(f"test accuracy {test_acc:.2%}, test loss {test_loss:.4f}, {train_seconds:.1f} s training on {device}")
    return metrics


if __name__ == "__main__":
    main()
