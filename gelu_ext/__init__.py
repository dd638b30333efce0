"""GELU, tanh approximation, three ways: `gelu_python` (a Python autograd.Function, needs no build) and
`gelu` / the module `GELU` (the compiled op: C++ on the CPU, CUDA on a GPU)."""
from .function import GELUFunction, PythonGELU, gelu_python
from .ops import BUILD_HINT, GELU, ExtensionNotBuilt, build_info, built_with_cuda, gelu, is_built

__all__ = ["GELU", "GELUFunction", "PythonGELU", "gelu", "gelu_python", "is_built", "built_with_cuda", "build_info",
           "ExtensionNotBuilt", "BUILD_HINT"]
