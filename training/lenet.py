"""What lenet5.py's two engines share: the run they fill in, the schedule, the logging after steps and epochs."""
import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.device import gpu_stats
from training.errors import UserError
from training.lifecycle import log_line


@dataclass
class LeNetRun:
    """What an engine is handed (args ... phases) and records as it goes."""
    args: object  # the parsed flags
    model: nn.Module
    train_loader: object  # data.mnist.Batches of the images on the device
    test_loader: object
    out_dir: Path
    device: torch.device
    phases: object  # training.lifecycle.Phases: where the process's seconds go (loop, evaluation, logging)
    writer: object = None  # TensorBoard's SummaryWriter (open_writer)
    history: list = field(default_factory=list)  # per epoch: test loss and accuracy
    curve: list = field(default_factory=list)  # [step, training loss] every --log-every steps
    train_accuracy: list = field(default_factory=list)  # [step, accuracy of the step's batch]
    steps: int = 0
    train_seconds: float = 0.0  # the training part of the epochs (no test passes, no logging)
    t0: float = 0.0  # the epoch's start (perf_counter)


def optimizer_and_schedule(run):
    """AdamW, warmed up linearly over 20% of the steps, then a cosine to 0: a high peak LR, a few epochs."""
    total = run.args.epochs * len(run.train_loader)
    warmup = max(1, int(total * 0.2))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    optimizer = torch.optim.AdamW(run.model.parameters(), lr=run.args.lr, weight_decay=1e-4)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def open_writer(run):
    """TensorBoard's writer and the model's graph (imported here: a second --help need not pay)."""
    from torch.utils.tensorboard import SummaryWriter
    run.phases.switch("logging")
    run.writer = SummaryWriter(run.out_dir)
    with warnings.catch_warnings():  # add_graph traces with torch.jit, which warns it is deprecated
        warnings.simplefilter("ignore")
        run.writer.add_graph(run.model, run.test_loader.dataset[:8][0])


def close_writer(run):
    run.phases.log(run.writer, run.steps)
    run.writer.flush()  # raises what the writer thread could not write; close() alone would not
    run.writer.close()


def check_finite(value, what):  # a diverged run stops with one line, not with 10% accuracy and exit 0
    if not math.isfinite(value):
        raise UserError(f"{what} is {value}: training diverged; try a lower --lr")


@torch.no_grad()
def test_pass(run, step):
    """Mean test loss and accuracy, also into TensorBoard; the model is left in eval mode."""
    run.model.eval()
    sums = torch.zeros(2, device=run.device)  # summed loss, right predictions
    for x, y in run.test_loader:
        logits = run.model(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()])
    test_loss, test_acc = (v / len(run.test_loader.dataset) for v in sums.tolist())
    run.writer.add_scalar("loss/test", test_loss, step)
    run.writer.add_scalar("accuracy/test", test_acc, step)
    return test_loss, test_acc


def start_epoch(run):
    run.phases.switch("loop")
    run.model.train()
    run.t0 = time.perf_counter()


def log_point(run, step, logits, y, loss, lr):
    """After every optimizer step; every --log-every steps the batch's loss and accuracy (.tolist(): the one CPU-GPU
    sync)."""
    if step % run.args.log_every:
        return
    value, correct = torch.stack([loss.detach().float(), (logits.detach().argmax(1) == y).sum().float()]).tolist()
    check_finite(value, f"training loss at step {step}")
    accuracy = correct / len(y)
    run.curve.append([step, value])
    run.train_accuracy.append([step, accuracy])
    for tag, number in (("loss/train", value), ("accuracy/train", accuracy), ("train/lr", lr)):
        run.writer.add_scalar(tag, number, step)
    total, seconds = run.args.epochs * len(run.train_loader), run.train_seconds + time.perf_counter() - run.t0
    log_line(None, step, total, [f"loss {value:.4f}", f"accuracy {accuracy:.2%}"], seconds / step * (total - step))


def end_epoch(run, epoch, step):
    """After an epoch started at `run.t0`: its training time, the test pass, its record, images, GPU use, one line."""
    if run.device.type == "cuda":
        torch.cuda.synchronize()  # so the timing covers the GPU work, not just its launch
    run.train_seconds += time.perf_counter() - run.t0
    run.phases.switch("evaluation")
    test_loss, test_acc = test_pass(run, step)
    run.phases.switch("logging")
    check_finite(test_loss, f"test loss after epoch {epoch}")
    run.history.append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_acc})
    run.steps = step
    log_images(run.writer, run.model, run.test_loader.dataset[:8][0], epoch)  # 8 fixed digits
    for tag, value in (gpu_stats(run.device) if run.device.type == "cuda" else {}).items():  # NVML, where installed
        run.writer.add_scalar(tag, value, step)
    print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {test_acc:.2%} ({run.train_seconds:.1f} s training)")


def log_images(writer, model, digits, epoch):
    """The first conv layer's filters, the input digits and both conv layers' feature maps, as grids on white, each
    image scaled to [0, 1]."""
    from torchvision.utils import make_grid  # imported here: it takes a second
    grid = functools.partial(make_grid, normalize=True, scale_each=True, pad_value=1.0)
    model.eval()
    with torch.no_grad():
        c1, c2 = model.features(digits)
    filters = model.conv1.weight.detach().cpu()
    writer.add_image("layers/conv1_filters", grid(F.interpolate(filters, scale_factor=8), nrow=6), epoch)
    writer.add_image("layers/input_digits", grid(digits.cpu(), nrow=len(digits)), epoch)
    for name, maps in (("conv1", c1), ("conv2", c2)):  # one row per digit, one tile per channel
        tiles = maps.detach().cpu().flatten(0, 1).unsqueeze(1)
        writer.add_image(f"layers/{name}_feature_maps", grid(tiles, nrow=maps.shape[1]), epoch)
