"""Pieces of a training step written out by hand, sharing nothing with `oncurve.algo` but the
reward function: rewards, group advantages, logprobs from the full logits, the aggregation and
the k3 KL, for `raw_gradient_config`'s groups."""

from __future__ import annotations

import copy

import torch

from helpers.configs import GROUP
from oncurve.types import RolloutBatch


def count_digit_rewards(rollout: RolloutBatch) -> torch.Tensor:
    from helpers.rewards_for_tests import count_digits

    return torch.tensor(count_digits(None, rollout.texts), dtype=torch.float64)


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(r_i - mean) / (population std + 1e-6) within each group."""
    out = []
    for g in range(0, len(rewards), GROUP):
        r = rewards[g : g + GROUP].tolist()
        mean = sum(r) / GROUP
        std = (sum((x - mean) ** 2 for x in r) / GROUP) ** 0.5
        out += [(x - mean) / (std + 1e-6) for x in r]
    return torch.tensor(out, dtype=torch.float32)


def forward_logprobs(
    model: torch.nn.Module, rollout: RolloutBatch, temperature: float = 1.0
) -> torch.Tensor:
    """`[N, T]` log softmax(logits / temperature) of each completion token, one plain forward
    of every row with positions counting real tokens (with grad when grad is on)."""
    ids, attention = rollout.input_ids, rollout.attention_mask
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    t = rollout.completion_mask.shape[1]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logp = torch.log_softmax(logits[:, -t - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(-1, ids[:, -t:, None]).squeeze(-1)


def model_at(initial: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = copy.deepcopy(initial)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(weights[name])
    return model


def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over rows of each row's mean over its completion tokens."""
    return ((per_token * mask).sum(1) / mask.sum(1)).mean()


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """pi_ref / pi - log(pi_ref / pi) - 1."""
    return (ref - logp).exp() - (ref - logp) - 1
