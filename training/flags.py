"""Flag checks as argparse `type`s, stated where the flag is declared: a bad value is one line
(`error: argument --lr: must be > 0, got -1`) before any work. Rules joining two flags: Parser.error."""
import argparse
import math
import os
from pathlib import Path

from data.files import path_problem
from training import CACHE_HOME


class Parser(argparse.ArgumentParser):
    """No abbreviated flags (`--out` taken for `--out-dir`: the log named one folder, the run wrote another);
    a flag error in one line, as every user error."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def number(kind, low, high=None, ends="[]", why=""):
    """An int or float flag in `low`..`high`, `ends` saying which are open as an interval does ("(]": > low): finite,
    in range."""
    def parse(text):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if kind is float and not math.isfinite(value):  # nan compares False with everything: refuse it first
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if (value <= low if ends[0] == "(" else value < low) or \
                (high is not None and (value >= high if ends[1] == ")" else value > high)):
            shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
            bounds = (f"{'>' if ends[0] == '(' else '>='} {low}" if high is None else
                      f"in {ends[0]}{low}, {high}{ends[1]}")
            raise argparse.ArgumentTypeError(f"must be {bounds}{why}, got {shown}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def path_flag(text):
    """A path: refused if empty (it would mean the current folder) or if path_problem() finds it unusable."""
    text = os.fspath(text)  # main(argv) called with Path objects
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a folder or file name (an empty value would mean "
                                         "the current folder)")
    if problem := path_problem(text):
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return Path(text)


def path_or_name_flag(text):
    """path_flag's rule for a flag that also takes a name (--tokenizer gpt2)."""
    path_flag(text)
    return os.fspath(text)  # as typed: "./x.json" must still look like a path, not a hub name


seed_flag = number(int, 0, 2**32, ends="[)")  # the range every generator here takes (torch, numpy, datasets)


def int_or_auto(text):
    return text if text == "auto" else number(int, 1)(text)


def add_output_flags(parser, metrics_help="write the final metrics here as JSON"):
    """--metrics-out and --force, alike in every script (training/rundir.check_output's rule)."""
    parser.add_argument("--metrics-out", type=path_flag, default=None, help=metrics_help)
    parser.add_argument("--force", action="store_true", help="replace existing output files, if they are of the kind "
                        "this script writes (a JSON object; --save: a torch.save archive): never any other file")


# ----------------------------------------------------------------------------- gpt_train.py's presets and flags
# (`python gpt_train.py --help` prints them grouped, with defaults)

PRESETS = {  # model shape, batch, and the optimizer's peak learning rate times lr_scale; everything else is a flag
    "lab": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, micro_batch=16, global_batch=64, lr_scale=1),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, seq_len=64, micro_batch=8, global_batch=16, lr_scale=3),
}


