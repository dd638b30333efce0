"""The one way the scripts check a flag: an argparse `type` that states the rule where the flag is
declared, so a bad value is one line (`error: argument --lr: must be > 0, got -1`) before any work, and the
rule is read beside the flag's help. Rules that join two flags stay in the script, through Parser.error.

    Parser         every script's ArgumentParser: errors in one line, no abbreviated flags
    number(...)    an int or float in a range;  int_or_auto()  a positive integer or "auto"
"""
import argparse
import math


class Parser(argparse.ArgumentParser):
    """argparse, with a user error in one line on stderr (no usage block: --help has it) and exit status 2,
    and no abbreviations: `--out` is not taken for `--out-dir` (a launcher that reads one flag and a script
    that takes another would disagree about the run folder)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def number(kind, low=None, high=None, low_open=False, high_open=False, why=""):
    """An int or float flag in [low, high] (an open end with `*_open`): finite, and in range."""
    def parse(text):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if kind is float and not math.isfinite(value):  # nan compares False with everything: refuse it first
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if (low is not None and (value <= low if low_open else value < low)) or \
                (high is not None and (value >= high if high_open else value > high)):
            shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
            raise argparse.ArgumentTypeError(f"must be {describe(low, high, low_open, high_open)}{why}, got {shown}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def describe(low, high, low_open, high_open):
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def int_or_auto(low=1):
    """A positive integer or the word auto."""
    as_int = number(int, low)

    def parse(text):
        return text if text == "auto" else as_int(text)
    return parse
