"""LeNet-5 on MNIST: training, test accuracy, TensorBoard curves and intermediate layers.

    python lenet5.py                               # GPU if there is one, else CPU; >= 99.0% test accuracy
    python lenet5.py --act cpp                     # the own C++/CUDA GELU (build: see gelu_ext/README.md)
    python lenet5.py --data-dir ../shared/data --metrics-out lenet.json
    sbatch slurm/lenet.sh --act python             # on the cluster (extra flags are forwarded)
    tensorboard --logdir runs/lenet5               # curves, filters, feature maps, graph, GPU use

MNIST is read by the `MNIST` Dataset of data/mnist.py straight from the IDX files (plain or .gz)
and kept as one uint8 tensor on the training device; missing files are downloaded through
torchvision (md5-checked) where there is internet. This file holds the model, the training loop,
TensorBoard logging; training/lenet_lightning.py drives the same model, data and schedule with
PyTorch Lightning (--engine lightning); what both share is in training/lenet.py. The metrics' end-to-end
time is `process_seconds` (the process, from its start as the OS records it) split into `phases`;
`train_seconds` is the training part of the epochs.
"""
if __name__ == "__main__":  # first: a Ctrl-C during the seconds of imports is one line, not a traceback
    from training.signals import quiet_ctrl_c_while_starting
    quiet_ctrl_c_while_starting()
from training.clock import Phases, exit_quickly, process_seconds  # (standard library only)

IMPORTS_STARTED = process_seconds()  # the imports below are seconds of the job too: they get a phase

import contextlib
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from data import data_root
from data.mnist import Batches, find_mnist, load_train_test
from training import UserError, runfiles
from training.device import device_name
from training.flags import Parser, number, path_flag, seed_flag
from training.lenet import LeNetRun, count_correct, epoch_done, evaluate, log_point, open_writer, warmup_cosine
from training.signals import ctrl_c_raises

IMPORTS = (IMPORTS_STARTED, process_seconds())
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

def train_epoch(run, loader, optimizer, scheduler, writer, step, epoch):
    """One pass over the training set; the global step after it."""
    model = run.model
    model.train()
    for x, y in tqdm(loader, desc=f"epoch {epoch}", leave=False, mininterval=1.0):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        count_correct(run, logits, y)
        if step % run.args.log_every == 0:  # reading the loss is a CPU-GPU sync point: only every log_every steps
            log_point(run, writer, step, loss, scheduler.get_last_lr()[0])
    return step


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no CUDA GPU")
    return torch.device(name)


def new_run_dir(out_dir, act, engine, stack):
    """--out-dir, or a new runs/lenet5/<time>-<id>-<act>[-lightning]/: new, empty, or an unfinished run's (no
    metrics.json: its files set aside; a LeNet run is never resumed, a finished one never overwritten),
    locked while the run lives; a start that fails leaves no folder."""
    suffix = f"-{engine}" if engine != "plain" else ""
    out_dir = out_dir or REPO / "runs" / "lenet5" / f"{runfiles.new_run_name()}-{act}{suffix}"
    unfinished = out_dir.is_dir() and not (out_dir / "metrics.json").exists()
    runfiles.claim_run_dir(out_dir, "lenet5.py", stack, reuse=unfinished)
    if unfinished:
        if (out_dir / "metrics.json").exists():  # the run that held the lock finished meanwhile
            raise UserError(f"--out-dir {out_dir} holds a run of lenet5.py that has just finished; give a new folder")
        runfiles.set_aside_earlier_attempt(out_dir, "stopped before its metrics.json")
    return out_dir


def check_outputs(args):
    """Every file the run will write, checked before any training: none of the work is lost at the end,
    and no output overwrites an input (an MNIST file, or a file beside them)."""
    runfiles.check_outputs_not_inputs({"--metrics-out": args.metrics_out, "--save": args.save},
                                      {"--data-dir": args.data_dir})
    for flag, path in (("--metrics-out", args.metrics_out), ("--save", args.save)):
        if path:  # the ownership rule: not inside another run's folder, no file replaced that lenet5.py did not write
            runfiles.check_output(path, flag, "lenet5.py", own_run=args.out_dir)


