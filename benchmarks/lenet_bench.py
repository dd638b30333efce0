"""LeNet-5: this repository's default run against the lab's original recipe, side by side.

    python benchmarks/lenet_bench.py --data-dir ../shared/data --metrics-out report/results/lenet_bench_cpu.json

The original recipe: batch 64, Adam 1e-3, torchvision's MNIST Dataset with the ToTensor
transform (one PIL image per sample), --baseline-epochs epochs. The default run is
`lenet5.py` with its default flags, once with its own loop and once with `--engine lightning`
(the same model, data and schedule driven by PyTorch Lightning). Same process, same device,
same model; the three alternate within each repeat, and medians are reported.
"""
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import lenet5  # noqa: E402
from data import files  # noqa: E402


def original_recipe(data_dir, device, epochs, seed):
    """The lab handout's loop, timed per epoch; returns (seconds per epoch, accuracy after each epoch)."""
    torch.manual_seed(seed)
    to_tensor = transforms.ToTensor()
    train = datasets.MNIST(data_dir, train=True, transform=to_tensor)
    test = datasets.MNIST(data_dir, train=False, transform=to_tensor)
    train_loader = DataLoader(train, batch_size=64, shuffle=True)
    test_loader = DataLoader(test, batch_size=1000)
    model = lenet5.LeNet5(lenet5.make_gelu("torch", device)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    seconds, accuracies = [], []
    for _ in range(epochs):
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
        accuracies.append(correct / len(test))
    return seconds, accuracies


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LAB5_DATA", REPO / "data")),
                   help="MNIST root with MNIST/raw/ (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="(default: %(default)s)")
    p.add_argument("--baseline-epochs", type=int, default=1, help="(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="alternating pairs of runs; medians are reported, "
                                                          "since a shared VM is noisy (default: %(default)s)")
    p.add_argument("--metrics-out", type=Path, default=None, help="write the comparison here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        device = lenet5.pick_device(args.device)
        lenet5.find_mnist(args.data_dir, download=False)  # one clear line if the files are missing
    except lenet5.UserError as e:
        sys.exit(f"error: {e}")

    base_runs, ours_runs, lit_runs = [], [], []
    for _ in range(args.repeats):  # alternate, so that drift on the machine hits all alike
        base_runs.append(original_recipe(args.data_dir, device, args.baseline_epochs, args.seed))
        for engine, runs in (("plain", ours_runs), ("lightning", lit_runs)):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(lenet5.main(["--data-dir", str(args.data_dir), "--no-download", "--device", args.device,
                                         "--seed", str(args.seed), "--engine", engine, "--out-dir", tmp]))
    base_seconds = [statistics.median(run[0][i] for run in base_runs) for i in range(args.baseline_epochs)]
    base_acc = base_runs[0][1]  # seeded: the same in every repeat
    ours = ours_runs[0] | {"train_seconds": statistics.median(run["train_seconds"] for run in ours_runs)}
    lit = lit_runs[0] | {"train_seconds": statistics.median(run["train_seconds"] for run in lit_runs)}
    device_name = lenet5.device_name(device)
    result = {
        "device_name": device_name,
        "baseline_epoch_seconds": [round(s, 3) for s in base_seconds],
        "baseline_accuracy": base_acc,
        "default_train_seconds": ours["train_seconds"],
        "default_epochs": ours["epochs"],
        "default_accuracy": ours["test_accuracy"],
        "ratio_to_one_baseline_epoch": ours["train_seconds"] / base_seconds[0],
        "repeats": args.repeats,
        "lightning_train_seconds": lit["train_seconds"],
        "lightning_accuracy": lit["test_accuracy"],
        "lightning_to_plain": lit["train_seconds"] / ours["train_seconds"],
        "all_baseline_first_epoch_seconds": [round(run[0][0], 3) for run in base_runs],
        "all_default_train_seconds": [run["train_seconds"] for run in ours_runs],
        "all_lightning_train_seconds": [run["train_seconds"] for run in lit_runs],
        "all_lightning_to_plain": [b["train_seconds"] / a["train_seconds"] for a, b in zip(ours_runs, lit_runs)],
        "cpu_model": files.cpu_name(), "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
    }
    print(f"\n{device_name}, medians of {args.repeats} alternating repeats")
    for i, (s, a) in enumerate(zip(base_seconds, base_acc), 1):
        print(f"  original recipe, epoch {i}: {s:6.2f} s, test accuracy {a:.2%}")
    print(f"  default lenet5.py, {ours['epochs']} epochs: {ours['train_seconds']:6.2f} s, "
          f"test accuracy {ours['test_accuracy']:.2%}")
    print(f"  --engine lightning, {lit['epochs']} epochs: {lit['train_seconds']:6.2f} s, "
          f"test accuracy {lit['test_accuracy']:.2%}")
    print(f"  default training time = {result['ratio_to_one_baseline_epoch']:.2f} x one original epoch; "
          f"Lightning / plain = {result['lightning_to_plain']:.2f} "
          f"(per repeat {', '.join(f'{r:.2f}' for r in result['all_lightning_to_plain'])})")
    if args.metrics_out:
        files.write_json(args.metrics_out, result)
    return result


if __name__ == "__main__":
    main()
