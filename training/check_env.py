"""Is this environment ready? One line a check, `ok` or what to do; run it on the login node before queueing.

    python -m training.check_env                      # for everything: lenet5.py and the GPT scripts
    python -m training.check_env --for lenet5         # only what lenet5.py needs (--data-dir as lenet5.py's)
    python -m training.check_env --for lenet5 --act cpp   # ... with the own GELU op, which must then be built
    python -m training.check_env --for gpt --text ../shared/data/wos-standin/X.txt --metrics-out env.json

It reads only: nothing is downloaded, built or written (but --metrics-out). A node without a GPU is
fine (a login node: the jobs get one); what would stop a job is a line with `todo`, and then the
exit status is 1.
"""
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from data import data_root
from training import UserError, runfiles
from training.clock import Phases
from training.flags import Parser, path_flag

REPO = Path(__file__).resolve().parents[1]
PYTHON_FLOOR = (3, 9)  # transformers 4.49's own floor (CI runs 3.11)
LOGIN_NODE = "(fine on a login node; jobs get one)"
USES = {"lenet5": {"python", "packages", "torch", "driver", "gpu", "nvcc", "gelu_ext", "mnist"},
        "gpt": {"python", "packages", "torch", "driver", "gpu", "corpus", "tokenizer"}}
USES["all"] = USES["lenet5"] | USES["gpt"]


@dataclass
class Check:
    name: str
    status: str  # ok | note (fine, worth knowing) | todo (what to do before a job can work)
    detail: str


def ok(name, detail):
    return Check(name, "ok", detail)


def note(name, detail):
    return Check(name, "note", detail)


def todo(name, detail):
    return Check(name, "todo", detail)


