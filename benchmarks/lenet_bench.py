"""LeNet-5 side by side in one process: the default recipe against the lab's original one, or two GELUs.

    OMP_NUM_THREADS=1 python benchmarks/lenet_bench.py --data-dir data --device cpu --metrics-out lenet_bench.json
    python benchmarks/lenet_bench.py --data-dir data --act-pair --metrics-out lenet_bench_act.json

(One thread on a shared CPU: two threads there wait on each other's time slices.) Per seed, alternating so that
drift hits all alike: --baseline-epochs of the handout's recipe (batch 64, Adam 1e-3, torchvision's MNIST), then
`lenet5.py`'s defaults (--lightning: also `--engine lightning`), as a ratio to the original epoch next to it; or,
--act-pair, `--act torch` and `--act cpp` (gelu_ext), with the paired ratios cpp / torch (below 1: gelu_ext faster)."""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import common
import lenet5
from data import data_root
from data.mnist import find_mnist
from training.device import cpu_name
from training.errors import UserError
from training.flags import number, seed_flag

RECIPE = ("epochs", "batch_size", "lr", "steps")  # what lenet5.py's metrics say of the recipe it ran


def original_recipe(data_dir, device, epochs, seed):
    """The lab handout's loop: (seconds of each epoch, accuracy after each epoch)."""
    torch.manual_seed(seed)
    train = datasets.MNIST(data_dir, train=True, transform=transforms.ToTensor())
    test = datasets.MNIST(data_dir, train=False, transform=transforms.ToTensor())
    model = lenet5.LeNet5(lenet5.make_gelu("torch", device)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_loader, test_loader = DataLoader(train, batch_size=64, shuffle=True), DataLoader(test, batch_size=1000)
    seconds, accuracies = [], []
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        model.eval()
        with torch.no_grad():
            correct = sum((model(x.to(device)).argmax(1) == y.to(device)).sum().item() for x, y in test_loader)
        accuracies.append(correct / len(test))
    return seconds, accuracies


def default_run(args, seed, *flags):
    """lenet5.py with its default recipe (plus flags) on this seed, in a throw-away run folder; its metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        return lenet5.main(["--data-dir", str(args.data_dir), "--no-download", "--device", args.device,
                            "--seed", str(seed), "--out-dir", tmp, *flags])


def spread(values):
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def recipe(args, device):
    """Per seed the original recipe's epochs, then the default run; over the seeds, medians and ranges (the
    per-seed rows hold every time and accuracy)."""
    per_seed = []
    for seed in args.seeds:
        base_seconds, base_acc = original_recipe(args.data_dir, device, args.baseline_epochs, seed)
        ours = default_run(args, seed)
        row = {"seed": seed, "baseline_epoch_seconds": base_seconds, "baseline_accuracy": base_acc,
               "default_train_seconds": ours["train_seconds"], "default_accuracy": ours["test_accuracy"],
               "ratio_to_baseline_epoch": ours["train_seconds"] / base_seconds[0]}
        if args.lightning:
            lit = default_run(args, seed, "--engine", "lightning")
            row |= {"lightning_train_seconds": lit["train_seconds"], "lightning_accuracy": lit["test_accuracy"],
                    "lightning_to_plain": lit["train_seconds"] / ours["train_seconds"]}
        per_seed.append(row)
    result = {"mode": "recipe", "per_seed": per_seed, "repeats": len(per_seed), "recipe": {k: ours[k] for k in RECIPE},
              "default_epochs": ours["epochs"], "default_accuracy": min(r["default_accuracy"] for r in per_seed),
              **common.median_range("default_train_seconds", [r["default_train_seconds"] for r in per_seed]),
              "paired_ratios": spread([r["ratio_to_baseline_epoch"] for r in per_seed])}
    if args.lightning:  # the report's Lightning-to-plain ratio: their median and range
        result["all_lightning_to_plain"] = [r["lightning_to_plain"] for r in per_seed]
    return result


def act_pair(args, device):
    """Per seed, --act torch and --act cpp with the default recipe, alternating which goes first."""
    per_seed = []
    for i, seed in enumerate(args.seeds):
        order = ("torch", "cpp") if i % 2 == 0 else ("cpp", "torch")
        runs = {act: default_run(args, seed, "--act", act) for act in order}
        per_seed.append({"seed": seed, "first": order[0],
                         **{f"{act}_train_seconds": runs[act]["train_seconds"] for act in order},
                         **{f"{act}_accuracy": runs[act]["test_accuracy"] for act in order},
                         "cpp_to_torch": runs["cpp"]["train_seconds"] / runs["torch"]["train_seconds"]})
    return {"mode": "act_pair", "per_seed": per_seed, "repeats": len(per_seed),
            "recipe": {k: runs["torch"][k] for k in RECIPE},
            "cpp_to_torch": spread([r["cpp_to_torch"] for r in per_seed])}


def main(argv=None):
    p = common.parser(__doc__, "write the comparison here as JSON",
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=data_root(), help="MNIST root with MNIST/raw/ (env LAB5_DATA)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--seeds", type=seed_flag, nargs="+", default=[0, 1, 2], help="one interleaved repeat per seed")
    p.add_argument("--baseline-epochs", type=number(int, 1), default=1, help="epochs of the original recipe per seed")
    p.add_argument("--act-pair", action="store_true", help="--act torch against --act cpp instead of the recipes")
    p.add_argument("--lightning", action="store_true", help="recipe mode: also the default run with --engine lightning")
    args = common.parse(p, argv)
    try:  # everything a user can get wrong, before any training: one line, not a traceback half-way
        device = lenet5.pick_device(args.device)
        find_mnist(args.data_dir, download=False)
        if args.act_pair:
            lenet5.make_gelu("cpp", device)  # says how to build gelu_ext if it is not built
    except UserError as e:  # MNISTError too
        sys.exit(f"error: {e}")
    load_start = os.getloadavg()[0]  # other work on the machine: read the seconds with it
    result = act_pair(args, device) if args.act_pair else recipe(args, device)
    result |= {"device_name": lenet5.device_name(device), "cpu_model": cpu_name(), **common.run_facts(__file__, argv),
               "load_average_1min_start_end": [load_start, os.getloadavg()[0]]}
    return common.write(args, result)


if __name__ == "__main__":
    main()
