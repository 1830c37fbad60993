"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
divergence", 2020), with `d = logp - logp_ref`: `fn(logprobs [N, T], ref_logprobs [N, T]) -> [N, T]`.
Mask and aggregate them like the policy loss."""

from __future__ import annotations

import torch

from oncurve.algo.registry import KL_ESTIMATORS, registered

# exp(20) ~ 5e8: bounds k3 so that a padding position with unrelated logprobs cannot overflow to
# inf, which a mask multiply would turn into NaN; below, a bound far enough that k3's gradient
# there is 1 to the last bit, and a reference logprob of -inf still gives a finite value.
_MAX_LOG_RATIO = 20.0
_MIN_LOG_RATIO = -1e4


@registered(KL_ESTIMATORS, "k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = d: unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


@registered(KL_ESTIMATORS, "k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = d^2 / 2: biased, low variance, >= 0."""
    return 0.5 * (logprobs - ref_logprobs).square()


@registered(KL_ESTIMATORS, "k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(-d) - (-d) - 1 = pi_ref/pi - log(pi_ref/pi) - 1: unbiased, >= 0, 0 iff equal
    (DeepSeekMath's choice). `-d` is clamped to [-1e4, 20] against overflow and infinities:
    exp(-d) goes to 0 long before the lower bound, so k3 keeps its gradient (1 - exp(-d))
    where the policy has drifted furthest above the reference."""
    log_ratio = (ref_logprobs - logprobs).clamp(_MIN_LOG_RATIO, _MAX_LOG_RATIO)
    return log_ratio.exp() - log_ratio - 1


def warmup_beta(step: int, beta: float, warmup_steps: int) -> float:
    """The KL weight of training step `step` (1-based): `beta * step / warmup_steps` until
    `warmup_steps`, then `beta`, so it ramps linearly from 0 (before step 1) the way the
    learning-rate warmup does; `warmup_steps` = 0 is `beta` at every step (DeepSeekMath's
    "scheduled warmup" of beta, arXiv 2402.03300)."""
    if step >= warmup_steps:
        return beta
    return beta * step / warmup_steps
