"""What lenet5.py's two engines share (the plain loop in lenet5.py, Lightning in lenet_lightning.py): the
run they are handed and fill in (LeNetRun), the learning-rate schedule, and what happens after every
epoch (the record, the test figures, filters and feature maps, GPU use, one line)."""
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from data.files import UserError
from training.device import gpu_stats


@dataclass
class LeNetRun:
    """One LeNet-5 run: what an engine is handed (args ... device), and what it records as it goes, so that
    a run that fails half-way still reports its finished epochs."""
    args: object  # the parsed flags
    model: nn.Module
    train_loader: object  # data.mnist.Batches of the images on the device
    test_loader: object
    digits: torch.Tensor  # a fixed set of test digits for the feature-map images
    out_dir: Path
    device: torch.device
    history: list = field(default_factory=list)  # per epoch: test loss and accuracy
    curve: list = field(default_factory=list)  # [step, training loss] every --log-every steps
    train_accuracy: list = field(default_factory=list)  # [step, accuracy of the batches since the last point]
    test_accuracy: list = field(default_factory=list)  # [step, test accuracy] at every test pass
    correct: torch.Tensor = None  # the training batches' right predictions since the last log point, on the device
    seen: int = 0  # and how many images they were
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


def count_correct(run, logits, y):
    """Adds a training batch's right predictions to the tally on the device: no sync (a .item() here would
    stall every step); log_point reads it."""
    hits = (logits.detach().argmax(1) == y).sum()
    run.correct = hits if run.correct is None else run.correct + hits
    run.seen += len(y)


@torch.no_grad()
def evaluate(model, loader):
    """Mean cross-entropy and accuracy (fraction) over the whole loader; the model is left in eval mode."""
    model.eval()
    sums = torch.zeros(2, device=loader.dataset.labels.device)  # summed loss, right predictions
    for x, y in loader:
        logits = model(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()])
    loss_sum, correct = sums.tolist()
    return loss_sum / len(loader.dataset), correct / len(loader.dataset)


def log_point(run, writer, step, loss, lr):
    """Every --log-every steps, in both engines: training loss, the training accuracy of the batches since the
    last point, the LR, and, where it is cheap, the test figures. The one .tolist() is the CPU-GPU sync point."""
    value, correct = torch.stack([loss.detach().float(), run.correct.float()]).tolist()
    check_finite(value, f"training loss at step {step}")
    accuracy, run.correct, run.seen = correct / run.seen, None, 0
    run.curve.append([step, value])
    run.train_accuracy.append([step, accuracy])
    for tag, number in (("train/loss", value), ("train/accuracy", accuracy), ("train/lr", lr)):
        writer.add_scalar(tag, number, step)
    if tests_between_epochs(run.device) and step % len(run.train_loader):  # (the epoch's last step has its own)
        t0 = time.perf_counter()
        with run.phases.of("evaluation"):
            log_test(run, writer, step, *evaluate(run.model, run.test_loader))
        run.model.train()
        run.train_seconds -= time.perf_counter() - t0  # the epoch's timer runs on: this pass is not training


def tests_between_epochs(device):
    """A test pass at every log point only on a GPU, where the test set already lives: 10 batches of 1,000
    images against the 50 training steps between two points. On a CPU a pass costs about 60 training steps
    (0.9 s against 1.5 s per 100 steps, measured on the 2-core VM): at every point it would double an epoch, so
    there the test figures come once per epoch and the training accuracy draws the curve in between."""
    return device.type == "cuda"


def log_test(run, writer, step, test_loss, test_acc):
    run.test_accuracy.append([step, test_acc])
    writer.add_scalar("test/loss", test_loss, step)
    writer.add_scalar("test/accuracy", test_acc, step)


def epoch_done(run, writer, epoch, step, test_loss, test_acc):
    """After an epoch, in both engines: the record, the test figures in TensorBoard, images, GPU use, a line."""
    check_finite(test_loss, f"test loss after epoch {epoch}")
    run.history.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_acc})
    run.steps = step
    log_test(run, writer, step, test_loss, test_acc)
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


def open_writer(run):
    """TensorBoard's SummaryWriter with the model's graph, imported on first use (tensorboard's import is a second
    of start-up that the scripts' --help and error paths need not pay)."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(run.out_dir)
    add_graph(writer, run.model, run.digits)
    return writer


def add_graph(writer, model, digits):
    with warnings.catch_warnings():  # add_graph traces with torch.jit, which warns it is deprecated
        warnings.simplefilter("ignore")
        writer.add_graph(model, digits)