def run_quietly(command):
    """A command's stdout, or None where it is missing, fails or hangs (a wedged driver)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def major_minor(text):
    """(12, 1) from "12.1" or "12.1.105"."""
    return tuple(int(p) for p in text.split(".")[:2])


# ----------------------------------------------------------------------------- Python and packages

def check_python():
    version = platform.python_version()
    if sys.version_info[:2] < PYTHON_FLOOR:
        return todo("python", f"{version} is older than {'.'.join(map(str, PYTHON_FLOOR))}: use a newer "
                              f"conda/Python module, then pip install -r requirements.txt")
    return ok("python", f"{version} ({sys.executable})")


def floors(requirements=REPO / "requirements.txt"):
    """{package: lower bound} of requirements.txt (its `name>=X` lines)."""
    lines = requirements.read_text().splitlines()
    found = (re.match(r"^\s*([A-Za-z0-9._-]+)\s*>=\s*([^\s#,;]+)", line) for line in lines)
    return {m[1]: m[2] for m in found if m}


def older(installed, floor):
    """Whether version `installed` is below `floor`, by their release numbers (2.4.0+cu121 >= 2.4)."""
    def release(v):
        return tuple(int(n) for n in re.findall(r"\d+", v.split("+")[0].split("rc")[0])[:3])
    a, b = release(installed), release(floor)
    return a + (0,) * (3 - len(a)) < b + (0,) * (3 - len(b))


def check_packages(requirements=REPO / "requirements.txt"):
    problems = []
    for name, floor in floors(requirements).items():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name} missing")
            continue
        if older(version, floor):
            problems.append(f"{name} {version} < {floor}")
    if not problems:
        return ok("packages", "requirements.txt's floors met")
    if any(p.startswith("torch ") for p in problems):  # pip install -r would fetch the newest torch (CUDA 13)
        return todo("packages", f"{', '.join(problems)}: torch older than requirements.txt's floor; make an "
                                f"environment of its own with a torch built for this cluster's driver first, "
                                f"then pip install -r requirements.txt")
    return todo("packages", f"{', '.join(problems)}: pip install -r requirements.txt")


# ----------------------------------------------------------------------------- torch, driver, GPU, nvcc

def check_torch(torch):
    if torch.version.cuda is None:
        return note("torch", f"{torch.__version__}, a CPU build: it trains on CPU only; for the GPUs install a "
                             f"CUDA build of torch that the cluster's driver runs")
    return ok("torch", f"{torch.__version__}, built with CUDA {torch.version.cuda}")


def driver_cuda():
    """The highest CUDA version the NVIDIA driver runs ("CUDA Version: 12.4" in nvidia-smi), or None."""
    out = run_quietly(["nvidia-smi"]) if shutil.which("nvidia-smi") else None
    found = re.search(r"CUDA Version:\s*(\d+\.\d+)", out or "")
    return found[1] if found else None


def check_driver(torch, version):
    if version is None:
        return note("driver", f"no NVIDIA driver answers here (nvidia-smi) {LOGIN_NODE}")
    if torch.version.cuda and major_minor(version) < major_minor(torch.version.cuda):
        return todo("driver", f"the driver runs CUDA <= {version}, torch needs {torch.version.cuda}: install a "
                              f"torch built for CUDA {version} or older (https://pytorch.org/get-started/previous-versions/)")
    return ok("driver", f"runs CUDA <= {version}" + (f" (torch's {torch.version.cuda})" if torch.version.cuda else ""))


def check_gpu(torch):
    if not torch.cuda.is_available():
        return note("gpu", f"no GPU on this node {LOGIN_NODE}")
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return ok("gpu", f"{torch.cuda.device_count()} x {', '.join(names)}")


def find_nvcc():
    """The nvcc gelu_ext/setup.py would use: $CUDA_HOME/bin/nvcc, else the one on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def check_nvcc(torch, nvcc, act="cpp"):
    """The compiler for gelu_ext's CUDA kernel: a todo only where the op will be used (`--act cpp`)."""
    wanted = torch.version.cuda
    problem = todo if act == "cpp" else note
    if nvcc is None:
        return note("nvcc", "none: gelu_ext builds CPU-only" + (f" (for its CUDA kernel: module load cuda/{wanted})"
                                                                 if wanted else ""))
    found = re.search(r"release (\d+\.\d+)", run_quietly([str(nvcc), "--version"]) or "")
    if found is None:
        return problem("nvcc", f"{nvcc} --version names no CUDA release: set CUDA_HOME to a CUDA toolkit")
    if wanted and found[1].split(".")[0] != wanted.split(".")[0]:
        return problem("nvcc", f"{nvcc} is CUDA {found[1]}, torch's is {wanted}: module load cuda/{wanted} (or set "
                            f"CUDA_HOME to a CUDA {wanted.split('.')[0]}.x), or build CPU-only: "
                            f"GELU_EXT_CPU_ONLY=1 pip install --no-build-isolation -e ./gelu_ext")
    return ok("nvcc", f"CUDA {found[1]} ({nvcc})")


# ----------------------------------------------------------------------------- the extension and the data

def check_gelu_ext(torch, act="cpp"):
    """The compiled GELU op: a todo only where it will be used (`--act cpp`); for the default `--act torch`
    an unbuilt op is a note (the CPU try-out never builds it)."""
    import gelu_ext
    if not gelu_ext.is_built():  # (its import error reads "circular import": a missing _C, not a circle)
        line = todo if act == "cpp" else note
        return line("gelu_ext", "not built (no compiled gelu_ext/_C*.so): " + (
            "--act cpp needs it: " if act == "cpp" else "only lenet5.py --act cpp needs it; to build: ")
            + "pip install --no-build-isolation -e ./gelu_ext")
    kernels = [key for key in ("CPU", "CUDA")
               if torch._C._dispatch_has_kernel_for_dispatch_key("gelu_ext::gelu_forward", key)]
    if "CUDA" not in kernels and torch.version.cuda:
        return note("gelu_ext", f"kernels: {', '.join(kernels)}; no CUDA kernel (--act cpp on a GPU needs it): "
                                "load the CUDA module that matches torch, then "
                                "pip install --no-build-isolation -e ./gelu_ext")
    return ok("gelu_ext", f"kernels: {', '.join(kernels)}")


def check_mnist(data_dir):
    from data.mnist import find_mnist
    try:
        paths = find_mnist(Path(data_dir), download=False)
    except UserError as e:
        return todo("mnist", f"{e} (lenet5.py downloads them itself where the node has internet)")
    return ok("mnist", str(paths["train"][0].parent))


