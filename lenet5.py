"""LeNet-5 on MNIST: training, test accuracy, TensorBoard curves and intermediate layers.

    python lenet5.py                               # GPU if there is one, else CPU; >= 99.0% test accuracy
    python lenet5.py --act cpp                     # the own C++/CUDA GELU (build: see gelu_ext/README.md)
    python lenet5.py --data-dir ../shared/data --metrics-out lenet.json
    sbatch slurm/lenet.sh --act python             # on the cluster (extra flags are forwarded)
    tensorboard --logdir runs/lenet5               # curves, filters, feature maps, graph, GPU use

MNIST is read by the `MNIST` Dataset of data/mnist.py straight from the IDX files (plain or .gz)
and kept as one uint8 tensor on the training device; missing files are downloaded through
torchvision (md5-checked) where there is internet. This file holds the model, the training loop,
TensorBoard logging and the same loop driven by PyTorch Lightning.
"""
import argparse
import contextlib
import logging
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from data import data_root
from data.mnist import Batches, find_mnist, load_train_test
from training import UserError, runfiles
from training.device import device_name, gpu_stats

REPO = Path(__file__).resolve().parent


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
        raise UserError(f"--act {act}: {e}") from e
    if device.type == "cuda" and not gelu_ext.built_with_cuda():
        raise UserError("--act cpp on a GPU: gelu_ext was built without its CUDA kernel; rebuild it where "
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

def train_epoch(model, loader, optimizer, scheduler, writer, step, log_every, epoch, curve):
    """One pass over the training set; the global step after it. Logged losses also go to `curve`."""
    model.train()
    for x, y in tqdm(loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if step % log_every == 0:  # .item() is a CPU-GPU sync point: only every log_every steps
            value = loss.item()
            check_finite(value, f"training loss at step {step}")
            curve.append([step, value])
            writer.add_scalar("train/loss", value, step)
            writer.add_scalar("train/lr", scheduler.get_last_lr()[0], step)
    return step


def check_finite(value, what):
    """A diverged run stops with one line (and a non-zero exit), not with 10% accuracy and exit 0."""
    if not math.isfinite(value):
        raise UserError(f"{what} is {value}: training diverged; try a lower --lr")


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


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no CUDA GPU")
    return torch.device(name)


def new_run_dir(out_dir, act, engine, stack):
    """--out-dir, or a new runs/lenet5/<time>-<id>-<act>[-lightning]/: new or empty (a LeNet run is never
    resumed, so never overwritten), locked while the run lives; a start that fails leaves no folder."""
    suffix = f"-{engine}" if engine != "plain" else ""
    out_dir = out_dir or REPO / "runs" / "lenet5" / f"{runfiles.new_run_name()}-{act}{suffix}"
    return runfiles.claim_run_dir(out_dir, "lenet5.py", stack, reuse=False)


def check_outputs(args):
    """Every file the run will write, checked before any training: none of the work is lost at the end,
    and no output overwrites an input (an MNIST file, or a file beside them)."""
    runfiles.check_outputs_not_inputs({"--metrics-out": args.metrics_out, "--save": args.save},
                                   {"--data-dir": args.data_dir})
    if args.metrics_out:
        runfiles.check_output(args.metrics_out, "--metrics-out")
    if args.save:
        runfiles.check_output(args.save, "--save")


def warmup_cosine(total, warmup_fraction=0.2):
    """LR multiplier per step: linear warm-up over 20% of the steps, then cosine annealing to 0 —
    a high peak rate that way converges in a few epochs."""
    warmup = max(1, int(total * warmup_fraction))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return factor


def positive(kind):
    def parse(text):
        value = kind(text)
        if not math.isfinite(value) or value <= 0:  # float("nan") <= 0 is False: check finiteness first
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=data_root(),
                   help="folder with the MNIST IDX files (or MNIST/raw/ below it); env LAB5_DATA "
                        "(default: %(default)s)")
    p.add_argument("--no-download", action="store_true", help="never try to download missing files")
    p.add_argument("--act", choices=["torch", "python", "cpp"], default="torch",
                   help="GELU: F.gelu(tanh) | the Python autograd.Function | the C++/CUDA op (default: %(default)s)")
    p.add_argument("--engine", choices=["plain", "lightning"], default="plain",
                   help="the training loop below, or the same model, data and schedule driven by PyTorch "
                        "Lightning's Trainer (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cuda if available, else cpu (default: %(default)s)")
    # the default recipe: the shortest measured to clear 99.0% on seeds 0, 1, 2 (benchmarks/lenet_bench.py)
    p.add_argument("--epochs", type=positive(int), default=2, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=positive(int), default=128, help="(default: %(default)s)")
    p.add_argument("--lr", type=positive(float), default=8e-3, help="peak AdamW learning rate of the warm-up + "
                                                                    "cosine schedule (default: %(default)s)")
    p.add_argument("--seed", type=runfiles.seed_flag, default=0, help="weights and shuffling (default: %(default)s)")
    p.add_argument("--out-dir", type=runfiles.path_flag, default=None,
                   help="this run's TensorBoard logs and outputs "
                        "(default: a new runs/lenet5/<time>-<act>[-lightning]/)")
    p.add_argument("--log-every", type=positive(int), default=50,
                   help="steps between train-loss points (default: %(default)s)")
    p.add_argument("--save", type=Path, default=None, help="write the trained state_dict here")
    p.add_argument("--metrics-out", type=Path, default=None, help="write the final metrics here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    try:
        with contextlib.ExitStack() as stack:  # the run folder's lock, held to the end
            return run(args, stack)
    except UserError as e:  # MNISTError, OutputError too
        sys.exit(f"error: {e}")


def run(args, stack):
    torch.manual_seed(args.seed)
    torch.set_flush_denormal(True)  # tiny activations late in training would otherwise hit slow denormal math on CPU
    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest conv
    check_outputs(args)
    fit = fit_lightning if args.engine == "lightning" else fit_plain
    if fit is fit_lightning:
        need_lightning()  # missing: one line now, before the run folder is made
    out_dir = new_run_dir(args.out_dir, args.act, args.engine, stack)
    train_set, test_set = (ds.to(device) for ds in load_train_test(find_mnist(args.data_dir, not args.no_download)))
    model = LeNet5(make_gelu(args.act, device)).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"LeNet-5 ({params:,} parameters), act={args.act}, engine={args.engine}, device={device}, "
          f"{len(train_set):,} train / {len(test_set):,} test images, logs in {out_dir}")
    digits = test_set[torch.arange(8, device=device)][0]  # a fixed set of test digits for the feature-map images
    record = {"history": [], "train_seconds": 0.0, "curve": [], "steps": 0}  # filled by fit as it goes
    try:
        with runfiles.quiet_writer_thread():
            runfiles.write_json(out_dir / "args.json", vars(args))
            fit(args, model, train_set, test_set, digits, out_dir, device, record)
    except (OSError, runfiles.OutputError) as e:  # a full or failing disk under out_dir: events, images, args.json
        failure = f"writing the run's logs in {out_dir} failed ({runfiles.reason(e)})"
        partial = metrics_of(args, record, device, params, out_dir)
        raise UserError(keep_what_we_can(args, model, partial, failure)) from None
    metrics = metrics_of(args, record, device, params, out_dir)
    keep_what_we_can(args, model, metrics)
    try:
        runfiles.write_json(out_dir / "metrics.json", metrics)
    except runfiles.OutputError as e:
        raise UserError(f"writing {out_dir / 'metrics.json'} failed ({runfiles.reason(e)}); "
                        f"the metrics are in --metrics-out where given") from None
    last = metrics["history"][-1]
    print(f"test accuracy {last['test_accuracy']:.2%}, test loss {last['test_loss']:.4f}, "
          f"{metrics['train_seconds']:.1f} s training on {device}")
    return metrics


def metrics_of(args, record, device, params, out_dir):
    """The run's metrics from what fit recorded (after a failure: up to the last whole epoch)."""
    last = record["history"][-1] if record["history"] else {"test_accuracy": None, "test_loss": None}
    return {"test_accuracy": last["test_accuracy"], "test_loss": last["test_loss"], "epochs": args.epochs,
            "steps": record["steps"], "train_seconds": round(record["train_seconds"], 3), "device": str(device),
            "device_name": device_name(device), "act": args.act, "engine": args.engine, "params": params,
            "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "torch": torch.__version__,
            "command": "python lenet5.py " + " ".join(args.argv), "history": record["history"],
            "train_loss_curve": record["curve"], "out_dir": str(out_dir)}


def keep_what_we_can(args, model, metrics, failure=None):
    """--metrics-out and --save (often on another disk than the run folder); after a failure, also what
    was kept, in the one line that stops the run."""
    kept = []
    if failure:
        metrics = metrics | {"stopped": failure}
    for flag, what, path, write in (
            ("--metrics-out", "metrics", args.metrics_out, lambda p: runfiles.write_json(p, metrics)),
            ("--save", "weights", args.save, lambda p: torch.save(model.state_dict(), p))):
        if path is None:
            continue
        try:
            write(path)
            kept.append(f"{what} in {path}")
        except (OSError, runfiles.OutputError) as e:
            if not failure:
                raise UserError(f"{flag} {path}: {runfiles.reason(e)}") from None
    if failure:
        history = metrics["history"]
        done = f"after epoch {history[-1]['epoch']}" if history else "before the first epoch ended"
        return f"{failure} {done}; " + ("kept " + ", ".join(kept) if kept else "nothing kept")
    return None


def epoch_done(writer, model, digits, device, record, epoch, step, test_loss, test_acc, train_seconds):
    """What both engines do after an epoch: the record, the test figures in TensorBoard, images, GPU use, a line."""
    check_finite(test_loss, f"test loss after epoch {epoch}")
    record["history"].append({"epoch": epoch, "test_loss": test_loss, "test_accuracy": test_acc})
    record["steps"], record["train_seconds"] = step, train_seconds
    writer.add_scalar("test/loss", test_loss, step)
    writer.add_scalar("test/accuracy", test_acc, step)
    log_images(writer, model, digits, epoch)
    for tag, value in (gpu_stats(device) if device.type == "cuda" else {}).items():  # NVML, where installed
        writer.add_scalar(tag, value, step)
    print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {test_acc:.2%} ({train_seconds:.1f} s training)")


def add_graph(writer, model, digits):
    with warnings.catch_warnings():  # add_graph traces with torch.jit, which warns it is deprecated
        warnings.simplefilter("ignore")
        writer.add_graph(model, digits)


# ----------------------------------------------------------------------------- the plain loop (--engine plain)

def fit_plain(args, model, train_set, test_set, digits, out_dir, device, record):
    """AdamW with warm-up + cosine, a test pass after every epoch; history, times, the train-loss curve and
    steps go into `record` as they happen."""
    train_loader = Batches(train_set, args.batch_size, shuffle=True, seed=args.seed)
    test_loader = Batches(test_set, 1000, shuffle=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.epochs * len(train_loader)))
    writer = SummaryWriter(out_dir)
    add_graph(writer, model, digits)
    step, train_seconds = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        step = train_epoch(model, train_loader, optimizer, scheduler, writer, step, args.log_every, epoch,
                           record["curve"])
        if device.type == "cuda":
            torch.cuda.synchronize()  # so the timing covers the GPU work, not just its launch
        train_seconds += time.perf_counter() - t0
        test_loss, test_acc = test(model, test_loader)
        epoch_done(writer, model, digits, device, record, epoch, step, test_loss, test_acc, train_seconds)
    writer.flush()  # raises what the writer thread could not write; close() alone would not
    writer.close()


