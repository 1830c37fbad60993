"""One optimizer step of the policy on a minibatch: forward and backward over microbatches,
gradients accumulated, clipped and applied. No I/O; the loop (`loop.training_step`) calls it."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from oncurve import distributed
from oncurve.algo.correction import correction_metrics, logprob_diff_mean
from oncurve.model.compiled_layers import CompiledLayersFailed, compiled_layers
from oncurve.types import TrainBatch
from oncurve.update.determinism import NondeterministicOp, strictly_deterministic
from oncurve.update.microbatches import (
    ForwardSettings,
    even_across_ranks,
    microbatches,
)


@dataclass(frozen=True)
class LossFns:
    """The pieces of the per-token objective, looked up by name from `oncurve.algo.registry`.

    Attributes:
        policy_loss: `fn(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high,
            dual_clip) -> ([N, T] loss, metrics)`.
        aggregate: `fn(per_token, mask, *, num_seqs, num_tokens, norm_len) -> scalar`.
        kl: `fn(logprobs, ref_logprobs) -> [N, T]`, used when beta > 0.
        is_correction: `fn(old_logprobs, sampler_logprobs, mask, *, cap) -> (weights,
            capped)` (`oncurve.algo.correction`): where the batch has the sampler's logprobs,
            each token's policy loss is weighted by its importance weight pi_old / pi_sampler,
            truncated or masked at `is_cap`; None off.
        is_cap: the correction's cap.
    """

    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    aggregate: Callable[..., torch.Tensor]
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    beta: float
    eps_low: float
    eps_high: float
    dual_clip: float | None
    norm_len: float
    is_correction: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    is_cap: float = 0.0


def accumulate(
    module: torch.nn.Module,
    minibatch: TrainBatch,
    forward: ForwardSettings,
    micro_loss: Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]]:
    """Forward and backward over `minibatch` in its `microbatches`, adding into `.grad` (zero,
    or None, when it is called): the one gradient-accumulation loop of the policy and the
    critic.

    `micro_loss(micro, index)` returns the loss of the padding-trimmed microbatch `micro`,
    whose rows are `index` `[n]` of `minibatch`, and its statistics (0-dim tensors). `module`
    is the model whose forward `micro_loss` calls; when it is DDP-wrapped, gradients are
    all-reduced in the last microbatch's backward only. Nothing is read back from the device
    here: the caller reads every microbatch's numbers at once (`host_values`). A microbatch
    that meets an op with no deterministic kernel (`determinism.strictly_deterministic`) or whose
    compiled layers fail in the backward (`compiled_layers`) leaves partial gradients, so the
    loop starts again from zero gradients (the next time in warn-only mode, or eagerly).

    Returns:
        (completion tokens, detached loss, statistics) of each microbatch, in order.
    """
    real = microbatches(
        minibatch,
        forward.microbatch_rows,
        forward.microbatch_tokens,
        forward.pack_rows,
        forward.share_prompt,
    )
    parts = even_across_ranks(real, module)

    for last_try in (False, True):
        done = []
        try:
            for i, part in enumerate(parts):
                micro = part.of(minibatch)
                defer_sync = i < len(parts) - 1 and hasattr(module, "no_sync")
                with (
                    module.no_sync() if defer_sync else contextlib.nullcontext(),
                    compiled_layers(forward.compile_layers),
                    strictly_deterministic(),
                ):
                    loss, stats = micro_loss(micro, part.index)
                    if i >= len(real):  # a stand-in: its backward joins the collectives, adds 0
                        loss = loss * 0
                    loss.backward()
                if i < len(real):
                    done.append((part.completion_tokens, loss.detach(), stats))
            return done
        except (NondeterministicOp, CompiledLayersFailed):
            if last_try:
                raise
            for param in module.parameters():
                if param.grad is not None:
                    param.grad.zero_()
    raise AssertionError("unreachable: the last try returns or raises")


def host_values(
    done: list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]],
) -> list[tuple[int, float, dict[str, float]]]:
    """`accumulate`'s results with their numbers read to the host in one transfer."""
    if not done:
        return []
    names = list(done[0][2])
    table = torch.stack(
        [torch.stack([loss.float(), *(stats[k].float() for k in names)]) for _, loss, stats in done]
    ).tolist()
    return [
        (tokens, row[0], dict(zip(names, row[1:], strict=True)))
        for (tokens, _, _), row in zip(done, table, strict=True)
    ]


def accumulate_gradients(
    policy: torch.nn.Module,
    minibatch: TrainBatch,
    fns: LossFns,
    forward: ForwardSettings,
    *,
    num_seqs: float,
    num_tokens: float,
) -> dict[str, float]:
    """The policy's forward and backward over `minibatch` (`accumulate`), adding into `.grad`.

    `policy` is a `PolicyLogprobs`, possibly wrapped by DDP. `num_seqs` and `num_tokens` are
    the counts of the whole optimizer step (every microbatch; under data parallelism, every
    rank's, divided by the number of ranks because DDP averages gradients): with them the
    aggregations make the sum of microbatch losses equal the loss of one big batch, so gradient
    accumulation and data parallelism change nothing.
    When `minibatch.old_logprobs` is None (mu = 1) pi_old is the forward's own detached
    logprobs: the ratio is exactly 1 and its gradient is the policy gradient.

    Returns:
        the step's loss (sum over microbatches) and token-weighted means of kl, entropy, clip
        fractions and the ratio, plus the ratio's min and max and the largest gap between pi_old
        and the sampler's logprobs (`logprob_diff/max`, the sampler/trainer health check; its
        token mean is `logprob_diff/mean`; with `fns.is_correction`, `is/capped_frac` is the
        fraction of tokens whose importance weight the cap truncated or masked and
        `is/weight_mean` the mean weight).
    """

    totals: dict[str, float] = {"loss/policy": 0.0, "logprob_diff/max": 0.0}
    weighted: dict[str, float] = {}
    ratio_min, ratio_max = float("inf"), float("-inf")
    tokens_seen = 0.0
    policy_loss = partial(
        microbatch_loss, policy, fns=fns, forward=forward, num_seqs=num_seqs, num_tokens=num_tokens
    )
    for tokens, loss, stats in host_values(accumulate(policy, minibatch, forward, policy_loss)):
        totals["loss/policy"] += loss
        totals["logprob_diff/max"] = max(totals["logprob_diff/max"], stats.pop("sampler_gap"))
        ratio_min = min(ratio_min, stats.pop("ratio/min"))
        ratio_max = max(ratio_max, stats.pop("ratio/max"))
        for key, value in stats.items():
            weighted[key] = weighted.get(key, 0.0) + value * tokens
        tokens_seen += tokens
    totals.update({key: value / max(tokens_seen, 1.0) for key, value in weighted.items()})
    totals["ratio/min"], totals["ratio/max"] = ratio_min, ratio_max
    return totals


