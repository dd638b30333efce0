"""What benchmarks/gpu_check.sh checks and makes before its first step (standard library only, plus
`packaging`, which pip brings: it runs before the carried packages are installed).

    python benchmarks/gpu_check_prep.py check-prep DIR                  one line on what is wrong with DIR
    python benchmarks/gpu_check_prep.py missing-wheels WHEELDIR        wheels whose package is not installed
    python benchmarks/gpu_check_prep.py requirements DIST...           one line per unmet requirement
    python benchmarks/gpu_check_prep.py imports STEP=mod,mod ...       STEP<TAB>ok | STEP<TAB>why, one a line
    python benchmarks/gpu_check_prep.py rehearsal-venv CACHE           the image's python3 shape (--rehearse)
    python benchmarks/gpu_check_prep.py mnist-subset SRC DST N_TRAIN N_TEST   the first N images (rehearsal)
    python benchmarks/gpu_check_prep.py cuda-ready [REHEARSE]          gelu_ext's CUDA kernels compiled in
"""
import gzip
import importlib
import importlib.metadata as metadata
import json
import math
import os
import platform
import struct
import sys
import traceback
import zipfile
import zlib
from pathlib import Path

from gpu_check_tools import fail, one_line

COMMANDS = "check_prep missing_wheels requirements imports rehearsal_venv mnist_subset cuda_ready"


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing_wheels(wheel_dir):
    """The wheels whose distribution is not installed at all: the image's packages are never replaced."""
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        if installed(wheel.name.split("-")[0]) is None:  # importlib.metadata normalises the name
            print(wheel)


def requirements(*dists):
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


def imports(*specs):
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
                    failed[module] = one_line(f"import {module}: " + traceback.format_exception_only(e)[-1])
            why = why or failed[module]
        print(f"{step}\t{why or 'ok'}", flush=True)


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


PREP_FILES = ["wheels", "MNIST/raw", "X.txt.gz", "corpus_source.tsv", "gpt2-tokenizer/tokenizer.json", "prep.txt"]
MNIST_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def check_prep(prep):
    """A --prepare folder, whole and made for this interpreter: the first problem as one line, exit 1."""
    problem = next(prep_problems(Path(prep)), None)
    return fail(problem) if problem else 0


