"""Is this environment ready? One line a check, `ok` or what to do; run it on the login node before queueing.

    python -m training.check_env                          # for lenet5.py and the GPT scripts
    python -m training.check_env --for lenet5 --act cpp   # only what lenet5.py needs, with the own GELU op
    python -m training.check_env --for gpt --text ../shared/data/wos-standin/X.txt --metrics-out env.json

Nothing is downloaded, built or written (but --metrics-out); each package is imported, not only looked up. A
login node without a GPU is fine; a `todo` would stop a job: exit 1.
"""
import importlib.metadata
import re
import subprocess
import sys
from collections import namedtuple
from functools import partial
from pathlib import Path

from data import REPO, data_root, files
from training import lifecycle, rundir
from training.errors import UserError
from training.flags import Parser, add_output_flags

PYTHON_FLOOR = (3, 9)  # transformers 4.49's own floor (CI runs 3.11)
IMPORT_NAMES = {"nvidia-ml-py": "pynvml"}  # the others import as their name with _ for -
USES = {"lenet5": {"gelu_ext", "mnist"}, "gpt": {"corpus"}, "all": {"gelu_ext", "mnist", "corpus"}}
Check = namedtuple("Check", "status name detail")  # status: ok | note (fine, worth knowing) | todo (what to do)
ok, note, todo = (partial(Check, status) for status in ("ok", "note", "todo"))


def release(version):
    """(2, 4, 0) from "2.4", "2.4.0+cu121" or "2.5.0rc1": what a floor compares (2.4.0+cu121 meets 2.4)."""
    numbers = [int(n) for n in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))


def package_problem(name, floor):
    """What is wrong with requirements.txt's `name>=floor` here, or None: missing, older, or not importable."""
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"{name} missing"
    if release(installed) < release(floor):
        return f"{name} {installed} < {floor}"
    try:  # a version that fits is not enough: a CUDA torchvision under a CPU torch fails here (RuntimeError)
        importlib.import_module(IMPORT_NAMES.get(name, name.replace("-", "_")))
    except Exception as e:  # whatever an import raises (a missing shared library: OSError)
        return f"{name} {installed} does not import ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]})"
    return None


def check_python_and_packages(requirements=REPO / "requirements.txt"):
    version = sys.version.split()[0]
    python = (ok("python", f"{version} ({sys.executable})") if sys.version_info[:2] >= PYTHON_FLOOR else
              todo("python", f"{version} is older than %d.%d: use a newer conda/Python" % PYTHON_FLOOR))
    floors = (re.match(r"^\s*([A-Za-z0-9._-]+)\s*>=\s*([^\s#,;]+)", line)  # `name>=X` lines
              for line in requirements.read_text().splitlines())
    problems = [p for p in (package_problem(m[1], m[2]) for m in floors if m) if p]
    if not problems:
        return [python, ok("packages", "requirements.txt's floors met; each imports")]
    fix = "pip install -r requirements.txt"
    if any("does not import" in p for p in problems):
        fix = ("reinstall what does not import, built for this torch (torchvision from torch's own index: pip "
               "install torchvision --index-url https://download.pytorch.org/whl/<cpu, or torch's cuXXX>)")
    if any(p.startswith("torch ") and "does not import" not in p for p in problems):
        fix = ("pip install -r would fetch the newest torch (CUDA 13): make an environment of its own with a torch "
               "built for this cluster's driver first, then pip install -r requirements.txt")
    return [python, todo("packages", f"{', '.join(problems)}: {fix}")]


def driver_cuda():
    """The newest CUDA the NVIDIA driver runs (nvidia-smi's "CUDA Version: 12.4"); None: no answer (or a hang)."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+\.\d+)", out)
    return found[1] if found else None


def check_torch_driver_gpu(torch, driver):
    """torch's build; the driver (`driver`: the newest CUDA it runs) against it; the GPUs."""
    cuda = torch.version.cuda
    build = f"built with CUDA {cuda}" if cuda else ("a CPU build: it trains on CPU only; for the GPUs install a "
                                                    "CUDA build of torch that the cluster's driver runs")
    checks = [(ok if cuda else note)("torch", f"{torch.__version__}, {build}")]
    if driver is None:
        checks.append(note("driver", "no NVIDIA driver answers here (nvidia-smi) (fine on a login node; jobs get one)"))
    elif cuda and release(driver)[:2] < release(cuda)[:2]:
        checks.append(todo("driver", f"the driver runs CUDA <= {driver}, torch needs {cuda}: install a torch built "
                                     f"for CUDA {driver} or older (https://pytorch.org/get-started/previous-versions/)"))
    else:
        checks.append(ok("driver", f"runs CUDA <= {driver}" + (f" (torch's {cuda})" if cuda else "")))
    if not torch.cuda.is_available():
        return checks + [note("gpu", "no GPU on this node (fine on a login node; jobs get one)")]
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return checks + [ok("gpu", f"{torch.cuda.device_count()} x {', '.join(names)}")]