def microbatch_loss(
    policy: torch.nn.Module,
    micro: TrainBatch,
    rows: torch.Tensor | None = None,
    *,
    fns: LossFns,
    forward: ForwardSettings,
    num_seqs: float,
    num_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The aggregated loss of one microbatch (policy term + beta * KL) and its statistics
    (0-dim tensors, left on the device): `accumulate`'s `micro_loss` with the policy, the loss
    and the step's counts bound. `rows`, the microbatch's `[n]` rows in its minibatch, is what
    `accumulate` passes every loss; the policy's targets travel in `micro` itself.

    With `fns.is_correction` and the sampler's logprobs in `micro`, each token's policy term (not
    the KL term, as in verl) is weighted by its importance weight pi_old / pi_sampler,
    truncated or masked at `fns.is_cap`.
    """
    mask = micro.completion_mask.to(torch.float32)
    logprobs, entropy = policy(
        micro.input_ids,
        micro.attention_mask,
        mask.shape[1],
        forward.temperature,
        forward.chunk_size,
        with_entropy=True,
        prompt_index=forward.prompt_index(micro),
        packed=forward.packed(micro),
        truncation=forward.truncation,
    )
    old = logprobs.detach() if micro.old_logprobs is None else micro.old_logprobs
    advantages = micro.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    per_token, stats = fns.policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        eps_low=fns.eps_low,
        eps_high=fns.eps_high,
        dual_clip=fns.dual_clip,
    )
    if micro.sample_logprobs is not None:
        stats["logprob_diff/mean"] = logprob_diff_mean(old, micro.sample_logprobs, mask)
        if fns.is_correction is not None:
            weights, capped = fns.is_correction(old, micro.sample_logprobs, mask, cap=fns.is_cap)
            per_token = per_token * weights
            stats.update(correction_metrics(weights, capped, mask))
    if fns.beta > 0:
        kl = fns.kl(logprobs, micro.ref_logprobs)
        per_token = per_token + fns.beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask)
    stats["entropy"] = masked_mean(entropy, mask)
    stats["sampler_gap"] = (
        ((old - micro.sample_logprobs).abs() * mask).max()
        if micro.sample_logprobs is not None
        else mask.new_zeros(())
    )
    loss = fns.aggregate(
        per_token, mask, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=fns.norm_len
    )
    return loss, {key: value.detach() for key, value in stats.items()}


def keeps_gradients(device: torch.device) -> bool:
    """Whether gradients stay allocated between updates on `device` (`releasing_gradients`):
    on CUDA they are freed, so that the sampler and the reference pass do not hold them (the
    caching allocator hands the same blocks back at the next update); elsewhere they are kept
    (glibc would map and zero fresh pages for them each step)."""
    return device.type != "cuda"


def make_gradients(params: list[torch.nn.Parameter]) -> None:
    """Zeros for every parameter without a gradient, made before a backward's first activation
    (made by autograd amid the activations they fragment the heap)."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


@contextlib.contextmanager
def releasing_gradients(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """An update (or the preflight's gradient check): when it ends, also by an error, the
    parameters' gradients are freed unless `keeps_gradients`."""
    try:
        yield
    finally:
        if params and not keeps_gradients(params[0].device):
            for param in params:
                param.grad = None


def optimizer_step(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    minibatch: TrainBatch,
    fns: LossFns,
    forward: ForwardSettings,
    *,
    grad_clip: float,
) -> dict[str, float]:
    """One optimizer step on `minibatch` (this rank's rows of it): accumulate gradients over
    microbatches, clip the global norm, step, zero. An update whose loss or gradient norm is
    not finite is skipped (`updates/skipped` = 1) and the weights stay as they were."""
    _, world_size = distributed.world()
    # Global counts over ranks, divided by the ranks because DDP averages gradients.
    seqs, tokens = distributed.all_sum(
        [float(minibatch.num_rows), float(minibatch.completion_mask.sum())]
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    make_gradients(params)  # where `releasing_gradients` freed them after the last update
    stats = accumulate_gradients(
        policy, minibatch, fns, forward, num_seqs=seqs / world_size, num_tokens=tokens / world_size
    )
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    # Every rank must take the same decision, or their weights drift apart.
    bad_loss = distributed.all_sum([float(not math.isfinite(stats["loss/policy"]))])[0]
    skip = bad_loss > 0 or not math.isfinite(grad_norm)
    if not skip:
        optimizer.step()
    # zeroed, not freed: the next optimizer step of the update adds into them
    # (`releasing_gradients` frees them when the update ends)
    optimizer.zero_grad(set_to_none=False)
    return {**stats, "grad_norm": grad_norm, "updates/skipped": float(skip)}


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)