def check_corpus(text):
    from data import wos
    try:
        path = wos.resolve_text(text, download=False)
    except UserError as e:
        return todo("corpus", str(e))
    return ok("corpus", f"{path} ({path.stat().st_size / 1e6:.1f} MB)")


def check_tokenizer(spec):
    """The tokenizer as gpt_train.py opens it; a hub name ("gpt2") only from a copy on this machine."""
    from data import tokenizer
    make_own = f"or python tokenizer_train.py to make {tokenizer.OWN_TOKENIZER.relative_to(REPO)}"
    if not (Path(spec).expanduser().exists() or tokenizer.looks_like_a_path(spec) or hub_copy_here(spec)):
        local = tokenizer.repository_copy(spec)
        return todo("tokenizer", f"{spec!r} has no copy here (HF cache, {local}): gpt_train.py fetches it where "
                                 f"the node has internet; else put its folder at {local}, {make_own}")
    try:
        loaded = tokenizer.open_tokenizer(spec)
    except UserError as e:
        return todo("tokenizer", f"{e} ({make_own})")
    return ok("tokenizer", f"{loaded.source} ({loaded.vocab_size} tokens)")


def hub_copy_here(name):
    """Whether a hub tokenizer's files are on this machine (data/tokenizer.py's offline lookup)."""
    from data import tokenizer
    try:
        return tokenizer.local_copy(name) is not None
    except tokenizer.TokenizerError:  # not a hub name either: open_tokenizer says so
        return True


# ----------------------------------------------------------------------------- the command

def run_checks(args):
    """The checks `args.use` needs, in order (torch imported here: a missing torch is one todo line)."""
    needed = USES[args.use]
    checks = [check_python(), check_packages()]  # the packages before torch: a torch too old says so first
    try:
        import torch
    except ImportError as e:
        return checks + [todo("torch", f"not importable ({e}): pip install -r requirements.txt")]
    checks += [check_torch(torch), check_driver(torch, driver_cuda()), check_gpu(torch)]
    if "nvcc" in needed:
        checks += [check_nvcc(torch, find_nvcc(), args.act), check_gelu_ext(torch, args.act)]
    if "mnist" in needed:
        checks.append(check_mnist(args.data_dir))
    if "corpus" in needed:
        checks += [check_corpus(args.text), check_tokenizer(args.tokenizer)]
    return checks


def parse_args(argv):
    from data import tokenizer
    p = Parser(prog="python -m training.check_env", description=__doc__.split("\n")[0])
    p.add_argument("--for", dest="use", choices=sorted(USES), default="all",
                   help="what to check for: lenet5.py, the GPT scripts, or all (default: %(default)s)")
    p.add_argument("--act", choices=("torch", "python", "cpp"), default="torch",
                   help="the GELU lenet5.py will use: only cpp needs the compiled gelu_ext (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, default=data_root(),
                   help="MNIST's folder, as lenet5.py --data-dir (default: $LAB5_DATA or data/)")
    p.add_argument("--text", type=Path, default=None,
                   help="the corpus, as gpt_train.py --text (default: data/WebOfScience/WOS46985/X.txt)")
    p.add_argument("--tokenizer", default=tokenizer.default_tokenizer(),
                   help="as gpt_train.py --tokenizer (default: %(default)s)")
    p.add_argument("--metrics-out", type=path_flag, default=None, help="write the checks here as JSON")
    return p.parse_args(argv)


def main(argv=None):
    phases = Phases().switch("inputs")  # "startup": the interpreter's start-up and this module's imports
    args = parse_args(argv)
    try:
        if args.metrics_out:
            runfiles.check_output(args.metrics_out, "--metrics-out", "check_env.py")
        phases.switch("checks")
        checks = run_checks(args)
        for check in checks:
            print(f"{check.name:<10} {check.status:<4}  {check.detail}")
        missing = [c.name for c in checks if c.status == "todo"]
        print(f"not ready for {args.use}: {', '.join(missing)}" if missing else f"ready for {args.use}")
        if args.metrics_out:
            spent, now = phases.record()
            runfiles.write_json(args.metrics_out, {"use": args.use, "ready": not missing, "checks": [
                asdict(c) for c in checks], "process_seconds": now, "phases": spent})
    except UserError as e:
        sys.exit(f"error: {e}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
