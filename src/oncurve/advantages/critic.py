"""PPO with a learned critic: the baseline GRPO is measured against (`algo.estimator=gae`).

The standard RLHF setup (Ouyang et al., 2022; Huang et al., "The N+ implementation details of
RLHF with PPO", 2024):
  - the critic is a second, separate copy of the policy's decoder trunk with a scalar head,
    float32, trained with its own AdamW on the clipped value loss;
  - the reward (the weighted total) is given at the last completion token; with
    `algo.kl_in_reward` (the `ppo` preset) every token also receives `-beta * kl(pi_old,
    pi_ref)` (estimator `algo.kl_estimator`, k1 in the preset), so the KL penalty is credited
    through GAE instead of being a term of the loss; otherwise the KL stays in the loss as in
    GRPO;
  - GAE over the completion tokens gives per-token advantages, whitened over the batch's tokens,
    and returns, the critic's targets.

Simplifications: the critic's learning rate is constant (no warmup or cosine schedule); the
critic is updated after the policy, over the same passes and minibatches. The two models share
nothing, so the order changes no number, and only one model's gradients exist at a time.
pi_old in the KL reward is the sampler's logprobs when mu = 1 (the trainer checks them against
its own forward: `logprob_diff/max`), the recomputed ones otherwise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import nn

from oncurve import distributed
from oncurve.algo.advantages import clipped_value_loss, gae
from oncurve.algo.registry import KL_ESTIMATORS, lookup
from oncurve.config import Config
from oncurve.model.forward import completion_hidden
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, over_microbatches
from oncurve.update.step import accumulate, host_values, masked_mean


class ValueModel(nn.Module):
    """`V(prefix)`: a deep copy of `policy.base_model` (float32) and a zero-initialised linear head.

    The zero head makes the first values exactly 0, so the first advantages are the (whitened)
    returns and no random offset enters them. Gradient checkpointing, when the policy has it,
    is copied along with the trunk.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.trunk = copy.deepcopy(policy.base_model).float()
        self.trunk.requires_grad_(True)
        weight = policy.get_output_embeddings().weight
        # skip_init: no draw from the global RNG, so adding a critic changes no other number.
        self.head = nn.utils.skip_init(
            nn.Linear, weight.shape[1], 1, device=weight.device, dtype=torch.float32
        )
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int
    ) -> torch.Tensor:
        """Values of the states before each of the last `completion_len` tokens.

        The same trunk forward as `oncurve.update.step.completion_logprobs` (real tokens
        counted in the position ids), so value t sees exactly the prefix that produced
        completion token t.

        Args:
            input_ids: `[N, P+T]` left-padded prompt followed by right-padded completion.
            attention_mask: `[N, P+T]` 1 on real tokens.
            completion_len: T.
        Returns:
            `[N, T]` float32 values; meaningless on padding (mask them).
        """
        hidden = completion_hidden(self.trunk, input_ids, attention_mask, completion_len)
        return self.head(hidden.float()).squeeze(-1)


