"""The repository's shape: the packages never import a top-level script (the scripts import them),
and no module is longer than a reader takes in at one sitting."""
import ast

import pytest

from conftest import REPO

SCRIPTS = {path.stem for path in REPO.glob("*.py")}  # gpt_train, lenet5, tokenizer_train
PACKAGES = ("training", "data", "report")
MAX_LINES = 450


def imported_modules(path):
    """The top-level names of every module `path` imports, at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_never_import_a_top_level_script(package):
    assert SCRIPTS >= {"gpt_train", "lenet5", "tokenizer_train"}
    offenders = {str(path.relative_to(REPO)): sorted(imported_modules(path) & SCRIPTS)
                 for path in sorted((REPO / package).rglob("*.py"))}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_import_walk_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    import gpt_train\n    from lenet5 import main\n")
    assert imported_modules(sample) == {"gpt_train", "lenet5"}


def test_no_module_is_longer_than_one_sitting():
    tracked = [path for path in REPO.rglob("*.py")
               if not {"tests", ".git", "build", ".gpu-prep", ".venv"} & set(path.relative_to(REPO).parts)]
    long = {str(path.relative_to(REPO)): n for path in tracked if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
