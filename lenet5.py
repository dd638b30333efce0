"""LeNet-5 on MNIST: training, test accuracy, TensorBoard curves and intermediate layers.

    python lenet5.py                               # GPU if there is one, else CPU; >= 99.0% test accuracy
    python lenet5.py --act cpp                     # the own C++/CUDA GELU (build: see gelu_ext/README.md)
    python -m report.browser --logdir runs/lenet5  # TensorBoard: curves, filters, feature maps, graph, GPU use

MNIST lives as one tensor on the device; the loop below and --engine lightning share training/lenet.py."""
from training import lifecycle  # first, before the slow imports: the standard library only

lifecycle.start(__name__)  # a Ctrl-C while torch imports is one line, not a traceback

import contextlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from data import REPO, data_root
from data.files import write_atomic, write_json
from data.mnist import Batches, find_mnist, load_train_test
from training import lenet, rundir
from training.device import device_name
from training.errors import UserError, reason
from training.flags import Parser, add_output_flags, number, path_flag, seed_flag


def make_gelu(act, device):
    """The GELU (tanh approximation) of --act."""
    if act == "torch":
        return nn.GELU(approximate="tanh")
    try:
        import gelu_ext
        module = gelu_ext.PythonGELU() if act == "python" else gelu_ext.GELU()  # not built: the build command
    except ImportError as e:
        raise UserError(f"--act {act}: {e}") from e
    if act == "cpp" and device.type == "cuda" and not gelu_ext.built_with_cuda():
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


def train(run):
    """Train `run` (training.lenet.LeNetRun): AdamW, warm-up + cosine, log points, a test pass every epoch."""
    optimizer, scheduler = lenet.optimizer_and_schedule(run)
    step = 0
    for epoch in range(1, run.args.epochs + 1):
        lenet.start_epoch(run)
        for x, y in tqdm(run.train_loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0):
            logits = run.model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            lenet.log_point(run, step, logits, y, loss, scheduler.get_last_lr()[0])  # a sync every --log-every steps
        lenet.end_epoch(run, epoch, step)


def parse_args(argv):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=path_flag, default=data_root(),
                   help="folder with the MNIST IDX files (or MNIST/raw/ below it) (default: $LAB5_DATA or data/)")
    p.add_argument("--no-download", action="store_true", help="never try to download missing files")
    p.add_argument("--act", choices=["torch", "python", "cpp"], default="torch",
                   help="GELU: F.gelu(tanh) | the Python autograd.Function | the C++/CUDA op (default: %(default)s)")
    p.add_argument("--engine", choices=["plain", "lightning"], default="plain",
                   help="this loop, or Lightning's Trainer on the same model, data and schedule (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto = cuda if available, else cpu (default: %(default)s)")
    p.add_argument("--epochs", type=number(int, 1), default=2,  # the default recipe: benchmarks/lenet_bench.py
                   help="the shortest measured to clear 99.0%% on seeds 0, 1, 2 (default: %(default)s)")
    p.add_argument("--batch-size", type=number(int, 1), default=128, help="(default: %(default)s)")
    p.add_argument("--lr", type=number(float, 0, ends="(]"), default=8e-3,
                   help="peak AdamW learning rate of the warm-up + cosine schedule (default: %(default)s)")
    p.add_argument("--seed", type=seed_flag, default=0, help="weights and shuffling (default: %(default)s)")
    p.add_argument("--out-dir", type=path_flag, default=None,
                   help="this run's TensorBoard logs and outputs (default: runs/lenet5/<time>-<act>[-lightning]/)")
    p.add_argument("--log-every", type=number(int, 1), default=50,
                   help="steps between training loss and accuracy points (default: %(default)s)")
    p.add_argument("--save", type=path_flag, default=None, help="write the trained state_dict here")
    add_output_flags(p)
    return p.parse_args(argv)


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no CUDA GPU")
    torch.backends.cudnn.benchmark = name == "cuda"  # fixed input shapes: let cuDNN pick its fastest conv
    return torch.device(name)


