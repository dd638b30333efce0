"""The compiled op: `gelu(x)` calls torch.ops.gelu_ext.gelu_forward, whose CPU and CUDA kernels are in csrc/. Here,
as pytorch/extension-cpp does it: register_fake (shapes, so torch.compile can trace it) and register_autograd (the
backward is the gelu_backward op, whose own backward gives second derivatives)."""
import torch
import torch.nn as nn

from .function import C, K, _upcast_tanh

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


def build_info():
    if _C is None:
        return f"gelu_ext: not built ({_IMPORT_ERROR})"
    kernels = "CPU + CUDA kernels" if built_with_cuda() else "CPU kernels only (built without nvcc)"
    return f"gelu_ext: {kernels}; torch {torch.__version__}, CUDA {torch.version.cuda}"


def _require_built():
    if _C is None:
        raise ExtensionNotBuilt(f"{BUILD_HINT} ({_IMPORT_ERROR})")


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation; matches F.gelu(x, approximate="tanh")."""
    _require_built()
    if torch.autograd.forward_ad.unpack_dual(x).tangent is not None:  # else a silent zero tangent
        raise NotImplementedError("gelu_ext.gelu has no forward-mode AD (torch.library registers no jvp for a "
                                  "custom op): use F.gelu(x, approximate='tanh')")
    return _gelu_forward(x)


def _second_derivative(x):
    """y'' = (1 - t^2) (u' + 0.5 x (u'' - 2 t u'^2)), u' = K (1 + 3 C x^2), u'' = 6 K C x (t, K, C: function.py).
    Made of tensor ops, so it is differentiable in turn; 16-bit inputs are computed in float32."""
    xf, t = _upcast_tanh(x)
    du = K * (1 + 3 * C * xf * xf)
    return (1 - t * t) * (du + 0.5 * xf * (6 * K * C * xf - 2 * t * du * du))


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _forward_backward(ctx, dy):  # of y = gelu(x): dx = dy y'(x), the gelu_backward op
    (x,) = ctx.saved_tensors
    return _gelu_backward(dy, x)


def _backward_backward(ctx, ddx):  # of dx = grad y'(x): d/dgrad = y'(x) (the op again), d/dx = grad y''(x)
    grad, x = ctx.saved_tensors
    return _gelu_backward(ddx, x), (ddx * grad * _second_derivative(x)).to(x.dtype)


if _C is not None:
    _gelu_forward = torch.ops.gelu_ext.gelu_forward.default  # looked up once: gelu() is on the hot path
    _gelu_backward = torch.ops.gelu_ext.gelu_backward.default

    # Shapes only, for torch.compile; the kernels check what a caller can get wrong.
    @torch.library.register_fake("gelu_ext::gelu_forward")
    def _(x):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("gelu_ext::gelu_backward")
    def _(grad, x):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    # Each op's backward is made of ops with a backward of their own: second derivatives (gradgradcheck).
    torch.library.register_autograd("gelu_ext::gelu_forward", _forward_backward, setup_context=_save_inputs)
    torch.library.register_autograd("gelu_ext::gelu_backward", _backward_backward, setup_context=_save_inputs)


class GELU(nn.Module):
    """nn.Module around the compiled op, scriptable: forward calls the registered op, which TorchScript knows."""

    def __init__(self):
        super().__init__()
        _require_built()

    def forward(self, x):
        return torch.ops.gelu_ext.gelu_forward(x)