def check_gelu_ext(torch, act):
    """The compiled GELU op: a todo only where it will be used (`--act cpp`; the CPU try-out never builds it)."""
    import gelu_ext
    cuda = torch.version.cuda
    build = ((f"module load cuda/{cuda} (nvcc's CUDA major must be torch's), then " if cuda else "")
             + "pip install --no-build-isolation -e ./gelu_ext")
    if not gelu_ext.is_built():  # (its import error reads "circular import": a missing _C, not a circle)
        return (todo if act == "cpp" else note)("gelu_ext", "not built (no compiled gelu_ext/_C*.so): " + (
            "--act cpp needs it: " if act == "cpp" else "only lenet5.py --act cpp needs it; to build: ") + build)
    if cuda and not gelu_ext.built_with_cuda():
        return note("gelu_ext", f"kernels: CPU only (built without nvcc); --act cpp on a GPU needs CUDA's: {build}")
    return ok("gelu_ext", "kernels: CPU" + (", CUDA" if gelu_ext.built_with_cuda() else ""))


def check_data(args, needed):
    """MNIST (lenet5.py), the corpus and the tokenizer (GPT) as the scripts find them, but offline."""
    from data import tokenizer, wos
    from data.mnist import find_mnist
    checks = []
    if "mnist" in needed:
        try:
            checks.append(unshared("mnist", find_mnist(Path(args.data_dir), download=False)["train"][0].parent))
        except UserError as e:
            checks.append(todo("mnist", f"{e} (lenet5.py downloads them itself where the node has internet)"))
    if "corpus" not in needed:
        return checks
    try:
        text = wos.resolve_text(args.text, download=False)
        checks.append(unshared("corpus", text.parent, f"{text} ({text.stat().st_size / 1e6:.1f} MB)"))
    except UserError as e:
        checks.append(todo("corpus", str(e)))
    spec, local = args.tokenizer, tokenizer.data_copy(args.tokenizer)
    problem = (f"{spec!r} has no copy here (HF cache, {local}): gpt_train.py fetches it where the node has "
               f"internet; else put its folder at {local}")
    try:  # local_copy looks a hub name up without the network (and refuses what is no hub name)
        if Path(spec).expanduser().exists() or tokenizer.looks_like_a_path(spec) or tokenizer.local_copy(spec):
            loaded = tokenizer.open_tokenizer(spec)
            return checks + [ok("tokenizer", f"{loaded.source} ({loaded.vocab_size} tokens)")]
    except UserError as e:
        problem = str(e)
    return checks + [todo("tokenizer", f"{problem} (or python tokenizer_train.py to make "
                                       f"{tokenizer.OWN_TOKENIZER.relative_to(REPO)})")]


def unshared(name, folder, found=None):
    """ok, found in `folder`, unless others may write there (files.check_folder's rule): anyone could swap the data,
    a todo; another user's folder (a lab's shared copy): a note, its owner could."""
    found = found or str(folder)
    if (problem := files.writers_problem(folder)) is None:
        return ok(name, found)
    if "writable by others" in problem:
        return todo(name, f"{found}, but {folder} {problem}: anyone could replace the data; use a copy of your own")
    return note(name, f"{found}; {folder} {problem}: its owner could replace the data (fine if you trust them)")


def main(argv=None):
    phases = lifecycle.Phases().switch("inputs")  # "startup": the interpreter's start-up and this module's imports
    from data import tokenizer
    p = Parser(prog="python -m training.check_env", description=__doc__.split("\n")[0])
    p.add_argument("--for", dest="use", choices=sorted(USES), default="all",
                   help="what to check for: lenet5.py, the GPT scripts, or all (default: %(default)s)")
    p.add_argument("--act", choices=("torch", "python", "cpp"), default="torch",
                   help="the GELU lenet5.py will use: only cpp needs the compiled gelu_ext (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, default=data_root(), help="as lenet5.py's (default: $LAB5_DATA or data/)")
    p.add_argument("--text", type=Path, default=None,
                   help="the corpus, as gpt_train.py --text (default: data/WebOfScience/WOS46985/X.txt)")
    p.add_argument("--tokenizer", default=tokenizer.default_tokenizer(), help="as gpt_train's (default: %(default)s)")
    add_output_flags(p, "write the checks here as JSON")
    args = p.parse_args(argv)
    with lifecycle.one_line_errors(lambda: "nothing was written"):  # the checks only read
        if args.metrics_out:
            rundir.check_output(args.metrics_out, "--metrics-out", args.force)
        phases.switch("checks")
        checks = check_python_and_packages()  # first: a torch too old or broken says so there
        try:
            import torch
        except Exception:  # whatever the import raises: the packages line says what
            checks.append(todo("torch", "not importable (see packages): pip install -r requirements.txt"))
        else:
            gelu = [check_gelu_ext(torch, args.act)] if "gelu_ext" in USES[args.use] else []
            checks += check_torch_driver_gpu(torch, driver_cuda()) + gelu + check_data(args, USES[args.use])
        for check in checks:
            print(f"{check.name:<10} {check.status:<4}  {check.detail}")
        missing = [c.name for c in checks if c.status == "todo"]
        print(f"not ready for {args.use}: {', '.join(missing)}" if missing else f"ready for {args.use}")
        if args.metrics_out:
            files.write_json(args.metrics_out, phases.stamp({"use": args.use, "ready": not missing, "checks": [
                c._asdict() for c in checks]}))
        return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
