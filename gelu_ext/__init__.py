"""GELU (tanh): `gelu_python` (an autograd.Function, needs no build); `gelu`, `GELU` (the C++/CUDA op)."""
from .function import GELUFunction, PythonGELU, gelu_python
from .ops import BUILD_HINT, GELU, ExtensionNotBuilt, build_info, built_with_cuda, gelu, is_built

__all__ = ["GELU", "GELUFunction", "PythonGELU", "gelu", "gelu_python", "is_built", "built_with_cuda", "build_info",
           "ExtensionNotBuilt", "BUILD_HINT"]
