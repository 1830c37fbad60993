"""Step 1 of a training session captured (its metrics, rollout, batch, and the weights and
gradients of each optimizer step), and the first GRPO step assembled from `oncurve.algo`'s
functions to check it against."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from oncurve.algo import group_advantages, kl_k3, ppo_clip, seq_mean_token_mean
from oncurve.algo.logprobs import logprobs_from_logits
from oncurve.loop import training_step as loop_step
from oncurve.loop.training_step import training_step
from oncurve.types import RolloutBatch, TrainBatch


def capture_first_step(s) -> tuple[dict[str, float], RolloutBatch, dict[str, torch.Tensor]]:
    """Run step 1 of session `s`; returns its metrics, the rollout it sampled and the gradients
    the optimizer stepped with."""
    captured: dict = {}
    generate = s.sampler.generate_ids

    def capture_rollout(*args, **kwargs):
        captured["rollout"] = generate(*args, **kwargs)
        return captured["rollout"]

    def capture_grads():
        captured["grads"] = {n: p.grad.clone() for n, p in s.policy.model.named_parameters()}

    s.sampler.generate_ids = capture_rollout
    s.optimizer.register_step_pre_hook(lambda *_: capture_grads())
    metrics = training_step(s, 1)
    return metrics, captured["rollout"], captured["grads"]


def hand_assembled_grpo(
    model: torch.nn.Module, rollout: RolloutBatch, beta: float = 0.04
) -> tuple[float, dict[str, torch.Tensor]]:
    """The first GRPO step's loss and gradients for `model` (pi_old = pi_ref = model) on
    `rollout` of `make_config`'s shape (groups of 4, 8 new tokens), assembled from the algo
    functions: count_digits rewards, group z-score, ppo_clip at ratio 1, beta x k3 KL,
    seq-mean-token-mean. `model` gets the gradients; they are returned by parameter name."""
    from helpers.rewards_for_tests import count_digits

    rewards = torch.tensor(count_digits(None, rollout.texts))
    advantages = group_advantages(rewards, 4, scale="group", eps=1e-6)
    mask = rollout.completion_mask.float()
    ids, attention = rollout.input_ids, rollout.attention_mask
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    t = mask.shape[1]

    def logprobs(model):
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        return logprobs_from_logits(logits[:, -t - 1 : -1], ids[:, -t:])

    with torch.no_grad():
        ref = logprobs(model)
    logp = logprobs(model)
    per_token, _ = ppo_clip(
        logp, logp.detach(), advantages[:, None].expand_as(logp), mask, eps_low=0.2, eps_high=0.2
    )
    per_token = per_token + beta * kl_k3(logp, ref)
    loss = seq_mean_token_mean(
        per_token, mask, num_seqs=rollout.num_rows, num_tokens=float(mask.sum()), norm_len=8.0
    )
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


@dataclass
class Step:
    """What step 1 did: the rollout, the batch the update used and, per optimizer step, the
    weights its gradient was taken at, that gradient and `optimizer_step`'s statistics."""

    metrics: dict[str, float]
    rollout: RolloutBatch
    batch: TrainBatch
    weights: list[dict[str, torch.Tensor]] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    stats: list[dict[str, float]] = field(default_factory=list)


def run_first_step(s, monkeypatch) -> Step:
    seen: dict = {"weights": [], "grads": [], "stats": []}
    generate = s.sampler.generate_ids

    def capture_rollout(*args, **kwargs):
        seen["rollout"] = generate(*args, **kwargs)
        return seen["rollout"]

    def before_update(*_):  # the gradient is complete, the weights not yet stepped
        params = list(s.policy.model.named_parameters())
        seen["weights"].append({n: p.detach().clone() for n, p in params})
        seen["grads"].append({n: p.grad.clone() for n, p in params})

    real_update, real_step = loop_step.update_policy, loop_step.optimizer_step

    def update_policy(session, batch, minibatches, fns):
        seen["batch"] = batch
        return real_update(session, batch, minibatches, fns)

    def optimizer_step(*args, **kwargs):
        seen["stats"].append(real_step(*args, **kwargs))
        return seen["stats"][-1]

    s.sampler.generate_ids = capture_rollout
    s.optimizer.register_step_pre_hook(before_update)
    monkeypatch.setattr(loop_step, "update_policy", update_policy)
    monkeypatch.setattr(loop_step, "optimizer_step", optimizer_step)
    metrics = training_step(s, 1)
    return Step(
        metrics, seen["rollout"], seen["batch"], seen["weights"], seen["grads"], seen["stats"]
    )
