"""GELU (tanh approximation) as a plain `torch.autograd.Function`: the readable reference.

The lab's first step: forward and backward written out with tensor ops, exactly as the formulas
read. With u = K (x + C x^3) and t = tanh(u):

    y    = 0.5 x (1 + t)
    y'   = 0.5 (1 + t) + 0.5 x (1 - t^2) u'                 u'  = K (1 + 3 C x^2)

The backward is itself made of differentiable tensor ops, so second derivatives (a gradient
penalty, gradgradcheck) work without writing y'' down. The compiled op (ops.py, csrc/) computes
the same in one pass over memory, with its autograd in C++ (csrc/autograd.cpp, which spells y'' out).
"""
import math

import torch
import torch.nn as nn

K = math.sqrt(2.0 / math.pi)
C = 0.044715


def check_floating(x):
    """Integers are refused, with the compiled op's own message."""
    if not x.is_floating_point():
        name = torch.empty(0, dtype=x.dtype).type().removeprefix("torch.").removesuffix("Tensor")  # "Long", as ATen
        raise RuntimeError(f"gelu_ext.gelu: expected a floating-point tensor, got {name}")


def _upcast_tanh(x):
    """(x in the precision of the math, t = tanh(u)): 16-bit inputs are computed in fp32."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return xf, torch.tanh(K * (xf + C * xf**3))


def gelu_derivative(x):
    xf, t = _upcast_tanh(x)
    return 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * K * (1 + 3 * C * xf * xf)


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        check_floating(x)
        ctx.save_for_backward(x)
        xf, t = _upcast_tanh(x)
        return (0.5 * xf * (1 + t)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return (grad * gelu_derivative(x)).to(x.dtype)


def gelu_python(x):
    return GELUFunction.apply(x)


class PythonGELU(nn.Module):
    def forward(self, x):
        return GELUFunction.apply(x)
