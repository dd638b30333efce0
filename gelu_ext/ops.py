"""The compiled op: `gelu(x)` calls torch.ops.gelu_ext.gelu_forward, kernels and autograd in csrc/ (no Python per
call). Here: register_fake (so torch.compile can trace it) and register_vmap (an elementwise op maps as it is)."""
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
    return _gelu_forward(x)


if _C is not None:
    _gelu_forward = torch.ops.gelu_ext.gelu_forward.default  # looked up once: gelu() is on the hot path

    @torch.library.register_fake("gelu_ext::gelu_forward")
    def _(x):
        torch._check(x.is_floating_point(), lambda: f"gelu_ext.gelu: expected a floating-point tensor, got {x.dtype}")
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("gelu_ext::gelu_backward")
    def _(grad, x):
        torch._check(grad.shape == x.shape, lambda: "gelu_ext.gelu_backward: grad and input shapes differ")
        return torch.empty_like(x, memory_format=torch.contiguous_format)


if _C is not None and hasattr(torch.library, "register_vmap"):  # torch 2.4: functorch's per-sample loop

    @torch.library.register_vmap("gelu_ext::gelu_forward")
    def _(info, in_dims, x):
        return _gelu_forward(x), in_dims[0]

    @torch.library.register_vmap("gelu_ext::gelu_backward")
    def _(info, in_dims, grad, x):
        def batch_first(t, dim):  # an unbatched argument is repeated over the batch
            return t.expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
        return torch.ops.gelu_ext.gelu_backward.default(batch_first(grad, in_dims[0]), batch_first(x, in_dims[1])), 0


class GELU(nn.Module):
    """nn.Module around the compiled op, scriptable: forward calls the registered op, which TorchScript knows."""

    def __init__(self):
        super().__init__()
        _require_built()

    def forward(self, x):
        return torch.ops.gelu_ext.gelu_forward(x)
