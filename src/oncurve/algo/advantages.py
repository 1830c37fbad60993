"""Advantage estimators: group-relative (GRPO), leave-one-out (RLOO) and GAE (PPO with a critic).

Group estimators share one signature, `fn(rewards [B*G], group_size, *, scale, eps, batch_std)`,
where the G completions of a prompt are contiguous rows. A NaN reward (a reward function that
returned None) is left out of its group's statistics and gets advantage 0; so does every reward
of a group with fewer than two finite rewards or with all finite rewards equal (exactly 0, not
a tiny number from rounding in the mean).
"""

from __future__ import annotations

import torch

from oncurve.algo.registry import ADVANTAGE_ESTIMATORS, registered

SCALES = ("group", "batch", "none")


def _centred(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    """Per-group statistics over finite rewards.

    Returns `[B, G]` float rewards, `[B, G]` deviations r - group mean (0 where the reward is NaN
    or the group carries no signal), `[B, G]` finite mask, `[B, 1]` finite counts and `[B, 1]`
    population std.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    r = rewards.view(-1, group_size)
    r = r if r.is_floating_point() else r.float()
    finite = torch.isfinite(r)
    count = finite.sum(1, keepdim=True)
    mean = torch.where(finite, r, 0).sum(1, keepdim=True) / count.clamp(min=1)
    spread = torch.where(finite, r, -torch.inf).amax(1, keepdim=True) - torch.where(
        finite, r, torch.inf
    ).amin(1, keepdim=True)
    live = finite & (count > 1) & (spread > 0)
    dev = torch.where(live, r - mean, 0)
    std = (dev.square().sum(1, keepdim=True) / count.clamp(min=1)).sqrt()
    return r, dev, finite, count, std


def _scaled(
    adv: torch.Tensor,
    rewards: torch.Tensor,
    finite: torch.Tensor,
    std: torch.Tensor,
    scale: str,
    eps: float,
    batch_std: torch.Tensor | None,
) -> torch.Tensor:
    if scale == "none":
        return adv
    if scale == "group":
        return adv / (std + eps)
    if scale == "batch":
        if batch_std is None:
            batch_std = (
                rewards[finite].std(unbiased=False) if finite.any() else rewards.new_zeros(())
            )
        return adv / (batch_std + eps)
    raise ValueError(f"advantage scale must be one of {', '.join(SCALES)}, got {scale!r}")


@registered(ADVANTAGE_ESTIMATORS, "grpo")
def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale: str = "group",
    eps: float = 1e-6,
    *,
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO advantages: each reward minus its group's mean, optionally divided by a std.

    With `mu_g`, `sigma_g` the mean and POPULATION std (unbiased=False, divide by the count) of
    the finite rewards of group g:
      - `scale="group"`: `A = (r - mu_g) / (sigma_g + eps)` (DeepSeekMath GRPO);
      - `scale="batch"`: `A = (r - mu_g) / (sigma + eps)`, sigma the population std of all finite
        rewards of the batch, or `batch_std` when given (a std reduced across ranks);
      - `scale="none"`: `A = r - mu_g` (Dr.GRPO).
    Example: one group of 6 x 1.0 and 4 x 0.0 has mu 0.6, sigma 0.49, A = +0.82 / -1.22.

    Args:
        rewards: `[B*G]`, NaN where the reward is missing.
        group_size: G.
    Returns:
        `[B*G]` advantages; 0 for NaN rewards and for groups without signal (see module doc).
    """
    r, dev, finite, _, std = _centred(rewards, group_size)
    return _scaled(dev, r, finite, std, scale, eps, batch_std).view(-1)


@registered(ADVANTAGE_ESTIMATORS, "rloo")
def rloo_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scale: str = "none",
    eps: float = 1e-6,
    *,
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): `A_i = r_i - mean_{j != i} r_j`.

    Over the k finite rewards of a group this equals `k / (k - 1) * (r_i - mu_g)`. `scale` divides
    by the same std as in `group_advantages` (so `scale` means the same for every estimator);
    `scale="none"` is plain RLOO. NaN rewards are left out of the baseline and get 0.

    Args:
        rewards: `[B*G]`, NaN where the reward is missing.
        group_size: G.
    Returns:
        `[B*G]` advantages.
    """
    r, dev, finite, count, std = _centred(rewards, group_size)
    adv = dev * count / (count - 1).clamp(min=1)
    return _scaled(adv, r, finite, std, scale, eps, batch_std).view(-1)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) over completion tokens.

    `delta_t = r_t + gamma * V_{t'} - V_t`, `A_t = delta_t + gamma * lam * A_{t'}`, where t' is the
    next position with mask 1 (V and A are 0 past the last one: the episode ends there). Masked
    positions are skipped, not treated as terminal, so holes in the mask are allowed.

    Args:
        token_rewards: `[N, T]` per-token rewards (typically the score on the last token).
        values: `[N, T]` critic values V_t.
        mask: `[N, T]` 1 on completion tokens.
    Returns:
        (`[N, T]` advantages, `[N, T]` returns `A + V`), both 0 at masked positions; no gradient.
    """
    with torch.no_grad():
        m = mask.to(values.dtype)
        next_value = values.new_zeros(values.shape[0])
        next_adv = values.new_zeros(values.shape[0])
        adv = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            a_t = delta + gamma * lam * next_adv
            adv[:, t] = a_t * m[:, t]
            next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
            next_adv = torch.where(m[:, t] > 0, a_t, next_adv)
        return adv, (adv + values) * m


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range: float
) -> torch.Tensor:
    """PPO2 clipped value loss: `0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`.

    Args: `[N, T]` values, old values (from rollout time) and returns. Returns `[N, T]` loss.
    """
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return 0.5 * torch.maximum((values - returns).square(), (clipped - returns).square())
