"""GELU, tanh approximation, three ways: Python autograd.Function, C++ CPU op, CUDA op.

    import gelu_ext
    y = gelu_ext.gelu(x)          # compiled op (C++ on CPU, CUDA on GPU), differentiable
    m = gelu_ext.GELU()           # nn.Module around it
    y = gelu_ext.gelu_python(x)   # the Python Function (needs no build)
"""
from .function import GELUFunction, PythonGELU, gelu_python
from .ops import BUILD_HINT, GELU, ExtensionNotBuilt, build_info, built_with_cuda, gelu, is_built

__all__ = ["GELU", "GELUFunction", "PythonGELU", "gelu", "gelu_python", "is_built", "built_with_cuda", "build_info",
           "ExtensionNotBuilt", "BUILD_HINT"]
