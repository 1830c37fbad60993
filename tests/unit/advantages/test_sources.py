"""Advantage sources: `algo.estimator` picks group statistics or the critic, through one
protocol the step calls."""

from __future__ import annotations

import pytest
import torch
from helpers.models import tiny_qwen2

from oncurve.advantages.critic import Critic
from oncurve.advantages.sources import GroupAdvantages, build_advantage_source
from oncurve.config import load_config
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings


def batch_of(rows: int) -> TrainBatch:
    ids = torch.ones(rows, 3, dtype=torch.long)
    return TrainBatch(ids, torch.ones_like(ids), torch.ones(rows, 1), torch.zeros(rows))


def test_grpo_source_gives_the_worked_example_and_keeps_no_state():
    config = load_config(None, ["rollout.group_size=10"])
    source = build_advantage_source(config, tiny_qwen2(40), ForwardSettings())
    assert isinstance(source, GroupAdvantages)
    rewards = torch.tensor([1.0] * 6 + [0.0] * 4)  # mean 0.6, population std 0.49
    advantages, metrics = source.advantages(batch_of(10), rewards)
    assert advantages[:6] == pytest.approx([0.8165] * 6, abs=1e-3)
    assert advantages[6:] == pytest.approx([-1.2247] * 4, abs=1e-3)
    assert metrics == {} and source.update(batch_of(10), [torch.arange(10)]) == {}
    assert source.checkpoint_state() == ({}, {})


def test_rloo_source_is_the_leave_one_out_baseline():
    config = load_config(None, ["algo.estimator=rloo", "rollout.group_size=4"])
    source = build_advantage_source(config, tiny_qwen2(40), ForwardSettings())
    advantages, _ = source.advantages(batch_of(4), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # each row minus the mean of the other three: 1 - 1/3, 0 - 2/3
    assert advantages.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_gae_source_is_a_critic_that_checkpoints_its_value_model():
    config = load_config(None, ["algo.preset=ppo"])
    forward = ForwardSettings(microbatch_rows=3)
    source = build_advantage_source(config, tiny_qwen2(40), forward)
    assert isinstance(source, Critic) and source.forward == forward
    modules, optimizers = source.checkpoint_state()
    assert modules == {"value": source.model} and optimizers == {"value": source.optimizer}
    assert source.passes == config.algo.mu and source.kl_coef == config.algo.beta
