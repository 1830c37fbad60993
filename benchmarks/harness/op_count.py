"""Counting the ops a call dispatches (about the kernels it would launch on a GPU), and a
one-op stand-in for variable-length attention where torch has no CPU kernel for it, registered
through the package's public registry of such kernels (`count_packed_as_on_cuda`)."""

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


def one_op_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object) -> torch.Tensor:
    """A `packed_attention.VarlenKernel` of one op forward and three backward."""
    return OneOpAttention.apply(q, k, v)


def count_packed_as_on_cuda() -> None:
    """Packed rows on the CPU take CUDA's path from here on, with `one_op_varlen` for its
    kernel (`packed_attention.VARLEN_KERNELS`), so their ops count as CUDA's would."""
    from oncurve.model.packed_attention import VARLEN_KERNELS

    VARLEN_KERNELS["cpu"] = one_op_varlen