# ----------------------------------------------------------------------------- Lightning (--engine lightning)

def fit_lightning(args, model, train_set, test_set, digits, out_dir, device, record):
    """The same model, batches, optimizer, schedule and test pass, driven by lightning.Trainer: it runs
    the loop, steps optimizer and scheduler, runs the test pass and the callbacks. The data already
    lives on the device, so it moves nothing. Fills `record` as fit_plain does."""
    L = need_lightning()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # "TPU available: ..."
    warnings.filterwarnings("ignore", message=".*(srun. command is available|LeafSpec)")  # hints not for us
    train_loader = Batches(train_set, args.batch_size, shuffle=True, seed=args.seed)
    logger = L.pytorch.loggers.TensorBoardLogger(out_dir, name="", version="", default_hp_metric=False)
    add_graph(logger.experiment, model, digits)
    lit = lightning_module(L)(model, args, args.epochs * len(train_loader), record["curve"])
    epochs = epoch_callback(L)(digits, device, record)
    trainer = L.Trainer(accelerator=device.type, devices=1, max_epochs=args.epochs, logger=logger,
                        callbacks=[epochs], enable_checkpointing=False, enable_progress_bar=False,
                        num_sanity_val_steps=0, log_every_n_steps=args.log_every)
    trainer.fit(lit, train_dataloaders=train_loader, val_dataloaders=Batches(test_set, 1000, shuffle=False))
    logger.experiment.flush()  # raises what the writer thread could not write
    logger.experiment.close()


