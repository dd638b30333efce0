"""The compiled op: `gelu(x)` calls torch.ops.gelu_ext.gelu_forward (C++ on CPU, CUDA on GPU).

The C++ side only defines the two ops and their kernels; what the dispatcher needs beyond that
is registered here, in Python:
  - register_fake: output shape/dtype without running a kernel, so torch.compile can trace it;
  - register_autograd: backward = gelu_backward(grad, x), so gelu() is differentiable.
"""
import torch
import torch.nn as nn

try:
    from . import _C  # loading the library registers torch.ops.gelu_ext.*
except ImportError as e:  # not built: the Python Function in function.py still works
    _C, _IMPORT_ERROR = None, e

BUILD_HINT = "gelu_ext's C++ extension is not built: run `pip install --no-build-isolation -e ./gelu_ext`"


class ExtensionNotBuilt(ImportError):
    pass


def is_built():
    return _C is not None


def built_with_cuda():
    return _C is not None and bool(_C.with_cuda)


def _require_built():
    if _C is None:
        raise ExtensionNotBuilt(f"{BUILD_HINT} ({_IMPORT_ERROR})")


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation; matches F.gelu(x, approximate="tanh")."""
    _require_built()
    return torch.ops.gelu_ext.gelu_forward.default(x)


if _C is not None:

    @torch.library.register_fake("gelu_ext::gelu_forward")
    def _(x):
        torch._check(x.is_floating_point(), lambda: f"gelu_ext.gelu: expected a floating-point tensor, got {x.dtype}")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("gelu_ext::gelu_backward")
    def _(grad, x):
        torch._check(grad.shape == x.shape, lambda: "gelu_ext.gelu_backward: grad and input shapes differ")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def _setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    def _backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.ops.gelu_ext.gelu_backward.default(grad, x)

    torch.library.register_autograd("gelu_ext::gelu_forward", _backward, setup_context=_setup_context)


class GELU(nn.Module):
    """nn.Module around the compiled op; raises ExtensionNotBuilt (with the build command) if needed."""

    def __init__(self):
        super().__init__()
        _require_built()

    def forward(self, x):
        return gelu(x)