@dataclass
class Critic:
    """PPO's advantage source (`oncurve.advantages.sources`): the value model, its optimizer and the
    PPO constants that use it.

    `model` is the bare `ValueModel` (checkpoints, no-grad forwards); `train_forward` is the
    module the update calls, the same object or its DDP / FSDP2 wrapper under data parallelism.
    `advantages` keeps the critic's targets for the `update` of the same step.
    """

    model: ValueModel
    train_forward: nn.Module
    optimizer: torch.optim.Optimizer
    gamma: float
    lam: float
    clip_range: float
    coef: float
    max_grad_norm: float
    forward: ForwardSettings = field(default_factory=ForwardSettings)
    passes: int = 1
    kl_coef: float = 0.0
    kl_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    trains: ClassVar[bool] = True
    _targets: CriticTargets | None = field(default=None, init=False, repr=False)

    def advantages(
        self, batch: TrainBatch, rewards: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`[N, T]` whitened GAE advantages of the scored `batch` (`estimate_advantages`) and
        the critic's metrics; the targets are kept for `update`."""
        advantages, self._targets, metrics = estimate_advantages(
            self, batch, rewards, kl_coef=self.kl_coef, kl_fn=self.kl_fn
        )
        return advantages, metrics

    def update(self, batch: TrainBatch, minibatches: list[torch.Tensor]) -> dict[str, float]:
        """The critic's steps on the batch `advantages` last saw, over the policy's passes and
        minibatches (`optimise_critic`)."""
        return optimise_critic(
            self, batch, self._targets, passes=self.passes, minibatches=minibatches
        )

    def checkpoint_state(self) -> tuple[dict[str, nn.Module], dict[str, torch.optim.Optimizer]]:
        """The modules and optimizers a checkpoint keeps for this source."""
        return {"value": self.model}, {"value": self.optimizer}

    def adopt_settings(self, config: Config) -> None:
        """`config`'s rate, betas and weight decay in the critic's AdamW (a constant rate)."""
        for group in self.optimizer.param_groups:
            group.update(_optimizer_settings(config))


def _optimizer_settings(config: Config) -> dict:
    """The critic's AdamW settings: `algo.value_lr` (else `optim.lr`) and the policy's betas and
    weight decay."""
    optim, algo = config.optim, config.algo
    return {
        "lr": algo.value_lr if algo.value_lr is not None else optim.lr,
        "betas": (optim.beta1, optim.beta2),
        "weight_decay": optim.weight_decay,
    }


@dataclass
class CriticTargets:
    """What the critic update needs from the rollout.

    Attributes:
        old_values: `[N, T]` values before the update (the clip's centre), 0 off `mask`.
        returns: `[N, T]` GAE returns, the regression targets, 0 off `mask`.
        mask: `[N, T]` completion tokens of rows with a finite reward.
    """

    old_values: torch.Tensor
    returns: torch.Tensor
    mask: torch.Tensor


def build_critic(
    policy: nn.Module,
    config: Config,
    device: str,
    forward: ForwardSettings | None = None,
) -> Critic:
    """A fresh critic for `policy`, with AdamW at `algo.value_lr` (default `optim.lr`), wrapped
    for data parallelism like the policy; its forwards run as `forward`'s."""
    model = ValueModel(policy)
    optim, algo = config.optim, config.algo
    optimizer = torch.optim.AdamW(
        model.parameters(),
        **_optimizer_settings(config),
        fused=True,  # as the policy's (see `trainer.setup`)
    )
    return Critic(
        model=model,
        train_forward=distributed.wrap(model, device),
        optimizer=optimizer,
        gamma=algo.gamma,
        lam=algo.lam,
        clip_range=algo.value_clip,
        coef=algo.value_coef,
        max_grad_norm=optim.grad_clip if optim.grad_clip > 0 else math.inf,
        # float32, which CUDA's variable-length flash attention does not take: rows padded
        forward=replace(forward or ForwardSettings(), pack_rows=False),
        passes=algo.mu,
        kl_coef=algo.beta if algo.kl_in_reward else 0.0,
        kl_fn=lookup(KL_ESTIMATORS, algo.kl_estimator),
    )


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[N, T]` zeros except `rewards[i]` at the last position where `mask[i]` is 1.

    Args: `[N]` rewards (finite), `[N, T]` mask. Rows with an empty mask get no reward.
    """
    on = mask > 0
    width = mask.shape[1]
    last = width - 1 - on.flip(1).int().argmax(1)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = on.any(1).nonzero().flatten()
    out[rows, last[rows]] = rewards[rows].float()
    return out


def whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-8,
    *,
    moments: tuple[float, float] | None = None,
) -> torch.Tensor:
    """`(v - mean) / sqrt(var + eps)` with the mean and POPULATION variance of the positions
    where `mask` is 1 (or `moments = (mean, var)`, e.g. reduced over ranks); 0 elsewhere.
    eps inside the root (as in TRL and OpenRLHF) keeps a spread far below sqrt(eps), such as
    rounding noise, from being blown up to unit scale.

    Args: `[N, T]` values and mask. Returns `[N, T]`.
    """
    on = mask > 0
    if moments is None:
        picked = values[on].double()
        moments = (
            (float(picked.mean()), float(picked.var(unbiased=False))) if len(picked) else (0.0, 0.0)
        )
    mean, var = moments
    return torch.where(on, (values - mean) / math.sqrt(var + eps), 0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """`1 - Var(R - V) / Var(R)` over masked positions: 1 is a perfect critic, 0 no better than
    a constant, negative worse; NaN when the returns do not vary."""
    on = mask > 0
    if not on.any():
        return float("nan")
    var_returns = returns[on].var(unbiased=False)
    if var_returns == 0:
        return float("nan")
    return float(1 - (returns[on] - values[on]).var(unbiased=False) / var_returns)


def batch_values(model: ValueModel, batch: TrainBatch, forward: ForwardSettings) -> torch.Tensor:
    """`[N, T]` values of every completion state, in the training forward's microbatches, no
    graph; 0 on padding."""

    def values(micro: TrainBatch) -> torch.Tensor:
        return model(micro.input_ids, micro.attention_mask, micro.completion_mask.shape[1])

    return over_microbatches(batch, forward, model, values)


def estimate_advantages(
    critic: Critic,
    batch: TrainBatch,
    rewards: torch.Tensor,
    *,
    kl_coef: float,
    kl_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
) -> tuple[torch.Tensor, CriticTargets, dict[str, float]]:
    """Per-token advantages and the critic's targets for a scored rollout.

    Token rewards are the reward (the weighted total) at the last completion token minus, when
    `kl_coef > 0`, `kl_coef * kl_fn(pi_old, pi_ref)` on every token (`batch.ref_logprobs` is
    then required; pi_old is `batch.old_logprobs`, or the sampler's when that is None).
    A row with a NaN reward is left out: advantage 0 and no value target.

    Args:
        critic: the value model, GAE's gamma and lambda, and the forward's microbatching.
        batch: the rollout, `[N, P+T]` ids and masks.
        rewards: `[N]` total rewards, NaN where missing.
        kl_coef: beta of the in-reward KL penalty; 0 for none.
    Returns:
        (`[N, T]` whitened advantages, targets, metrics `value/mean`, `value/explained_var`,
        `returns/mean`, and `kl` when `kl_coef > 0`).
    """
    finite = torch.isfinite(rewards)
    mask = batch.completion_mask.float() * finite[:, None]
    old_values = batch_values(critic.model, batch, critic.forward) * mask
    token_rewards = last_token_rewards(torch.where(finite, rewards, 0.0), mask)
    metrics: dict[str, float] = {}
    if kl_coef > 0:
        policy = batch.old_logprobs if batch.old_logprobs is not None else batch.sample_logprobs
        if policy is None or batch.ref_logprobs is None:
            raise ValueError("a KL penalty in the reward needs pi_old and pi_ref logprobs")
        kl = kl_fn(policy, batch.ref_logprobs) * mask
        token_rewards = token_rewards - kl_coef * kl
        metrics["kl"] = float(masked_mean(kl, mask))
    advantages, returns = gae(token_rewards, old_values, mask, critic.gamma, critic.lam)
    metrics.update(
        {
            "value/mean": float(masked_mean(old_values, mask)),
            "value/explained_var": explained_variance(old_values, returns, mask),
            "returns/mean": float(masked_mean(returns, mask)),
        }
    )
    moments = (
        distributed.global_moments(advantages[mask > 0]) if distributed.world()[1] > 1 else None
    )
    whitened = whiten(advantages, mask, moments=moments)
    return whitened, CriticTargets(old_values, returns, mask), metrics


def optimise_critic(
    critic: Critic,
    batch: TrainBatch,
    targets: CriticTargets,
    *,
    passes: int,
    minibatches: list[torch.Tensor],
) -> dict[str, float]:
    """`passes` x len(minibatches) AdamW steps on `coef * token-mean clipped value loss`, one
    for each `minibatches` entry, the `[rows]` indices of its rows (the policy's split,
    `training_step.minibatch_groups`).

    The policy's gradient-accumulation loop (`update.step.accumulate`, the microbatches of
    `critic.forward`) serves the critic; each microbatch's loss is divided by its minibatch's
    token count (over all ranks, divided by the ranks because DDP averages gradients), so
    accumulation and data parallelism change nothing. A step whose gradient norm is not finite
    is skipped.

    Returns:
        `value/loss` (token-mean clipped loss before `coef`, averaged over the steps) and
        `value/grad_norm` (mean over the steps, before clipping).
    """
    losses, norms = [], []
    _, world_size = distributed.world()
    for _ in range(passes):
        for rows in minibatches:
            minibatch = batch.rows(rows)
            mask = targets.mask[rows]
            num_tokens = distributed.all_sum([float(mask.sum())])[0] / world_size
            value_loss = _value_loss(
                critic, targets.old_values[rows], targets.returns[rows], mask, num_tokens
            )
            done = accumulate(critic.train_forward, minibatch, critic.forward, value_loss)
            params = critic.model.parameters()
            norm = float(nn.utils.clip_grad_norm_(params, critic.max_grad_norm))
            if math.isfinite(norm):
                critic.optimizer.step()
            critic.optimizer.zero_grad(set_to_none=True)
            losses.append(sum(stats["value_loss"] for _, _, stats in host_values(done)))
            norms.append(norm)
    return {"value/loss": sum(losses) / len(losses), "value/grad_norm": sum(norms) / len(norms)}


def _value_loss(
    critic: Critic,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float,
) -> Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The microbatch loss of one minibatch for `update.step.accumulate`: `coef` times the
    clipped value loss summed over the microbatch's tokens and divided by the minibatch's
    `num_tokens`; `old_values`, `returns`, `mask` are the minibatch's `[n, T]` targets."""

    def loss(micro: TrainBatch, part: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        width = micro.completion_mask.shape[1]
        values = critic.train_forward(micro.input_ids, micro.attention_mask, width)
        per_token = clipped_value_loss(
            values, old_values[part, :width], returns[part, :width], critic.clip_range
        )
        token_mean = (per_token * mask[part, :width]).sum() / max(num_tokens, 1.0)
        return critic.coef * token_mean, {"value_loss": token_mean.detach()}

    return loss
