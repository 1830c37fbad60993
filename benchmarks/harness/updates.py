"""One GRPO update through the package's public seams, for `update_ops.py` and
`update_host_time.py`: a random model, a batch in a layout, its microbatches' tokens, the update,
the ops a call dispatches, and a one-op stand-in for CUDA's varlen attention on the CPU."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from harness.models import qwen2_config
from oncurve import load_config
from oncurve.model.forward import PolicyLogprobs
from oncurve.model.packed_attention import VARLEN_KERNELS, use_packed_attention
from oncurve.run.setup import build_loss_fns
from oncurve.types import TrainBatch
from oncurve.update.microbatches import microbatches
from oncurve.update.step import accumulate, microbatch_loss


class OpCount(TorchDispatchMode):
    """Counts the ops dispatched inside it: all of them, and those that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))

    @classmethod
    def of(cls, fn: Callable[..., object], *args: Any) -> OpCount:
        """The count of the ops that `fn(*args)` dispatches."""
        with cls() as count:
            fn(*args)
        return count


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


def setup(shape: tuple[int, int, int, int, int], vocab: int, threads: int) -> tuple[Any, Any]:
    """A seeded random float32 Qwen2 `PolicyLogprobs` and the default `LossFns`; from here on
    torch runs `threads` threads and packed rows take CUDA's path via `OneOpAttention`."""
    torch.set_num_threads(threads)
    VARLEN_KERNELS["cpu"] = lambda q, k, v, *_: OneOpAttention.apply(q, k, v)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(qwen2_config(shape, vocab))
    return PolicyLogprobs(model), build_loss_fns(load_config(None, []))


def group_batch(prompt_lengths: torch.Tensor, group: int, lengths: torch.Tensor, vocab: int) -> Any:
    """A `TrainBatch` of groups of `group` random rows: prompts of `prompt_lengths`, completions
    of `lengths` `[rows]`, advantages from -1 to 1, reference logprobs -3."""
    prompt_lengths = prompt_lengths.repeat_interleave(group)
    rows, longest, width = len(prompt_lengths), int(prompt_lengths.max()), int(lengths.max())
    prompt_mask = (torch.arange(longest) >= longest - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, vocab, (rows // group, longest)).repeat_interleave(group, 0)
    completion_mask = (torch.arange(width) < lengths[:, None]).long()
    mask = torch.cat([prompt_mask, completion_mask], 1)
    ids = torch.cat([prompts, torch.randint(3, vocab, (rows, width))], 1) * mask
    reference = torch.full((rows, width), -3.0) * completion_mask
    advantages, index = torch.linspace(-1.0, 1.0, rows), torch.arange(rows) // group
    return TrainBatch(
        ids, mask, completion_mask, advantages, ref_logprobs=reference, prompt_index=index
    )


def in_layout(model: Any, batch: TrainBatch, packed: bool, shared: bool) -> TrainBatch:
    """`batch` in a layout: each group's prompt once (`shared`) or every row whole; `packed`
    switches `model` to packed attention for good (run padded layouts first)."""
    if packed:
        use_packed_attention(model)
    return dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)


def tokens_run(batch: TrainBatch, max_rows: int, max_tokens: int, packed: bool) -> list[int]:
    """Each microbatch's tokens as a run cuts `batch`: padded rows x longest, or packed real
    tokens with each group's prompt once."""
    cuts = [cut.lengths for cut in microbatches(batch, max_rows, max_tokens, packed)]
    if not packed:
        return [len(c.prompts) * (max(c.prompts) + max(c.completions)) for c in cuts]
    prompts = [dict(zip(c.groups, c.prompts, strict=True)) for c in cuts]  # a group's once
    return [sum(p.values()) + sum(c.completions) for p, c in zip(prompts, cuts, strict=True)]


def update_of(policy: Any, step: Any, forward: Any, fns: Any) -> Callable[[], None]:
    """A call running one update of `step` into `policy`'s gradients, then dropping them; the
    step's counts are read here, outside what a caller counts or times."""
    rows, tokens = float(step.num_rows), float(step.completion_mask.sum())
    loss = functools.partial(
        microbatch_loss, policy, fns=fns, forward=forward, num_seqs=rows, num_tokens=tokens
    )

    def update() -> None:
        accumulate(policy, step, forward, loss)
        policy.zero_grad(set_to_none=True)

    return update
