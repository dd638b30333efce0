"""What lenet5.py's two engines share (the plain loop in lenet5.py, Lightning in lenet_lightning.py): the
run they are handed and fill in (LeNetRun), the learning-rate schedule, and what happens after every
epoch (the record, the test figures, filters and feature maps, GPU use, one line)."""
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from training import UserError
from training.device import gpu_stats


@dataclass
class LeNetRun:
    """One LeNet-5 run: what an engine is handed (args ... device), and what it records as it goes, so that
    a run that fails half-way still reports its finished epochs."""
    args: object  # the parsed flags
    model: nn.Module
    train_set: object  # data.mnist.MNIST on the device
    test_set: object
    digits: torch.Tensor  # a fixed set of test digits for the feature-map images
    out_dir: Path
    device: torch.device
    history: list = field(default_factory=list)  # per epoch: test loss and accuracy
    curve: list = field(default_factory=list)  # [step, training loss] every --log-every steps
    steps: int = 0
    train_seconds: float = 0.0  # the training part of the epochs (no test passes, no logging)
    phases: object = None  # training.clock.Phases: where the process's seconds go (loop, evaluation, logging)


def warmup_cosine(total, warmup_fraction=0.2):
    """LR multiplier per step: linear warm-up over 20% of the steps, then cosine annealing to 0 —
    a high peak rate that way converges in a few epochs."""
    warmup = max(1, int(total * warmup_fraction))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return factor


def check_finite(value, what):
    """A diverged run stops with one line (and a non-zero exit), not with 10% accuracy and exit 0."""
    if not math.isfinite(value):
        raise UserError(f"{what} is {value}: training diverged; try a lower --lr")


def log_loss(run, writer, step, loss, lr):
    """A training-loss point (every --log-every steps: .item() is a CPU-GPU sync point)."""
    value = loss.item()
    check_finite(value, f"training loss at step {step}")
    run.curve.append([step, value])
    writer.add_scalar("train/loss", value, step)
    writer.add_scalar("train/lr", lr, step)


def epoch_done(run, writer, epoch, step, test_loss, test_acc):
    """After an epoch, in both engines: the record, the test figures in TensorBoard, images, GPU use, a line."""
    check_finite(test_loss, f"test loss after epoch {epoch}")
    run.history.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_acc})
    run.steps = step
    writer.add_scalar("test/loss", test_loss, step)
    writer.add_scalar("test/accuracy", test_acc, step)
    log_images(writer, run.model, run.digits, epoch)
    for tag, value in (gpu_stats(run.device) if run.device.type == "cuda" else {}).items():  # NVML, where installed
        writer.add_scalar(tag, value, step)
    print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {test_acc:.2%} ({run.train_seconds:.1f} s training)")


def log_images(writer, model, digits, epoch):
    """The first conv layer's filters, the input digits and both conv layers' feature maps, as image grids."""
    model.eval()
    with torch.no_grad():
        c1, c2 = model.features(digits)
    filters = model.conv1.weight.detach().cpu()
    writer.add_image("layers/conv1_filters", grid(F.interpolate(filters, scale_factor=8), nrow=6), epoch)
    writer.add_image("layers/input_digits", grid(digits.cpu(), nrow=len(digits), scale_each=False), epoch)
    for name, maps in (("conv1", c1), ("conv2", c2)):  # one row per digit, one tile per channel
        tiles = maps.detach().cpu().flatten(0, 1).unsqueeze(1)
        writer.add_image(f"layers/{name}_feature_maps", grid(tiles, nrow=maps.shape[1]), epoch)


def grid(images, nrow, scale_each=True, pad=2):
    """(N, 1, H, W) images tiled `nrow` to a row on white, each scaled to [0, 1] on its own (or all together),
    as one (1, H', W') image: torchvision's make_grid for what LeNet shows, without torchvision's import
    (a second and more of a LeNet run's start-up)."""
    x = images.float()
    dims = (1, 2, 3) if scale_each else (0, 1, 2, 3)
    low, high = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    x = (x - low) / (high - low).clamp_min(1e-5)
    n, _, h, w = x.shape
    rows = math.ceil(n / nrow)
    canvas = torch.ones(1, rows * (h + pad) + pad, nrow * (w + pad) + pad)
    for i in range(n):
        r, c = divmod(i, nrow)
        canvas[:, pad + r * (h + pad):pad + r * (h + pad) + h, pad + c * (w + pad):pad + c * (w + pad) + w] = x[i]
    return canvas


def open_writer(out_dir):
    """TensorBoard's SummaryWriter, imported on first use (tensorboard's import is a second of start-up that
    the scripts' --help and error paths need not pay)."""
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter(out_dir)


def add_graph(writer, model, digits):
    with warnings.catch_warnings():  # add_graph traces with torch.jit, which warns it is deprecated
        warnings.simplefilter("ignore")
        writer.add_graph(model, digits)