def parse_args(argv):
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=path_flag, default=data_root(),
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
    p.add_argument("--epochs", type=number(int, 1), default=2, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=number(int, 1), default=128, help="(default: %(default)s)")
    p.add_argument("--lr", type=number(float, 0, low_open=True), default=8e-3,
                   help="peak AdamW learning rate of the warm-up + cosine schedule (default: %(default)s)")
    p.add_argument("--seed", type=seed_flag, default=0, help="weights and shuffling (default: %(default)s)")
    p.add_argument("--out-dir", type=path_flag, default=None,
                   help="this run's TensorBoard logs and outputs "
                        "(default: a new runs/lenet5/<time>-<act>[-lightning]/)")
    p.add_argument("--log-every", type=number(int, 1), default=50,
                   help="steps between train-loss points (default: %(default)s)")
    p.add_argument("--save", type=path_flag, default=None, help="write the trained state_dict here")
    p.add_argument("--metrics-out", type=path_flag, default=None, help="write the final metrics here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    phases = Phases(IMPORTS)  # the interpreter's start-up and the imports, then "inputs"
    ctrl_c_raises()  # from here on main's `except KeyboardInterrupt` says the line
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in the metrics
    try:
        with contextlib.ExitStack() as stack:  # the run folder's lock, held to the end
            return run(args, stack, phases)
    except UserError as e:  # MNISTError, OutputError too
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # a LeNet-5 run takes seconds: it is run again, not resumed
        where = f"; the same --out-dir sets {args.run_dir}'s files aside" if getattr(args, "run_dir", None) else ""
        print(f"\ninterrupted (Ctrl-C): run the command again to start over{where}", file=sys.stderr)
        sys.exit(130)


def run(args, stack, phases):
    torch.manual_seed(args.seed)
    torch.set_flush_denormal(True)  # tiny activations late in training would otherwise hit slow denormal math on CPU
    device = pick_device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest conv
    check_outputs(args)
    fit = fit_plain
    if args.engine == "lightning":
        from training.lenet_lightning import fit_lightning, need_lightning
        fit = fit_lightning
        need_lightning()  # missing: one line now, before the run folder is made
    out_dir = args.run_dir = new_run_dir(args.out_dir, args.act, args.engine, stack)
    phases.switch("data")
    train_set, test_set = (ds.to(device) for ds in load_train_test(find_mnist(args.data_dir, not args.no_download)))
    train_loader = Batches(train_set, args.batch_size, shuffle=True, seed=args.seed)
    phases.switch("model")
    model = LeNet5(make_gelu(args.act, device)).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"LeNet-5 ({params:,} parameters), act={args.act}, engine={args.engine}, device={device}, "
          f"{len(train_set):,} train / {len(test_set):,} test images, logs in {out_dir}")
    digits = test_set[torch.arange(8, device=device)][0]  # a fixed set of test digits for the feature-map images
    run = LeNetRun(args, model, train_loader, Batches(test_set, 1000, shuffle=False), digits, out_dir, device,
                   phases=phases)  # filled in as it goes
    try:
        with runfiles.quiet_writer_thread():
            runfiles.write_json(out_dir / "args.json", vars(args))
            fit(run)
    except (OSError, runfiles.OutputError) as e:  # a full or failing disk under out_dir: events, images, args.json
        failure = f"writing the run's logs in {out_dir} failed ({runfiles.reason(e)})"
        raise UserError(keep_what_we_can(run, metrics_of(run, params), failure)) from None
    phases.switch("teardown")
    metrics = metrics_of(run, params)
    keep_what_we_can(run, metrics)  # --save, --metrics-out
    metrics = with_clock(metrics, phases)
    keep_what_we_can(run, metrics, weights=False)  # --metrics-out again, with the whole process's time
    try:
        runfiles.write_json(out_dir / "metrics.json", metrics)
    except runfiles.OutputError as e:
        raise UserError(f"writing {out_dir / 'metrics.json'} failed ({runfiles.reason(e)}); "
                        f"the metrics are in --metrics-out where given") from None
    last = metrics["history"][-1]
    print(f"test accuracy {last['test_accuracy']:.2%}, test loss {last['test_loss']:.4f}, "
          f"{metrics['train_seconds']:.1f} s training on {device}")
    return metrics


def with_clock(metrics, phases):
    """The metrics with the process's seconds (end to end, from its start as the OS records it) and where
    they went; taken just before the last output is written."""
    spent, now = phases.record()
    return {**metrics, "process_seconds": now, "phases": spent}


def metrics_of(run, params):
    """The run's metrics from what fit recorded (after a failure: up to the last whole epoch)."""
    args, device = run.args, run.device
    last = run.history[-1] if run.history else {"test_accuracy": None, "test_loss": None}
    return {"test_accuracy": last["test_accuracy"], "test_loss": last["test_loss"], "epochs": args.epochs,
            "steps": run.steps, "train_seconds": round(run.train_seconds, 3), "device": str(device),
            "device_name": device_name(device), "act": args.act, "engine": args.engine, "params": params,
            "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "torch": torch.__version__,
            "command": "python lenet5.py " + " ".join(args.argv), "history": run.history,
            "train_loss_curve": run.curve, "train_accuracy_curve": run.train_accuracy,
            "test_accuracy_curve": run.test_accuracy, "out_dir": str(run.out_dir)}


def keep_what_we_can(run, metrics, failure=None, weights=True):
    """--metrics-out and --save (often on another disk than the run folder); after a failure, also what
    was kept, in the one line that stops the run."""
    args, model, kept = run.args, run.model, []
    if failure:
        metrics = metrics | {"stopped": failure}
    for flag, what, path, write in (
            ("--metrics-out", "metrics", args.metrics_out, lambda p: runfiles.write_json(p, metrics)),
            ("--save", "weights", args.save if weights else None,
             lambda p: runfiles.write_atomic(p, lambda f: torch.save(model.state_dict(), f)))):
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


# ----------------------------------------------------------------------------- the plain loop (--engine plain)

def fit_plain(run):
    """AdamW with warm-up + cosine, a test pass after every epoch; history, times, the train-loss curve and
    steps go into `run` (training.lenet.LeNetRun) as they happen."""
    args = run.args
    train_loader = run.train_loader
    optimizer = torch.optim.AdamW(run.model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.epochs * len(train_loader)))
    run.phases.switch("logging")
    writer = open_writer(run)
    step = 0
    for epoch in range(1, args.epochs + 1):
        run.phases.switch("loop")
        t0 = time.perf_counter()
        step = train_epoch(run, train_loader, optimizer, scheduler, writer, step, epoch)
        if run.device.type == "cuda":
            torch.cuda.synchronize()  # so the timing covers the GPU work, not just its launch
        run.train_seconds += time.perf_counter() - t0
        run.phases.switch("evaluation")
        test_loss, test_acc = evaluate(run.model, run.test_loader)
        run.phases.switch("logging")
        epoch_done(run, writer, epoch, step, test_loss, test_acc)
    run.phases.log(writer, step)
    writer.flush()  # raises what the writer thread could not write; close() alone would not
    writer.close()


if __name__ == "__main__":
    main()
    exit_quickly()
