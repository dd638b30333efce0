"""What benchmarks/gpu_check.sh needs Python for: choosing the carried wheels a machine lacks, checking
requirements and each step's imports before the first step, cutting MNIST for a rehearsal, and writing
the one results file back after every step.

    python benchmarks/gpu_check_tools.py missing-wheels WHEELDIR          wheels whose package is not installed
    python benchmarks/gpu_check_tools.py requirements DIST...             one line per unmet requirement
    python benchmarks/gpu_check_tools.py imports STEP=mod,mod ...         STEP<TAB>ok | STEP<TAB>why, one a line
    python benchmarks/gpu_check_tools.py results WORK OUT.json            every step's status and results
    python benchmarks/gpu_check_tools.py mnist-subset SRC DST N_TRAIN N_TEST   the first N images (rehearsal)

Standard library only (plus `packaging`, which pip and transformers bring): it runs before the
carried packages are installed.
"""
import gzip
import importlib
import importlib.metadata as metadata
import json
import math
import os
import re
import struct
import sys
import traceback
from pathlib import Path


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing_wheels(wheel_dir):
    """The wheels whose distribution is not installed at all: the image's packages are never replaced."""
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        if installed(normalise(wheel.name.split("-")[0])) is None:
            print(wheel)


def requirements(dists):
    """Each dist's unconditional requirements against what is importable now (image + carried folder)."""
    from packaging.requirements import Requirement
    problems = []
    for dist in dists:
        if installed(dist) is None:
            problems.append(f"{dist} not installed")
            continue
        for text in metadata.requires(dist) or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed(req.name)
            if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
                problems.append(f"{dist} needs {req.name}{req.specifier or ''}, found {have or 'none'}")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


def imports(specs):
    """STEP=mod,mod: import each module once (repository and benchmarks/ on the path, as the scripts
    have them); a step is ok when all its modules import, else the first failure's last line."""
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo), str(repo / "benchmarks"), str(repo / "report")]
    failed = {}
    for spec in specs:
        step, _, modules = spec.partition("=")
        why = None
        for module in filter(None, modules.split(",")):
            if module not in failed:
                try:
                    importlib.import_module(module)
                    failed[module] = None
                except BaseException as e:  # SystemExit or an OSError from a broken .so are reasons too
                    failed[module] = f"import {module}: " + (traceback.format_exception_only(e)[-1].strip()
                                                             .splitlines()[0])
            why = why or failed[module]
        print(f"{step}\t{why or 'ok'}", flush=True)


def results(work, out):
    """results.json: the run's facts, an entry per step in order (status, seconds), and every JSON
    result the steps wrote, by file name."""
    work = Path(work)
    facts = json.loads((work / "facts.json").read_text()) if (work / "facts.json").exists() else {}
    steps = []
    for line in (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").exists() else []:
        name, status, seconds = line.split("\t")
        steps.append({"step": name, "status": status, "seconds": int(seconds) if seconds else None})
    found = {}
    for path in sorted((work / "results").glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as e:  # a step cut while writing: say so, keep the rest
            found[path.stem] = {"unreadable": str(e)}
    write(out, {**facts, "steps": steps, "results": found})


def mnist_subset(src, dst, n_train, n_test):
    """The first N images and labels of each MNIST IDX file (lenet5.py has no flag for a fraction of the
    data): the first dimension in the header rewritten, the rest cut. Looked up where lenet5.py looks."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", int(n_train)), ("t10k", int(n_test))):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte"
            path = next(p for d in (src / "MNIST" / "raw", src) for p in (d / name, d / f"{name}.gz") if p.exists())
            data = (gzip.decompress if path.suffix == ".gz" else bytes)(path.read_bytes())
            ndim = data[3]
            dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
            keep = min(n, dims[0])
            header = data[:4] + struct.pack(f">{ndim}I", keep, *dims[1:])
            body = data[4 + 4 * ndim:][:keep * math.prod(dims[1:])]
            (dst / name).write_bytes(header + body)


def write(path, obj):
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    sys.exit({"missing-wheels": lambda: missing_wheels(*args), "requirements": lambda: requirements(args),
              "imports": lambda: imports(args),
              "results": lambda: results(*args),
              "mnist-subset": lambda: mnist_subset(*args)}[command]())
