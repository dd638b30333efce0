"""The compiled op: `gelu(x)` calls torch.ops.gelu_ext.gelu_forward (C++ on CPU, CUDA on GPU).

The C++ side only defines the two ops and their kernels; what the dispatcher needs beyond that
is registered here, in Python:
  - register_fake: output shape/dtype without running a kernel, so torch.compile can trace it;
  - register_autograd: backward = gelu_backward(grad, x), so gelu() is differentiable; and
    gelu_backward's own derivative (y'' from function.py), so second derivatives are right too.
"""
import torch
import torch.nn as nn

from .function import gelu_second_derivative

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

    def _setup_context_backward(ctx, inputs, output):
        grad, x = inputs
        ctx.save_for_backward(grad, x)

    def _double_backward(ctx, grad_of_dx):
        # dx = grad * y'(x): its derivative is y'(x) for grad and grad * y''(x) for x
        grad, x = ctx.saved_tensors
        d_grad = torch.ops.gelu_ext.gelu_backward.default(grad_of_dx, x)
        d_x = (grad_of_dx * grad * gelu_second_derivative(x)).to(x.dtype)
        return d_grad, d_x

    torch.library.register_autograd("gelu_ext::gelu_backward", _double_backward,
                                    setup_context=_setup_context_backward)


class GELU(nn.Module):
    """nn.Module around the compiled op; raises ExtensionNotBuilt (with the build command) if needed."""

    def __init__(self):
        super().__init__()
        _require_built()

    def forward(self, x):
        return gelu(x)
