"""One GRPO update for the micro-benchmarks, through the package's public seams: the default
objective's loss functions as training builds them, one update of a batch, counting the ops a
call dispatches (about the kernels it would launch on a GPU), and a one-op stand-in for
variable-length attention where torch has no CPU kernel for it, registered in the package's
registry of such kernels (`count_packed_as_on_cuda`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def default_loss_fns() -> Any:
    """The `LossFns` of the default GRPO objective, as a run builds them from its config."""
    from oncurve import load_config
    from oncurve.run.setup import build_loss_fns

    return build_loss_fns(load_config(None, []))


def update_of(policy: Any, step: Any, forward: Any, fns: Any) -> Callable[[], None]:
    """A call that runs one update of the `TrainBatch` `step` with the loss functions `fns` and
    the `ForwardSettings` `forward`: every microbatch's forward and backward, gradients
    accumulated in `policy` (a `PolicyLogprobs`) and then dropped. The step's token count is
    read here, outside what a caller counts or times."""
    from oncurve.update.step import accumulate, microbatch_loss

    tokens, rows = float(step.completion_mask.sum()), float(step.num_rows)

    def loss(micro: Any, _: torch.Tensor) -> tuple:
        return microbatch_loss(
            policy, micro, fns=fns, forward=forward, num_seqs=rows, num_tokens=tokens
        )

    def update() -> None:
        accumulate(policy, step, forward, loss)
        policy.zero_grad(set_to_none=True)

    return update