def need_lightning():
    """lightning, imported on first use: the import takes ~4 s the plain loop need not pay."""
    try:
        import lightning
    except ImportError as e:
        raise UserError(f"--engine lightning needs the lightning package ({e}): "
                        "pip install -r requirements.txt") from None
    return lightning


def lightning_module(L):
    """LeNet-5 as a LightningModule (the class is made on first use, with lightning imported)."""

    class LitLeNet5(L.LightningModule):
        def __init__(self, model, args, total_steps, curve):
            super().__init__()
            self.model, self.args, self.total_steps = model, args, total_steps
            self.test_result, self.curve = None, curve

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            step = self.global_step + 1  # optimizer steps after this one, as the plain loop counts
            if step % self.args.log_every == 0:  # a sync point: only every log_every steps
                value = loss.item()
                check_finite(value, f"training loss at step {step}")
                self.curve.append([step, value])
                self.logger.experiment.add_scalar("train/loss", value, step)
                self.logger.experiment.add_scalar("train/lr", self.lr_schedulers().get_last_lr()[0], step)
            return loss

        def on_validation_epoch_start(self):
            self.sums = torch.zeros(2, device=self.device)  # summed loss, correct predictions

        def validation_step(self, batch, batch_idx):  # the test set, after every epoch (as the plain loop)
            x, y = batch
            logits = self.model(x)
            self.sums += torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()])

        def on_validation_epoch_end(self):
            n = len(self.trainer.val_dataloaders.dataset)
            loss_sum, correct = self.sums.tolist()
            self.test_result = (loss_sum / n, correct / n)

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.lr, weight_decay=1e-4)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(self.total_steps))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return LitLeNet5


def epoch_callback(L):
    """A Callback that times the training part of each epoch (the plain loop's train_seconds) and then
    does what the plain loop does after an epoch (epoch_done)."""

    class EpochEnd(L.Callback):
        def __init__(self, digits, device, record):
            self.digits, self.device, self.record, self.train_seconds = digits, device, record, 0.0

        def on_train_epoch_start(self, trainer, lit):
            self.t0 = time.perf_counter()

        def on_validation_epoch_start(self, trainer, lit):  # the epoch's training batches are done
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.train_seconds += time.perf_counter() - self.t0

        def on_validation_end(self, trainer, lit):  # after the module's on_validation_epoch_end
            test_loss, test_acc = lit.test_result
            epoch_done(trainer.logger.experiment, lit.model, self.digits, self.device, self.record,
                       trainer.current_epoch + 1, trainer.global_step, test_loss, test_acc, self.train_seconds)

    return EpochEnd


if __name__ == "__main__":
    main()
