"""GELU (tanh approximation) as a plain `torch.autograd.Function`: the readable reference.

The lab's first step: forward and backward written out with tensor ops, exactly as the formulas
read. The compiled op in ops.py computes the same thing in one pass over memory.
"""
import math

import torch
import torch.nn as nn

K = math.sqrt(2.0 / math.pi)
C = 0.044715


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # low precision: math in fp32
        t = torch.tanh(K * (xf + C * xf**3))
        return (0.5 * xf * (1 + t)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        t = torch.tanh(K * (xf + C * xf**3))
        dydx = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * K * (1 + 3 * C * xf * xf)
        return (grad * dydx).to(x.dtype)


def gelu_python(x):
    return GELUFunction.apply(x)


class PythonGELU(nn.Module):
    def forward(self, x):
        return GELUFunction.apply(x)
