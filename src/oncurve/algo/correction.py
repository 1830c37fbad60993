"""Correcting for a sampler whose logprobs differ from the training forward's.

When the sampler's kernels are not the training forward's (a CUDA-graph bfloat16 decode against
the eager forward), the tokens were drawn from pi_sampler while the loss's ratio is taken
against pi_old, the training forward's logprobs of the same weights. A correction weights each
token's policy loss by the importance weight `pi_old / pi_sampler` of what was sampled, bounded
by a cap so that a token (or a sequence) the sampler found much less likely than the trainer
does cannot dominate the update. The four modes are TRL's (`vllm_importance_sampling_mode`,
whose default is `sequence_mask` with a cap of 3):

  - `token_truncate`: `min(ratio, cap)` per token: truncated importance sampling (TIS; Yao et
    al., "Your efficient RL framework secretly brings you off-policy RL training", 2025, as in
    verl);
  - `token_mask`: the ratio, or 0 where it exceeds the cap: masked importance sampling (MIS);
  - `sequence_truncate`, `sequence_mask`: the same with one ratio per sequence, the product of
    its tokens' ratios (`exp` of the sum of their log-ratios), given to every token of it.

Each is registered in `IS_CORRECTIONS` with one signature:

    fn(old_logprobs [N, T], sampler_logprobs [N, T], mask [N, T], *, cap)
        -> (weights [N, T], capped [N, T])

`weights` are detached and 1 where `mask` is 0; `capped` (bool) is True on the masked-in tokens
whose weight the cap set: truncated to it, or masked to 0 (so the tokens a mask mode keeps are
`mask & ~capped`); in the sequence modes, every token of such a sequence. Equal logprobs give
weights of exactly 1 (`exp(0)`) and nothing capped; a ratio past float range (`exp` overflows
to inf) exceeds any cap. The cap is > 0, 1 or more in practice: below 1 it scales every token's
loss down (truncation) or drops every token that the trainer finds likelier (masking).
"""

from __future__ import annotations

import torch

from oncurve.algo.registry import IS_CORRECTIONS, registered


def logprob_diff_mean(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean `|old - sampler|` over the positions where `mask` is 1 (0 when it is empty).

    Args: `[N, T]` pi_old's logprobs, the sampler's logprobs of the same tokens, and the mask.
    Returns: a detached scalar tensor.
    """
    on = mask > 0
    gap = torch.where(on, (old_logprobs.detach() - sampler_logprobs).abs(), 0.0)
    return gap.sum() / on.sum().clamp(min=1)


def correction_metrics(
    weights: torch.Tensor, capped: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """What a correction did, over the tokens where `mask` `[N, T]` is 1, as detached scalar
    tensors: `is/capped_frac`, the fraction of tokens whose weight the cap truncated or masked
    (`capped` `[N, T]`; in the sequence modes, the tokens of the sequences it capped), and
    `is/weight_mean`, the mean weight (`weights` `[N, T]`) the policy loss was given."""
    on = mask > 0
    count = on.sum().clamp(min=1)
    return {
        "is/capped_frac": (capped & on).sum() / count,
        "is/weight_mean": torch.where(on, weights, 0.0).sum() / count,
    }


def _log_ratios(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[N, T]` detached `old - sampler` (0 where `mask` is 0, where the two may be unrelated
    and their gap overflow) and the bool mask."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    on = mask > 0
    return torch.where(on, old_logprobs.detach() - sampler_logprobs.detach(), 0.0), on


def _per_sequence(log_ratio: torch.Tensor) -> torch.Tensor:
    """`[N, T]` each row's summed log-ratio (0 off the mask, so the sum is over its tokens) at
    every position: the log of the sequence's ratio."""
    return log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)


def _truncated(
    log_ratio: torch.Tensor, on: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = log_ratio.exp()  # inf past float range: then > cap, and min() gives the cap
    return torch.where(on, ratio.clamp(max=cap), 1.0), (ratio > cap) & on


def _masked(
    log_ratio: torch.Tensor, on: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = log_ratio.exp()
    capped = (ratio > cap) & on
    return torch.where(on, ratio.masked_fill(capped, 0.0), 1.0), capped


@registered(IS_CORRECTIONS, "token_truncate")
def token_truncate(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`min(exp(old - sampler), cap)` per token; see the module docstring for the signature."""
    log_ratio, on = _log_ratios(old_logprobs, sampler_logprobs, mask, cap)
    return _truncated(log_ratio, on, cap)


@registered(IS_CORRECTIONS, "token_mask")
def token_mask(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exp(old - sampler)` per token, 0 where it exceeds `cap`."""
    log_ratio, on = _log_ratios(old_logprobs, sampler_logprobs, mask, cap)
    return _masked(log_ratio, on, cap)


@registered(IS_CORRECTIONS, "sequence_truncate")
def sequence_truncate(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`min(exp(sum of old - sampler over the row's tokens), cap)`, given to each of them."""
    log_ratio, on = _log_ratios(old_logprobs, sampler_logprobs, mask, cap)
    return _truncated(_per_sequence(log_ratio), on, cap)


@registered(IS_CORRECTIONS, "sequence_mask")
def sequence_mask(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exp(sum of old - sampler over the row's tokens)` given to each of them, 0 for every
    token of a row whose ratio exceeds `cap`."""
    log_ratio, on = _log_ratios(old_logprobs, sampler_logprobs, mask, cap)
    return _masked(_per_sequence(log_ratio), on, cap)
