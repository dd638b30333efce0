"""Build gelu_ext._C: the C++ CPU kernels, plus the CUDA kernels whenever nvcc is found.

    pip install --no-build-isolation -e ./gelu_ext        # from the repository root

--no-build-isolation builds against the torch already installed (never a second download), and
-e keeps the package importable from the repository, where the scripts and tests import it.
An nvcc whose CUDA major version differs from the one torch was built with (torch.version.cuda)
stops the build in one line saying what to do: load the CUDA module that matches torch, or build
CPU-only. Environment:
    GELU_EXT_CPU_ONLY=1         skip the CUDA kernels even where nvcc exists
    CUDA_HOME=/usr/local/cuda   where nvcc and the CUDA headers live (found by itself if unset)
    TORCH_CUDA_ARCH_LIST        GPU architectures; default: the visible GPU's, or, on a machine
                                without one (a login node), 7.5;8.0;9.0+PTX (2080Ti, A100, H100/H200)
"""
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path


def find_cuda_home():
    """torch guesses CUDA_HOME as the folder above the nvcc on PATH, which is wrong when that nvcc is
    a wrapper script (/usr/local/bin/nvcc on the course machines): take the first candidate that has
    the CUDA headers. Set before torch.utils.cpp_extension reads it."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    for home in ([Path(nvcc).resolve().parents[1]] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (home / "include" / "cuda_runtime.h").exists() and (home / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(home)
            return


find_cuda_home()

try:
    import torch
except ImportError:
    sys.exit("gelu_ext: torch is not importable here; build with pip install --no-build-isolation -e ./gelu_ext")
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension


def nvcc_version(nvcc):
    """"13.0" from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88"), or None."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found[1] if found else None


def check_cuda_major(nvcc):
    """torch's own check fails with a traceback deep in the build: say it first, with the ways out."""
    version = nvcc_version(nvcc)
    if version and version.split(".")[0] != torch.version.cuda.split(".")[0]:
        sys.exit(f"gelu_ext: {nvcc} is CUDA {version} but torch {torch.__version__} was built with CUDA "
                 f"{torch.version.cuda}: load the CUDA module that matches torch (e.g. module load "
                 f"cuda/{torch.version.cuda}) and build again, or build without the CUDA kernels: "
                 f"GELU_EXT_CPU_ONLY=1 pip install --no-build-isolation -e ./gelu_ext")


cpu_only = os.environ.get("GELU_EXT_CPU_ONLY", "0") == "1"
nvcc = Path(CUDA_HOME) / "bin" / "nvcc" if CUDA_HOME else None
# A CPU build of torch (torch.version.cuda None) cannot load CUDA kernels: build CPU-only there.
with_cuda = not cpu_only and torch.version.cuda is not None and nvcc is not None and nvcc.exists()
if with_cuda:
    check_cuda_major(nvcc)

# -fopenmp: at::parallel_for is inline in ATen's headers and without it runs on one thread. Only
# compiled with it, not linked: the OpenMP runtime is the one torch already loaded (libgomp).
cxx_flags = ["-O3", "-fopenmp"]
if platform.machine() in ("x86_64", "AMD64"):
    # ATen's Vectorized<float> uses AVX2 + Sleef only when told to; every x86 cluster node since
    # 2013 has AVX2. (ATen itself compiles each kernel three times and picks one at run time.)
    cxx_flags += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
sources = ["csrc/gelu.cpp", "csrc/autograd.cpp"]
extension, extra = CppExtension, {"cxx": cxx_flags}
if with_cuda:
    sources.append("csrc/cuda/gelu.cu")
    extension = CUDAExtension
    extra = {"cxx": cxx_flags + ["-DWITH_CUDA"], "nvcc": ["-O3"]}
    if "TORCH_CUDA_ARCH_LIST" not in os.environ and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "7.5;8.0;9.0+PTX"
print(f"gelu_ext: building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels"
      + (f" for {os.environ.get('TORCH_CUDA_ARCH_LIST', 'the visible GPU')}" if with_cuda else ""))

setup(
    name="gelu_ext",
    version="1.0",
    description="GELU (tanh approximation) as a Python Function and as C++/CUDA torch ops",
    packages=["gelu_ext"],
    package_dir={"gelu_ext": "."},
    ext_modules=[extension("gelu_ext._C", sources, extra_compile_args=extra)],
    cmdclass={"build_ext": BuildExtension},
)
