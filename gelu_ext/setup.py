"""Build gelu_ext._C: the C++ CPU kernels, plus the CUDA kernels wherever nvcc is found (a login node too;
GELU_EXT_CPU_ONLY=1 skips them). From the repository root, `pip install --no-build-isolation -e ./gelu_ext`:
against the torch already installed, never a second download. Options: gelu_ext/README.md."""
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

# torch takes CUDA_HOME as the folder above the nvcc on PATH, wrong where that nvcc is a wrapper script
# (/usr/local/bin/nvcc on the course machines): the first candidate with the CUDA headers, set before torch reads it.
if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
    on_path = shutil.which("nvcc")
    for home in ([Path(on_path).resolve().parents[1]] if on_path else []) + [Path("/usr/local/cuda")]:
        if (home / "include" / "cuda_runtime.h").exists() and (home / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(home)
            break

try:
    import torch
except ImportError:
    sys.exit("gelu_ext: torch is not importable here; build with pip install --no-build-isolation -e ./gelu_ext")
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

nvcc = Path(CUDA_HOME) / "bin" / "nvcc" if CUDA_HOME else None
# A CPU build of torch (torch.version.cuda None) cannot load CUDA kernels: build CPU-only there.
with_cuda = (os.environ.get("GELU_EXT_CPU_ONLY", "0") != "1" and torch.version.cuda is not None
             and nvcc is not None and nvcc.exists())
# -fopenmp: ATen's inline at::parallel_for is one thread without it (the runtime is torch's libgomp). AVX2:
# ATen's Vectorized<float> is SIMD only when told to; every x86 cluster node since 2013 has it.
cxx_flags = ["-O3", "-fopenmp"]
if platform.machine() in ("x86_64", "AMD64"):
    cxx_flags += ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
sources = ["csrc/gelu.cpp"]
extension, extra = CppExtension, {"cxx": cxx_flags}
if with_cuda:  # torch's own check of nvcc's CUDA major fails with a traceback deep in the build: say it first
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    version = re.search(r"release (\d+\.\d+)", out)  # "Cuda compilation tools, release 13.0, V13.0.88"
    if version and version[1].split(".")[0] != torch.version.cuda.split(".")[0]:
        sys.exit(f"gelu_ext: {nvcc} is CUDA {version[1]} but torch {torch.__version__} was built with CUDA "
                 f"{torch.version.cuda}: load the CUDA module that matches torch (e.g. module load "
                 f"cuda/{torch.version.cuda}) and build again, or build without the CUDA kernels: "
                 f"GELU_EXT_CPU_ONLY=1 pip install --no-build-isolation -e ./gelu_ext")
    sources.append("csrc/cuda/gelu.cu")
    extension, extra = CUDAExtension, {"cxx": cxx_flags + ["-DWITH_CUDA"], "nvcc": ["-O3"]}
    if "TORCH_CUDA_ARCH_LIST" not in os.environ and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "7.5;8.0;9.0+PTX"  # a login node: 2080Ti, A100, H100/H200
print(f"gelu_ext: building {'CPU + CUDA' if with_cuda else 'CPU-only'} kernels"
      + (f" for {os.environ.get('TORCH_CUDA_ARCH_LIST', 'the visible GPU')}" if with_cuda else ""))

setup(name="gelu_ext", version="1.0", packages=["gelu_ext"], package_dir={"gelu_ext": "."},
      description="GELU (tanh approximation) as a Python Function and as C++/CUDA torch ops",
      ext_modules=[extension("gelu_ext._C", sources, extra_compile_args=extra)], cmdclass={"build_ext": BuildExtension})
