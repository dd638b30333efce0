""".ci/budgets.sh, the maintainers' size budgets that CI runs before the tests (they are not tests: a student's
own module must not fail `pytest tests`): run on a copy of the repository's Python, it names what is over."""
import shutil
import subprocess

from conftest import REPO


def python_copy(root):
    """The repository's Python files and the check, in a fresh git repository at `root`."""
    skip = {".git", "build", ".venv", ".gpu-prep"}  # (the checkout need not be a git repository)
    listed = [p.relative_to(REPO) for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts[:-1])]
    for name in [*listed, ".ci/budgets.sh"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def test_a_module_over_the_budgets_fails_the_check_naming_it(tmp_path):
    root = python_copy(tmp_path / "repo")
    (root / "training" / "scratch.py").write_text("x = 1\n" * 401)
    (root / "training" / "scratch2.py").write_text("x = [" + "1, " * 50_000 + "]\n")
    with (root / "gpt_train.py").open("a") as f:
        f.write("\n\ndef long():\n" + "    x = 1\n" * 40)
    done = subprocess.run(["bash", ".ci/budgets.sh"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 1
    assert "Python tokens outside tests/, over 50,000" in done.stderr and "training/scratch.py (401)" in done.stderr
    assert "functions over 40: {'long': 41}" in done.stderr


def test_the_token_count_ignores_docstrings_comments_and_layout(tmp_path):
    root = python_copy(tmp_path / "repo")

    def counted():
        done = subprocess.run(["bash", ".ci/budgets.sh"], cwd=root, capture_output=True, text=True)
        return done.stdout.split(" Python tokens")[0].split()[-1]

    before = counted()
    (root / "training" / "notes.py").write_text('"""A docstring."""\n# a comment\n\n\n')
    assert counted() == before
    (root / "training" / "folded.py").write_text("x = f(1,\n      2)\n")
    spread = counted()
    (root / "training" / "folded.py").write_text("x = f(1, 2)\n")
    assert counted() == spread != before


def test_a_module_more_loaded_by_gpt_train_fails_the_check(tmp_path):
    root = python_copy(tmp_path / "repo")
    for i in range(15):
        (root / "training" / f"extra{i}.py").write_text("")
    source = (root / "gpt_train.py").read_text()
    imports = "".join(f"import training.extra{i}\n" for i in range(15))
    (root / "gpt_train.py").write_text(source.replace("\nimport argparse\n", f"\nimport argparse\n{imports}", 1))
    done = subprocess.run(["bash", ".ci/budgets.sh"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 1 and "import gpt_train loads" in done.stderr and "over 14" in done.stderr
