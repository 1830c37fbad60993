"""Correcting for a sampler whose logprobs differ from the training forward's.

When the sampler's kernels are not the training forward's (a CUDA-graph bfloat16 decode against
the eager forward), the tokens were drawn from pi_sampler while the loss's ratio is taken
against pi_old, the training forward's logprobs of the same weights. Truncated importance
sampling (TIS; Yao et al., "Your efficient RL framework secretly brings you off-policy RL
training", 2025, as in TRL and verl) weights each token's policy loss by
`min(pi_old / pi_sampler, cap)`: the importance weight of the sampled token, truncated so that a
token the sampler found much less likely than the trainer does cannot dominate the update.
"""

from __future__ import annotations

import torch


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


def tis_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance-sampling weights `min(exp(old - sampler), cap)` of each token.

    With equal logprobs every weight is exactly 1 (`exp(0)`). A gap so large that `exp`
    overflows gives the cap, not inf.

    Args:
        old_logprobs: `[N, T]` pi_old, the training forward's logprobs of the sampled tokens.
        sampler_logprobs: `[N, T]` pi_sampler, the sampler's logprobs of its own tokens.
        mask: `[N, T]` 1 on completion tokens, 0 on padding.
        cap: the truncation, > 0 (1 or more in practice: a cap below 1 scales every token down).
    Returns:
        (`[N, T]` detached weights, 1 where `mask` is 0; metrics over masked tokens as detached
        scalar tensors: `tis/capped_frac`, the fraction whose ratio exceeded the cap (was
        truncated), and `logprob_diff/mean`, the mean `|old - sampler|`).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    on = mask > 0
    log_ratio = torch.where(on, old_logprobs.detach() - sampler_logprobs.detach(), 0.0)
    ratio = log_ratio.exp()  # inf past float range: then > cap, and min() gives the cap
    weights = torch.where(on, ratio.clamp(max=cap), 1.0)
    count = on.sum().clamp(min=1)
    return weights, {
        "tis/capped_frac": ((ratio > cap) & on).sum() / count,
        "logprob_diff/mean": logprob_diff_mean(old_logprobs, sampler_logprobs, mask),
    }
