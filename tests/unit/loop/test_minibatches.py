"""`algo.minibatches` through the trainer: exactly m optimizer steps a pass, each on the groups
the split assigns it, equal to hand-assembled updates, and the same on 1 and 2 ranks; more
minibatches than groups per rank refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.configs import make_config
from helpers.rank_pool import on_ranks
from helpers.scripted import scripted_session

from oncurve import distributed
from oncurve.algo import group_advantages, ppo_clip, seq_mean_token_mean
from oncurve.algo.logprobs import logprobs_from_logits
from oncurve.errors import UserError
from oncurve.loop.trainer import setup
from oncurve.loop.training_step import minibatch_groups, rollout_metrics, training_step
from oncurve.types import RolloutBatch


def test_the_split_gives_m_nearly_equal_minibatches_of_the_global_batch_for_any_ranks():
    for groups, m in [(5, 4), (8, 3), (16, 16), (6, 4)]:
        parts = minibatch_groups(groups, m, rank=0)
        sizes = sorted(len(p) for p in parts)
        assert len(parts) == m and sizes[-1] - sizes[0] <= 1 and sum(sizes) == groups
        assert sorted(torch.cat(parts).tolist()) == list(range(groups))
    # global group i -> minibatch i mod m, whichever rank holds it
    for total, world_size, m in [(8, 1, 4), (8, 2, 4), (12, 2, 4), (12, 3, 2), (16, 4, 3)]:
        share = total // world_size
        merged: list[list[int]] = [[] for _ in range(m)]
        for rank in range(world_size):
            for k, part in enumerate(minibatch_groups(share, m, rank)):
                merged[k] += (part + rank * share).tolist()
        assert merged == [list(range(k, total, m)) for k in range(m)]
    # a rank short of groups (dynamic sampling): one group a step, as every rank holds as many
    assert [p.tolist() for p in minibatch_groups(2, 4, rank=1)] == [[0], [1]]


def hand_assembled_minibatch(
    model: torch.nn.Module, old: torch.nn.Module, rollout: RolloutBatch, groups: list[int]
) -> dict[str, torch.Tensor]:
    """The gradients of one GRPO optimizer step for `model` on `groups` of `rollout` (groups of
    4, 8 new tokens, count_digits rewards, group z-score over each whole group), pi_old from
    `old`, ppo_clip, seq-mean-token-mean over the minibatch's rows, no KL."""
    from helpers.rewards_for_tests import count_digits

    rewards = torch.tensor(count_digits(None, rollout.texts))
    advantages = group_advantages(rewards, 4, scale="group", eps=1e-6)
    rows = [g * 4 + k for g in groups for k in range(4)]
    ids, attention = rollout.input_ids[rows], rollout.attention_mask[rows]
    mask = rollout.completion_mask[rows].float()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    t = mask.shape[1]

    def logprobs(net: torch.nn.Module) -> torch.Tensor:
        logits = net(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        return logprobs_from_logits(logits[:, -t - 1 : -1], ids[:, -t:])

    with torch.no_grad():
        old_logprobs = logprobs(old)
    logp = logprobs(model)
    per_token, _ = ppo_clip(
        logp, old_logprobs, advantages[rows, None].expand_as(logp), mask, eps_low=0.2, eps_high=0.2
    )
    loss = seq_mean_token_mean(
        per_token, mask, num_seqs=len(rows), num_tokens=float(mask.sum()), norm_len=8.0
    )
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_three_minibatches_equal_the_hand_assembled_sequence_of_updates(
    tiny_model_dir, data_file, tmp_path
):
    """4 groups, m = 3: steps on groups {0, 3}, {1}, {2}, each from the weights the previous
    step left, all with pi_old from the start of the pass."""
    config = make_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.minibatches=3",
        "algo.beta=0.0",
        "optim.grad_clip=0",
    )
    s = setup(config)
    initial = copy.deepcopy(s.policy.model)
    captured: dict = {"steps": []}
    generate = s.sampler.generate_ids

    def capture_rollout(*args, **kwargs) -> RolloutBatch:
        captured["rollout"] = generate(*args, **kwargs)
        return captured["rollout"]

    def capture_step(*_) -> None:
        weights = {n: v.clone() for n, v in s.policy.model.state_dict().items()}
        grads = {n: p.grad.clone() for n, p in s.policy.model.named_parameters()}
        captured["steps"].append((weights, grads))

    s.sampler.generate_ids = capture_rollout
    s.optimizer.register_step_pre_hook(capture_step)
    training_step(s, 1)
    assert len(captured["steps"]) == 3
    for groups, (weights, grads) in zip([[0, 3], [1], [2]], captured["steps"], strict=True):
        model = copy.deepcopy(initial)
        model.load_state_dict(weights)
        expected = hand_assembled_minibatch(model, initial, captured["rollout"], groups)
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    moved = captured["steps"][-1][0]
    assert any(not torch.equal(moved[n], v) for n, v in initial.state_dict().items())


