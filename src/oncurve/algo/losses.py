"""Per-token policy losses, one signature:

    fn(logprobs [N, T], old_logprobs [N, T], advantages [N, T], mask [N, T], *,
       eps_low, eps_high, dual_clip=None) -> (loss [N, T], metrics)

The loss is to be minimised, is 0 at masked positions and is reduced by an aggregation
(`oncurve.algo.aggregation`). Metrics are detached scalars over masked tokens:
  - `clip/low_frac`: fraction of tokens whose gradient the lower clip bound removed or capped;
  - `clip/high_frac`: the same for the upper bound (exact conditions in each loss's docstring);
  - `ratio/mean`, `ratio/min`, `ratio/max`: the importance ratio the loss used (min/max are
    +inf/-inf when the mask is empty, neutral for a min/max across microbatches);
  - `ratio/clamped_frac`: fraction of tokens whose log-ratio was clamped to +-20 before exp().
"""

from __future__ import annotations

import torch

from oncurve.algo.registry import POLICY_LOSSES, registered

# As verl: exp(20) ~ 5e8 is far past any clip range, while an unbounded exp() of a stale or
# diverged token can reach inf, make the loss non-finite and get the whole update skipped.
_MAX_LOG_RATIO = 20.0


def _log_ratio(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # 0 on padding, where the two logprobs may be unrelated and exp() could overflow.
    return torch.where(mask > 0, logprobs - old, 0.0)


def _bounded_exp(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`exp` of `[N, T]` log-ratios clamped to +-20 (no gradient beyond), and the `[N, T]`
    bool tensor of the positions that were clamped."""
    bounded = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return bounded.exp(), log_ratio.detach().abs() > _MAX_LOG_RATIO


def _metrics(
    ratio: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    clamped: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    ratio, on = ratio.detach(), mask > 0
    count = mask.sum().clamp(min=1)
    return {
        "clip/low_frac": (low & on).sum() / count,
        "clip/high_frac": (high & on).sum() / count,
        "ratio/mean": (ratio * mask).sum() / count,
        "ratio/min": torch.where(on, ratio, torch.inf).amin(),
        "ratio/max": torch.where(on, ratio, -torch.inf).amax(),
        "ratio/clamped_frac": (clamped & on).sum() / count,
    }


def _clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ratio, clamped = _bounded_exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    low = (advantages < 0) & (ratio < 1 - eps_low)
    high = (advantages > 0) & (ratio > 1 + eps_high)
    return loss * mask, _metrics(ratio, low, high, clamped, mask)


@registered(POLICY_LOSSES, "ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with clip-higher (GRPO, DAPO), per token.

    `r = exp(logp - logp_old)`, `loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`.
    With `dual_clip = c > 1` (Ye et al., 2020), for A < 0 the loss is also capped at `-c A`, so a
    huge ratio on a negative-advantage token cannot blow up the update.
    Clip fractions: low = A < 0 and r < 1 - eps_low; high = A > 0 and r > 1 + eps_high: the
    tokens whose gradient the clip zeroes (dual-clipped tokens, A < 0 and r > c, count in neither).
    `logp - logp_old` is clamped to +-20 before exp (no gradient beyond), as in verl.

    Args: `[N, T]` logprobs (with grad), old logprobs, advantages and mask.
    Returns: (`[N, T]` loss, metrics).
    """
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    return _clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, dual_clip)


@registered(POLICY_LOSSES, "gspo")
def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al., 2025), token form: the PPO clip applied to a sequence-level ratio.

    `s_i = exp(mean_t (logp - logp_old))` over the masked tokens of row i, and
    `s_it = sg(s_i) * exp(logp_t - sg(logp_t))`: its value is `s_i` at every token (clipping acts
    on whole sequences), its gradient w.r.t. `logp_t` is `s_i`. With a per-sequence advantage and
    `seq-mean-token-mean` this is the GSPO gradient `s_i A_i mean_t grad logp_t`.
    Clip fractions and dual clip as in `ppo_clip`, with `s_it` as the ratio (the GSPO paper uses
    eps around 3e-4 / 4e-4, since a sequence ratio is much closer to 1 than a token ratio).
    The sequence log-ratio, not each token's, is clamped to +-20 before exp (what overflows is
    `s_i`; clamping tokens first would change `s_i` below overflow), so a clamped sequence counts
    all its tokens in `ratio/clamped_frac`.

    Args: `[N, T]` logprobs (with grad), old logprobs, advantages and mask.
    Returns: (`[N, T]` loss, metrics).
    """
    lengths = mask.sum(1, keepdim=True).clamp(min=1)
    seq_log_ratio = _log_ratio(logprobs, old_logprobs, mask).sum(1, keepdim=True) / lengths
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    log_ratio = torch.where(mask > 0, token_log_ratio, 0.0)
    return _clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, dual_clip)


@registered(POLICY_LOSSES, "cispo")
def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stopped-gradient importance weight.

    `loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp`. Unlike PPO no token loses its
    gradient; clipping only caps its weight. Clip fractions: low = r < 1 - eps_low, high =
    r > 1 + eps_high, whatever the sign of A (the weight is capped either way).
    `dual_clip` does not apply (the weight is already bounded) and is ignored. The log-ratio is
    clamped to +-20 before exp, which keeps the ratio metrics finite.

    Args: `[N, T]` logprobs (with grad), old logprobs, advantages and mask.
    Returns: (`[N, T]` loss, metrics).
    """
    ratio, clamped = _bounded_exp(_log_ratio(logprobs, old_logprobs, mask).detach())
    weight = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -weight * advantages * logprobs
    low, high = ratio < 1 - eps_low, ratio > 1 + eps_high
    return loss * mask, _metrics(ratio, low, high, clamped, mask)
