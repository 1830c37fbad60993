"""Where advantages come from: group statistics (GRPO, RLOO) or a learned critic (PPO's GAE).

The step asks its advantage source for advantages once the batch is scored (and its pi_old and
pi_ref logprobs are known), and lets it update after the policy's update. A source that learns
nothing (group statistics) updates nothing; a critic trains its value model there. A new source
is a class with the three methods of `AdvantageSource` and one line in `ADVANTAGE_SOURCES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from oncurve import distributed
from oncurve.advantages.critic import Critic, build_critic
from oncurve.algo.registry import ADVANTAGE_ESTIMATORS, lookup
from oncurve.config import Config
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings


class AdvantageSource(Protocol):
    """What the step needs from an advantage estimator that may hold state of its own."""

    def advantages(
        self, batch: TrainBatch, rewards: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`[N]` or `[N, T]` advantages of the scored `batch` from its `[N]` rewards (NaN where
        a row has none), and metrics."""
        ...

    # `update` runs a backward of its own (a critic's): the policy's gradients are freed first
    trains: ClassVar[bool]

    def update(self, batch: TrainBatch, minibatches: list[torch.Tensor]) -> dict[str, float]:
        """Learn from the batch just trained on (`minibatches`: the policy's `[rows]` split)."""
        ...

    def checkpoint_state(
        self,
    ) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
        """The modules and optimizers a checkpoint must keep for the source."""
        ...

    def adopt_settings(self, config: Config) -> None:
        """Put `config`'s optimizer settings into the source's own optimizer, after a resume
        loaded the saved ones."""
        ...


@dataclass(frozen=True)
class GroupAdvantages:
    """A registered estimator of `oncurve.algo.advantages` over each group's rewards (grpo,
    rloo); with several ranks and `scale="batch"`, the std is the whole batch's."""

    estimator: Callable[..., torch.Tensor]
    group_size: int
    scale: str
    eps: float

    def advantages(
        self, batch: TrainBatch, rewards: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        batch_std = distributed.batch_std(rewards) if distributed.world()[1] > 1 else None
        advantages = self.estimator(
            rewards, self.group_size, scale=self.scale, eps=self.eps, batch_std=batch_std
        )
        return advantages, {}

    trains: ClassVar[bool] = False

    def update(self, batch: TrainBatch, minibatches: list[torch.Tensor]) -> dict[str, float]:
        return {}

    def checkpoint_state(
        self,
    ) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
        return {}, {}

    def adopt_settings(self, config: Config) -> None:
        pass


def group_advantages(
    config: Config, model: torch.nn.Module, forward: ForwardSettings
) -> GroupAdvantages:
    algo = config.algo
    return GroupAdvantages(
        lookup(ADVANTAGE_ESTIMATORS, algo.estimator),
        config.rollout.group_size,
        algo.adv_scale,
        algo.adv_eps,
    )


def critic(config: Config, model: torch.nn.Module, forward: ForwardSettings) -> Critic:
    device_type = next(model.parameters()).device.type
    return build_critic(model, config, device_type, forward)


# `algo.estimator` -> fn(config, policy model, forward settings) -> source
# (every group estimator is read from group statistics; gae is the critic's)
ADVANTAGE_SOURCES: dict[str, Callable[..., AdvantageSource]] = {
    **dict.fromkeys(ADVANTAGE_ESTIMATORS, group_advantages),
    "gae": critic,
}


def build_advantage_source(
    config: Config, model: torch.nn.Module, forward: ForwardSettings
) -> AdvantageSource:
    """The advantage source `algo.estimator` names, for the policy `model` (before any data
    parallel wrapper: a critic copies its trunk)."""
    return lookup(ADVANTAGE_SOURCES, config.algo.estimator)(config, model, forward)
