"""One GRPO update for the micro-benchmarks (`update_ops.py`, `update_host_time.py`), through the
package's public seams: a random model of a Qwen2 layer structure, a batch of groups that share
their prompts, the batch in a layout of the training forward, the default objective's loss
functions as training builds them, one update of a batch, counting the ops a call dispatches
(about the kernels it would launch on a GPU), and a one-op stand-in for variable-length
attention where torch has no CPU kernel for it, registered in the package's registry of such
kernels (`count_packed_as_on_cuda`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.models import qwen2_config


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


def random_model(shape: tuple[int, int, int, int, int], vocab: int, seed: int = 0) -> Any:
    """A random float32 `Qwen2ForCausalLM` of `shape` (`models.qwen2_config`) and `vocab`
    tokens, seeded with `seed`, which also seeds the batches drawn after it."""
    import transformers

    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(qwen2_config(shape, vocab))


def group_batch(prompt_lengths: torch.Tensor, group: int, lengths: torch.Tensor, vocab: int) -> Any:
    """A `TrainBatch` of `len(prompt_lengths)` groups of `group` rows: each group's prompt of
    its `prompt_lengths` random tokens (left-padded), completions of `lengths` `[rows]` random
    tokens, advantages from -1 to 1, reference logprobs -3."""
    from oncurve.types import TrainBatch

    prompt_lengths = prompt_lengths.repeat_interleave(group)
    rows, longest, width = len(prompt_lengths), int(prompt_lengths.max()), int(lengths.max())
    prompt_mask = (torch.arange(longest) >= longest - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, vocab, (rows // group, longest)).repeat_interleave(group, 0)
    completion_mask = (torch.arange(width) < lengths[:, None]).long()
    mask = torch.cat([prompt_mask, completion_mask], 1)
    ids = torch.cat([prompts, torch.randint(3, vocab, (rows, width))], 1) * mask
    return TrainBatch(
        ids,
        mask,
        completion_mask,
        torch.linspace(-1.0, 1.0, rows),
        ref_logprobs=torch.full((rows, width), -3.0) * completion_mask,
        prompt_index=torch.arange(rows) // group,
    )


def in_layout(model: Any, batch: Any, packed: bool, shared: bool) -> Any:
    """`batch` as the training forward of a layout takes it: each group's prompt once
    (`shared`) or every row whole. With `packed`, `model`'s attention is switched to packed
    rows' for good: a caller runs its padded layouts first."""
    from oncurve.model.packed_attention import use_packed_attention

    if packed:
        use_packed_attention(model)
    return dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)


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
