"""Flag checks as argparse `type`s, stated where the flag is declared: a bad value is one line
(`error: argument --lr: must be > 0, got -1`) before any work. Rules joining two flags: Parser.error."""
import argparse
import math
import os
from pathlib import Path

from data.files import path_problem


class Parser(argparse.ArgumentParser):
    """No abbreviated flags (`--out` taken for `--out-dir`: the log named one folder, the run wrote another);
    a flag error in one line, as every user error."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def number(kind, low, high=None, ends="[]", why="", multiple=None):
    """An int or float flag in `low`..`high`, `ends` saying which are open as an interval does ("(]": > low): finite,
    in range, a multiple of `multiple`."""
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
        if multiple and value % multiple:
            raise argparse.ArgumentTypeError(f"must be a multiple of {multiple}{why}, got {text}")
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