def main(argv=None):
    phases = lifecycle.phases()
    args = parse_args(argv)
    args.argv, args.run_dir = list(sys.argv[1:] if argv is None else argv), None  # recorded in the metrics

    def interrupted():  # a LeNet-5 run takes seconds: stopped, it is run again, not resumed
        return "run the command again to start over" + (
            f"; the same --out-dir sets {args.run_dir}'s files aside" if args.run_dir else "")
    with lifecycle.one_line_errors(interrupted), contextlib.ExitStack() as stack:  # stack: the run lock
        torch.manual_seed(args.seed)
        torch.set_flush_denormal(True)  # tiny activations late in training would hit slow denormal math on CPU
        device = pick_device(args.device)
        fit = train
        if args.engine == "lightning":  # lightning missing: one line now, before the run folder is made
            from training.lenet_lightning import fit_lightning as fit
        out_dir = args.run_dir = open_outputs(args, stack)
        phases.switch("data")
        files = find_mnist(args.data_dir, not args.no_download)
        train_set, test_set = load_train_test(files, device)
        phases.switch("model")
        model = LeNet5(make_gelu(args.act, device)).to(device)
        print(f"LeNet-5 ({sum(p.numel() for p in model.parameters()):,} parameters), act={args.act}, "
              f"engine={args.engine}, device={device}, {len(train_set):,} train / {len(test_set):,} test images, "
              f"logs in {out_dir}")
        run = lenet.LeNetRun(args, model, Batches(train_set, args.batch_size, shuffle=True, seed=args.seed),
                             Batches(test_set, 1000, shuffle=False), out_dir, device, phases)
        try:
            write_json(out_dir / "args.json", vars(args))
            lenet.open_writer(run)
            fit(run)
            lenet.close_writer(run)
        except OSError as e:  # a full or failing disk under out_dir: TensorBoard's events and images
            raise UserError(f"writing the run's logs in {out_dir} failed ({reason(e)})") from None
        phases.switch("teardown")
        metrics = finish(run)
        print(f"test accuracy {metrics['test_accuracy']:.2%}, test loss {metrics['test_loss']:.4f}, "
              f"{metrics['train_seconds']:.1f} s training on {device}")
        return metrics


def open_outputs(args, stack):
    """Outputs checked before training; the run folder locked until `stack` closes, an unfinished run set aside."""
    rundir.check_outputs_not_inputs({"--out-dir": args.out_dir, "--metrics-out": args.metrics_out,
                                       "--save": args.save}, {"--data-dir": args.data_dir})
    for flag, path, kind in (("--metrics-out", args.metrics_out, "JSON"), ("--save", args.save, "torch.save")):
        if path:
            rundir.check_output(path, flag, force=args.force, own_run=args.out_dir, kind=kind)
    suffix = f"-{args.engine}" if args.engine != "plain" else ""
    out_dir = args.out_dir or REPO / "runs" / "lenet5" / f"{rundir.new_run_name()}-{args.act}{suffix}"
    if rundir.open_run(out_dir, "lenet5.py", stack):
        rundir.set_aside_earlier_attempt(out_dir, "stopped before its metrics.json")
    return out_dir


def finish(run):
    """--save, --metrics-out, then metrics.json: a finished run's mark."""
    args, last = run.args, run.history[-1]
    metrics = run.phases.stamp({
        "test_accuracy": last["test_accuracy"], "test_loss": last["test_loss"], "epochs": args.epochs,
        "steps": run.steps, "train_seconds": round(run.train_seconds, 3), "device": str(run.device),
        "device_name": device_name(run.device), "act": args.act, "engine": args.engine, "out_dir": str(run.out_dir),
        "params": sum(p.numel() for p in run.model.parameters()), "batch_size": args.batch_size, "lr": args.lr,
        "seed": args.seed, "torch": torch.__version__, "command": "python lenet5.py " + " ".join(args.argv),
        "history": run.history, "train_loss_curve": run.curve, "train_accuracy_curve": run.train_accuracy})
    if args.save:
        write_atomic(args.save, lambda f: torch.save(run.model.state_dict(), f))
    for path in filter(None, (args.metrics_out, run.out_dir / "metrics.json")):
        write_json(path, metrics)
    return metrics


if __name__ == "__main__":
    lifecycle.run(main)
