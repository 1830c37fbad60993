"""Numerics checks on the first batch, before step 1 (`run.preflight`).

The mistakes a GRPO trainer makes silently show up as a run that learns a little worse: a loss
normalised per microbatch instead of per step, a sampler whose logprobs are not the trainer's, a
chat template that cuts the prompt. Each check here runs the run's own code on a few of its own
prompts and compares two ways of computing one number:

- the gradient of the configured microbatching against the same rows cut into microbatches of
  half the size (accumulation must not change the update);
- the sampler's logprobs of its own samples against the training forward's;
- the prompt text against the decoded token ids that the chat template made of it.

The weights, the optimizer and every random generator of the run are left as they were: the
checks use their own sampling seed and add into the gradients only to zero them again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from oncurve.errors import TrainingError
from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs
from oncurve.update.step import LossFns, accumulate_gradients, make_gradients, releasing_gradients

PREFLIGHT_SEED = 20_251_125


@dataclass(frozen=True)
class Tolerances:
    """Largest differences the checks accept: relative, for the gradient; mean absolute, over
    completion tokens, for logprobs."""

    gradient: float
    logprob: float

    @classmethod
    def of(cls, dtype: torch.dtype) -> Tolerances:
        if dtype == torch.float32:
            return cls(gradient=1e-4, logprob=1e-4)
        # bfloat16 rounds each activation to 8 bits of mantissa, in a different order in a
        # batched forward than in one-token decode steps, and in other microbatches' shapes,
        # and accumulates gradients in bfloat16: correct setups differ by a few percent, while
        # a loss not normalised over the whole step changes the gradient by about its size
        return cls(gradient=5e-2, logprob=3e-2)


def gradient_split_gap(
    policy: torch.nn.Module,
    params: list[torch.nn.Parameter],
    batch: TrainBatch,
    fns: LossFns,
    forward: ForwardSettings,
) -> float:
    """`|g_a - g_b| / |g_a|`: the gradient of `batch` in the configured microbatches (a) against
    microbatches of half as many rows (at most half the batch) and tokens (b); the gradients
    (`params`' own, made where missing) are zeroed after. The norms are summed parameter by
    parameter, so that no float32 copy of the whole gradient is made: g_a stays in the
    parameters' own gradient tensors while b accumulates into new ones (memory the optimizer's
    states, made at its first step, take later)."""
    configured = (forward.microbatch_rows, forward.microbatch_tokens)
    rows = min(forward.microbatch_rows, batch.num_rows)
    halves = (max(1, rows // 2), forward.microbatch_tokens // 2)
    if rows == 1:
        halves = (2, 2 * forward.microbatch_tokens)  # one row cannot be halved: double instead
    make_gradients(params)
    for param in params:
        param.grad.zero_()
    first: list[torch.Tensor] = []
    for rows, tokens in (configured, halves):
        if first:
            for param in params:
                param.grad = torch.zeros_like(param)
        accumulate_gradients(
            policy,
            batch,
            fns,
            dataclasses.replace(forward, microbatch_rows=rows, microbatch_tokens=tokens),
            num_seqs=float(batch.num_rows),
            num_tokens=float(batch.completion_mask.sum()),
        )
        if not first:
            first = [param.grad for param in params]
    reference = difference = torch.zeros((), dtype=torch.float64, device=first[0].device)
    for param, grad_a in zip(params, first, strict=True):
        a, b = grad_a.float(), param.grad.float()
        reference = reference + a.square().sum(dtype=torch.float64)
        difference = difference + (a - b).square().sum(dtype=torch.float64)
        param.grad = grad_a.zero_()  # the tensors the optimizer zeroes in place, kept
    return float(difference.sqrt() / reference.sqrt().clamp(min=1e-30))


def run_preflight(
    *,
    policy: torch.nn.Module,
    sampler: Sampler,
    rows: list[dict],
    group_size: int,
    params: SamplingParams,
    fns: LossFns,
    forward: ForwardSettings,
    trainable: list[torch.nn.Parameter],
    chat_template: bool,
    dtype: torch.dtype,
) -> list[str]:
    """Run the checks on `rows` (a few prompt rows {"prompt", "prompt_ids"}); returns one line
    per check, or raises `TrainingError` naming the check that failed and by how much.

    Args:
        policy: the `PolicyLogprobs` the update runs (DDP-wrapped or not).
        sampler: the run's sampler; `params` its sampling settings (the seed is replaced).
        fns: the loss pieces, `trainable` the parameters the optimizer updates.
        forward: the run's forward settings (temperature, chunks, microbatching).
        chat_template: prompts were rendered with the tokenizer's chat template.
        dtype: the weights' dtype, which sets the tolerances.
    """
    tolerance = Tolerances.of(dtype)
    lines = []
    if chat_template:
        tokenizer = sampler.tokenizer
        for row in rows:
            decoded = tokenizer.decode(row["prompt_ids"])
            if row["prompt"] not in decoded:
                raise TrainingError(
                    f"preflight: the chat template does not reproduce the prompt {row['prompt']!r}"
                    f" (decoded: {decoded!r}); check the tokenizer's chat template"
                )
        lines.append(f"preflight: chat template keeps the prompt text ({len(rows)} prompts)")

    seeded = dataclasses.replace(params, seed=PREFLIGHT_SEED)
    rollout = sampler.generate_ids([row["prompt_ids"] for row in rows], group_size, seeded)
    mask = rollout.completion_mask.float()
    # advantages of both signs and several sizes, so that every loss term carries gradient
    signs = torch.arange(rollout.num_rows, device=mask.device) % 3 - 1.0
    batch = TrainBatch(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        completion_mask=rollout.completion_mask,
        advantages=signs * 0.5 + 0.25,
        sample_logprobs=rollout.logprobs,
        prompt_index=torch.arange(rollout.num_rows, device=mask.device) // group_size,
    )
    trained = batch_logprobs(policy, batch, forward)
    gap = ((trained - rollout.logprobs).abs() * mask).sum() / mask.sum().clamp(min=1)
    largest = float(((trained - rollout.logprobs).abs() * mask).max())
    if not float(gap) <= tolerance.logprob:  # NaN fails too
        raise TrainingError(
            f"preflight: the sampler's logprobs differ from the training forward's by "
            f"{float(gap):.2e} on average (largest {largest:.2e}; at most {tolerance.logprob:g} "
            "expected): the sampler does not sample the policy being trained"
        )
    lines.append(
        f"preflight: sampler logprobs = training forward's (mean |diff| {float(gap):.1e}, "
        f"max {largest:.1e})"
    )
    if fns.beta > 0:
        batch.ref_logprobs = trained  # the reference equals the policy before the first update
    with releasing_gradients(trainable):
        split = gradient_split_gap(policy, trainable, batch, fns, forward)
    if not split <= tolerance.gradient:  # NaN fails too
        raise TrainingError(
            f"preflight: the gradient changes by {split:.2e} (relative) when the microbatches "
            f"are halved (at most {tolerance.gradient:g} expected): the loss is not normalised "
            "over the whole step"
        )
    lines.append(f"preflight: gradient independent of microbatching (relative gap {split:.1e})")
    return lines
