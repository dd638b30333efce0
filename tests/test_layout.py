"""The repository's shape: the packages never import a top-level script (the scripts import them), no
module imports one that imports it back (at any depth, inside functions too), and data/ (the lowest floor)
imports nothing from training/ but its exception, training.errors. These protect a reader of any version, a
student's too; the kit's own size budgets (tokens, lines, functions, noqa comments) are the maintainers' and live in
.ci/budgets.sh, not here."""
import ast

import pytest

from conftest import REPO

SCRIPTS = {path.stem for path in REPO.glob("*.py")}  # gpt_train, lenet5, tokenizer_train
PACKAGES = ("training", "data", "report")


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


def test_the_lowest_floor_never_climbs():
    """data/ imports nothing from training/ but training.errors (UserError, the one exception every floor raises)."""
    climbing = {str(path.relative_to(REPO)): sorted(edges) for path in sorted((REPO / "data").rglob("*.py"))
                if (edges := {e for e in import_graph()[module_name(path)] if e.startswith("training")}
                    - {"training.errors"})}
    assert climbing == {}


def module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """{module: the project modules it imports, at any depth} over the packages and the top-level scripts;
    `from pkg import name` is an edge to pkg.name where that is a module, else to pkg."""
    paths = [p for package in PACKAGES for p in (REPO / package).rglob("*.py")] + list(REPO.glob("*.py"))
    known = {module_name(p): p for p in paths}
    graph = {}
    for name, path in known.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(known)
                edges.update(subs or {node.module})
                if len(subs) < len(node.names):  # names that are not modules come from the package itself
                    edges.add(node.module)
        graph[name] = edges - {name}
    return graph


def cycles(graph):
    """Every strongly connected set of more than one module (Tarjan): each is an import circle."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert {"gpt_train", "training.final", "training.checkpoints", "data.wos"} <= set(graph)
    assert cycles(graph) == []


def test_the_circle_rule_sees_a_circle_hidden_inside_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
