"""GELU (tanh approximation) as a plain `torch.autograd.Function`, the formulas as tensor ops: the readable
reference. y = 0.5 x (1 + t) and y' = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 C x^2), with t = tanh(K (x + C x^3)).
The backward is made of differentiable tensor ops, so second derivatives (gradgradcheck) need no y''."""
import math

import torch
import torch.nn as nn

K = math.sqrt(2.0 / math.pi)
C = 0.044715


def _upcast_tanh(x):
    """(x in the precision of the math, t = tanh(u)): 16-bit inputs are computed in fp32."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return xf, torch.tanh(K * (xf + C * xf**3))


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if not x.is_floating_point():  # the compiled op's message, the dtype named as ATen does ("Long")
            name = torch.empty(0, dtype=x.dtype).type().removeprefix("torch.").removesuffix("Tensor")
            raise RuntimeError(f"gelu_ext.gelu: expected a floating-point tensor, got {name}")
        ctx.save_for_backward(x)
        xf, t = _upcast_tanh(x)
        return (0.5 * xf * (1 + t)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xf, t = _upcast_tanh(x)
        dy_dx = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * K * (1 + 3 * C * xf * xf)
        return (grad * dy_dx).to(x.dtype)


gelu_python = GELUFunction.apply


class PythonGELU(nn.Module):
    def forward(self, x):
        return GELUFunction.apply(x)
