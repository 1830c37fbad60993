"""Counting the ops a call dispatches (about the kernels it would launch on a GPU), and a
one-op stand-in for variable-length attention where torch has no CPU kernel for it."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """Counts the ops dispatched inside it: all of them, and those that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


class OneOpAttention(torch.autograd.Function):
    """Stands in for torch's variable-length attention on the CPU: one op forward, three
    backward (its gradients' values are not the attention's; only the count matters)."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[override]
        ctx.shapes = (k, v)
        return q.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        k, v = ctx.shapes
        return grad.clone(), torch.zeros_like(k), torch.zeros_like(v)