def prep_problems(prep):
    """What is wrong with DIR, in the order it is checked: its files there; the wheels made for this Python
    and platform (pip would refuse them late, at install); every .gz read to its end and every wheel's zip
    tested (not gzip or cut short is named here, not in a step's traceback); the corpus source line."""
    again = "make DIR again with --prepare"
    yield from (f"{prep / name} not found: make DIR with --prepare"
                for name in PREP_FILES if not (prep / name).exists())
    made = dict(line.split(" ", 1) for line in (prep / "prep.txt").read_text().splitlines() if " " in line)
    here_py, here = f"{sys.version_info[0]}.{sys.version_info[1]}", f"{sys.platform}-{platform.machine()}"
    if made.get("python") != here_py:
        yield (f"{prep} was prepared for Python {made.get('python', '?')}, {sys.executable} is {here_py}: "
               f"prepare again with --python {here_py}")
    if made.get("platform") != here:
        yield f"{prep} was prepared for {made.get('platform', '?')}, this machine is {here}"
    for path in [prep / "X.txt.gz", *sorted((prep / "MNIST" / "raw").glob("*.gz"))]:
        try:
            with gzip.open(path) as f:
                while f.read(1 << 22):
                    pass
        except (OSError, EOFError, zlib.error) as e:
            yield f"{path} is damaged ({type(e).__name__}: {e}): {again}"
    names = {p.name for p in (prep / "MNIST" / "raw").glob("*.gz")}
    yield from (f"{prep / 'MNIST/raw'} lacks {n}.gz: {again}" for n in MNIST_FILES if f"{n}.gz" not in names)
    lines = (prep / "corpus_source.tsv").read_bytes().decode("utf-8", "replace").splitlines()
    fields = lines[0].split("\t") if len(lines) == 1 else []
    if len(fields) != 2 or not fields[0].startswith("/") or not fields[1].isdigit() or int(fields[1]) == 0:
        yield f"{prep / 'corpus_source.tsv'} is malformed (want one line: /source/path<TAB>documents): {again}"
    for wheel in sorted((prep / "wheels").glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            bad = str(e)
        if bad:
            yield f"wheel {wheel} is damaged ({bad}): {again}"
    try:
        json.loads((prep / "gpt2-tokenizer" / "tokenizer.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        yield f"{prep / 'gpt2-tokenizer/tokenizer.json'} is not JSON ({e})"


def rehearsal_venv(cache):
    """The lent image's interpreter shape for a rehearsal: a venv (no system site packages) whose python3
    imports torch only through its own pyvenv.cfg: a .pth in its site-packages names this interpreter's.
    Its base is a python of this version that lacks torch (/usr/bin's, say), so that a link to its python3
    from another folder, which Python starts as that base, fails as on the image; made once under CACHE.
    Prints its bin folder, then what it is (nothing to make where this interpreter is a venv's, as the image's)."""
    import hashlib
    import shutil
    import subprocess
    if sys.prefix != sys.base_prefix:
        print(f"{Path(sys.executable).parent}\nrehearsal: python3 is a venv's already ({sys.prefix}), as on the image")
        return 0
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    bases = [b for b in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                         shutil.which(f"python{version}")) if b and Path(b).is_file()]
    base = next((b for b in bases if subprocess.run([b, "-I", "-c", "import torch"], capture_output=True).returncode),
                sys.executable)
    key = hashlib.sha256("\n".join([sys.executable, base, *sites]).encode()).hexdigest()[:12]
    venv = Path(cache) / f"rehearsal-venv-{version}-{key}"
    if not (venv / "verdict.txt").exists():
        tmp = Path(f"{venv}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        (tmp / "lib" / f"python{version}" / "site-packages" / "lab5-image.pth").write_text("\n".join(sites) + "\n")
        link = Path(f"{tmp}-link") / "python"  # as the old gpu_check.sh linked it: no pyvenv.cfg one folder up
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(tmp / "bin" / "python3")
        venv_ok, link_ok = (not subprocess.run([str(p), "-c", "import torch"], capture_output=True).returncode
                            for p in (tmp / "bin" / "python3", link))
        shutil.rmtree(link.parent)
        if not venv_ok:
            return fail(f"the rehearsal's venv {tmp} does not import torch")
        (tmp / "verdict.txt").write_text(
            f"python3 of a venv shaped like the lent image's ({venv}, base {base}); a link to it from another "
            f"folder {'imports torch too (its base has it): the image fails there' if link_ok else 'fails'} "
            f"'import torch', as on the image\n")
        shutil.rmtree(venv, ignore_errors=True)
        os.replace(tmp, venv)
    print(f"{venv / 'bin'}\nrehearsal: " + (venv / "verdict.txt").read_text().strip())
    return 0


def cuda_ready(rehearsal="0"):
    """The extension (the first gelu_ext on the path: a fresh build's) has its CUDA kernels compiled in, else
    every CUDA test would skip and pytest pass; on a GPU, torch also sees the device. A rehearsal has none
    to see: the compiled kernels are what it checks."""
    import torch
    if rehearsal != "1" and not torch.cuda.is_available():
        return fail(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none'})")
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH's build
    import gelu_ext
    if not gelu_ext.is_built():
        return fail("gelu_ext is not built (the build step failed or did not run)")
    if not gelu_ext.built_with_cuda():
        return fail(f"gelu_ext was built without CUDA kernels (no usable nvcc for torch's CUDA {torch.version.cuda})")
    print(f"gelu_ext: CPU + CUDA kernels ({Path(gelu_ext.__file__).parent})")
    return 0


if __name__ == "__main__":  # gpu_check_prep.py COMMAND ARGS: the function of that name, dashes for underscores
    command = sys.argv[1].replace("-", "_")
    sys.exit(globals()[command](*sys.argv[2:]) if command in COMMANDS.split() else f"unknown command {sys.argv[1]}")