def sgd_minibatch_step(model_dir: Path, data_file: Path, run_dir: Path, *extra: str) -> dict:
    """One training step, 2 minibatches of 4 scripted groups (the same completions on any rank),
    with SGD in place of AdamW so that rounding-level differences stay that small (Adam's first
    step is ~lr * sign(grad)); the gradients of each optimizer step and the final weights."""
    config = make_config(
        model_dir,
        data_file,
        run_dir,
        "rollout.group_size=2",
        "algo.minibatches=2",
        "algo.beta=0.0",
        "optim.grad_clip=0",
        *extra,
    )
    s = scripted_session(config)
    s.optimizer = torch.optim.SGD(
        [p for p in s.policy.model.parameters() if p.requires_grad], lr=0.5
    )
    s.scheduler = torch.optim.lr_scheduler.LambdaLR(s.optimizer, lambda _: 1.0)
    grads: list[dict[str, torch.Tensor]] = []
    s.optimizer.register_step_pre_hook(
        lambda *_: grads.append({n: p.grad.clone() for n, p in s.policy.model.named_parameters()})
    )
    training_step(s, 1)
    weights = {n: v.detach().clone() for n, v in s.policy.model.state_dict().items()}
    return {"grads": grads, "weights": weights}


def test_minibatches_on_two_ranks_equal_one_process(tiny_model_dir, data_file, tmp_path, two_ranks):
    one = sgd_minibatch_step(tiny_model_dir, data_file, tmp_path / "one")
    two = on_ranks(
        two_ranks,
        sgd_minibatch_step,
        tiny_model_dir,
        data_file,
        tmp_path / "two",
        "run.threads=1",
    )
    initial = setup(
        make_config(tiny_model_dir, data_file, tmp_path / "init")
    ).policy.model.state_dict()
    assert max(float((one["weights"][n] - v).abs().max()) for n, v in initial.items()) > 1e-3
    for rank in two:
        assert len(rank["grads"]) == len(one["grads"]) == 2
        for mine, single in zip(rank["grads"], one["grads"], strict=True):
            for name, grad in single.items():
                torch.testing.assert_close(mine[name], grad, atol=1e-6, rtol=1e-5, msg=name)
        for name, value in one["weights"].items():
            torch.testing.assert_close(rank["weights"][name], value, atol=1e-6, rtol=0, msg=name)


def test_minibatches_above_the_groups_per_rank_are_refused(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """4 prompts on 2 ranks are 2 groups a rank: 3 minibatches would leave a rank one without
    rows, whose missing backward would hang the others' gradient all-reduce."""
    monkeypatch.setattr(distributed, "init_distributed", lambda *_: (0, 2))
    config = make_config(tiny_model_dir, data_file, tmp_path / "run", "algo.minibatches=3")
    message = (
        r"algo.minibatches must be at most data.prompts_per_step per rank \(4 / 2 = 2\), got 3"
    )
    with pytest.raises(UserError, match=message):
        setup(config)


def test_the_advantage_metric_of_a_critic_averages_the_tokens_with_a_loss():
    """A multi-turn row's observation tokens have no loss, nor any part in `adv/abs_mean`."""
    ones = torch.ones(1, 8)
    rollout = RolloutBatch(
        prompt_ids=torch.ones(1, 2, dtype=torch.long),
        prompt_mask=torch.ones(1, 2, dtype=torch.long),
        completion_ids=torch.ones(1, 8, dtype=torch.long),
        completion_mask=ones.long(),
        logprobs=torch.zeros(1, 8),
        texts=["x"],
        finish_reasons=["eos"],
        group_size=1,
        tool_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]]),
    )
    advantages = torch.tensor([[1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0, -1.0]])
    assert rollout_metrics(rollout, advantages)["adv/abs_mean"] == 1.0