def gpt_parser():
    """gpt_train.py's flags, in the three groups its --help prints."""
    p = Parser(description="Train GPT-2 (124M structure, random init) on Web of Science abstracts for 12M tokens.",
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_gpt_data_flags(p.add_argument_group("data, model and batch").add_argument)
    add_gpt_optimisation_flags(p.add_argument_group("optimisation and accelerations").add_argument)
    outputs = p.add_argument_group("evaluation, checkpoints and outputs")
    add_gpt_output_flags(outputs.add_argument)
    add_output_flags(outputs)
    return p


def add_gpt_data_flags(add):
    from data.tokenizer import default_tokenizer  # here: the other scripts' flags need no tokenizers
    lab, tiny = PRESETS["lab"], PRESETS["tiny"]
    add("--preset", choices=list(PRESETS), default="lab", help="model and batch shape")
    add("--text", type=path_flag, default=None,
        help="X.txt, one document per line; None: data/WebOfScience/WOS46985/X.txt, downloaded if missing")
    add("--tokenizer", type=path_or_name_flag, default=default_tokenizer(),
        help="tokenizer.json, a folder or 'gpt2'; default: tokenizer_train.py's once it ran")
    add("--tokens", type=number(int, 1, 10**13), default=12_000_000, help="training budget in tokens, all processes")
    for name in ("n_layer", "n_head", "n_embd", "seq_len", "global_batch"):
        add(f"--{name.replace('_', '-')}", type=number(int, 1), default=lab[name], help=f"(tiny preset: {tiny[name]})")
    add("--micro-batch", type=int_or_auto, default="auto", help="sequences per process per forward pass; auto: "
        f"on a GPU the largest that fits, on CPU the preset's (lab {lab['micro_batch']}, tiny {tiny['micro_batch']})")
    add("--seed", type=seed_flag, default=0, help="weights, data order, split")
    add("--val-fraction", type=number(float, 0, 0.5, "()"), default=0.005, help="held-out documents")
    add("--cache-dir", type=path_flag, default=None, help="tokenised-data cache; None: the repository's data/cache")
    add("--no-download", action="store_true", help="never try to download the WOS archive")
    add("--accept-invalid-utf8", action="store_true", help="train on a text mostly not UTF-8 (bad bytes as U+FFFD)")


def add_gpt_optimisation_flags(add):
    from training import step  # here: the other scripts' flags need no torch (check_env's diagnose a broken one)
    add("--lr", type=number(float, 0, ends="(]"), default=None, help="peak learning rate; None: the optimizer's "
        f"(training/step.py) x the preset's lr_scale (AdamW: {step.OPTIMIZERS['adamw'].lr:g}, tiny "
        f"x{PRESETS['tiny']['lr_scale']})")
    add("--warmup", type=number(float, 0, 1, ends="[)"), default=0.1, help="warm-up, fraction of the steps")
    add("--weight-decay", type=number(float, 0), default=None, help="on matrices only; None: the optimizer's")
    add("--grad-clip", type=number(float, 0, ends="(]", why=" (0 clips every gradient to nothing)"), default=1.0,
        help="gradient norm clipped to this")
    add("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto", help="auto: see training/device.py")
    add("--compile", choices=["auto", "regional", "whole", "off"], default="auto",
        help="torch.compile each block (regional) or the whole model; auto: off (training/device.py)")
    add("--compile-cache", type=path_flag, default=CACHE_HOME / "torch-compile", help="inductor/Triton cache")
    for a in step.declared():  # declared in training/step.py
        add(a.flag, choices=list(a.values()), default={v: k for k, v in a.values().items()}[a.default],
            help=f"{a.label}: {a.why}")


def add_gpt_output_flags(add):
    add("--out-dir", type=path_flag, default=None, help="the run's folder: new, empty, or one of gpt_train.py's "
        "(with a checkpoint: resumed); None: a new runs/gpt/<time>-<id>/")
    add("--eval-every", type=number(int, 1), default=50, help="steps between validation losses")
    add("--val-batches", type=number(int, 1), default=20, help="micro-batches per validation")
    add("--log-every", type=number(int, 1), default=10, help="steps between logged points")
    add("--sample-tokens", type=number(int, 0, 1024), default=48,
        help="tokens continuing fixed validation prompts after training; 0: none")
    add("--ckpt-every", type=number(int, 0, why=" (0: only on signals)"), default=100,
        help="steps between checkpoints; 0: only on signals")
    add("--keep-checkpoints", action="store_true",
        help="keep a finished run's checkpoints, one after its last step too (else only final/ stays)")


def parse_gpt_args(argv):
    """The flags, defaults from the chosen preset (a first pass reads --preset)."""
    from training import step
    p = gpt_parser()
    preset = PRESETS[p.parse_known_args(argv)[0].preset]
    p.set_defaults(**{k: v for k, v in preset.items() if k not in ("micro_batch", "lr_scale")})
    args = p.parse_args(argv)
    optimizer = step.OPTIMIZERS[args.optimizer]  # its own defaults
    args.lr = args.lr or optimizer.lr * preset["lr_scale"]
    args.weight_decay = optimizer.weight_decay if args.weight_decay is None else args.weight_decay
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if args.preset == "lab" and args.seq_len > 1024:
        p.error(f"--seq-len {args.seq_len} exceeds GPT-2's 1024 positions")
    return args
