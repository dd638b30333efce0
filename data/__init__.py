"""Data pipelines shared by the scripts (the data sets themselves are git-ignored)."""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def data_root():
    """$LAB5_DATA (a shared copy holding MNIST/raw/ and WebOfScience/; relative: to where the script started, as the
    scripts never change their folder), else the repository's data/."""
    return Path(os.environ.get("LAB5_DATA") or REPO / "data").absolute()
