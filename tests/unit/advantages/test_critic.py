"""PPO with a critic: the value model, whitening, GAE targets, the critic update, and a short run."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from helpers.models import tiny_qwen2
from helpers.paths import REPO
from safetensors.torch import load_file

from oncurve.advantages.critic import (
    CriticTargets,
    ValueModel,
    batch_values,
    build_critic,
    estimate_advantages,
    explained_variance,
    last_token_rewards,
    optimise_critic,
    whiten,
)
from oncurve.algo import clipped_value_loss, kl_k1
from oncurve.config import load_config
from oncurve.loop.trainer import setup, train
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings

VOCAB = 40


def _random_head(vm: ValueModel, seed: int = 1) -> None:
    # The head starts at zero (every value 0); a random one makes values depend on the input.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vm.head.weight.copy_(torch.randn(vm.head.weight.shape, generator=generator))
        vm.head.bias.fill_(0.3)


def _rollout(seed: int = 0) -> TrainBatch:
    """4 rows: prompts of 3, 5, 2, 5 tokens left-padded to 5, completions of 4, 2, 6, 1 tokens
    right-padded to 6."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lens, completion_lens = [3, 5, 2, 5], [4, 2, 6, 1]
    prompt_mask = torch.tensor([[0] * (5 - n) + [1] * n for n in prompt_lens])
    completion_mask = torch.tensor([[1] * n + [0] * (6 - n) for n in completion_lens])
    mask = torch.cat([prompt_mask, completion_mask], 1)
    ids = torch.randint(3, VOCAB, mask.shape, generator=generator) * mask
    return TrainBatch(
        input_ids=ids,
        attention_mask=mask,
        completion_mask=completion_mask,
        advantages=torch.zeros(4),
    )


@pytest.fixture
def policy() -> torch.nn.Module:
    return tiny_qwen2(VOCAB)


def test_value_model_is_a_separate_float32_copy_with_zero_initial_values(policy):
    vm = ValueModel(policy)
    batch = _rollout()
    values = vm(batch.input_ids, batch.attention_mask, 6)
    assert values.shape == (4, 6) and values.dtype == torch.float32
    assert torch.equal(values, torch.zeros(4, 6))
    policy_storage = {p.data_ptr() for p in policy.parameters()}
    assert not policy_storage & {p.data_ptr() for p in vm.parameters()}
    assert all(p.requires_grad for p in vm.parameters())
    trunk = sum(p.numel() for p in policy.base_model.parameters())
    assert sum(p.numel() for p in vm.parameters()) == trunk + 32 + 1


def test_values_depend_only_on_the_prefix_and_not_on_left_padding(policy):
    vm = ValueModel(policy)
    _random_head(vm)
    batch = _rollout()
    with torch.no_grad():
        values = vm(batch.input_ids, batch.attention_mask, 6)
        changed = batch.input_ids.clone()
        changed[2, 5 + 3] = (changed[2, 5 + 3] + 1) % VOCAB  # completion token 3 of row 2
        after = vm(changed, batch.attention_mask, 6)
        # Row 0 alone, without the 2 columns of left padding it has in the batch.
        alone = vm(batch.input_ids[:1, 2:], batch.attention_mask[:1, 2:], 6)
    # Value t is V(state before token t): tokens 0..3 see the same prefix, 4 and 5 do not.
    torch.testing.assert_close(after[2, :4], values[2, :4], atol=1e-6, rtol=0)
    assert (after[2, 4:] - values[2, 4:]).abs().min() > 1e-4
    torch.testing.assert_close(after[[0, 1, 3]], values[[0, 1, 3]], atol=1e-6, rtol=0)
    torch.testing.assert_close(alone[0, :4], values[0, :4], atol=1e-5, rtol=1e-5)


def test_batch_values_in_chunks_equal_one_forward_and_are_zero_on_padding(policy):
    vm = ValueModel(policy)
    _random_head(vm)
    batch = _rollout()
    chunked = batch_values(vm, batch, ForwardSettings(microbatch_rows=3))
    with torch.no_grad():
        full = vm(batch.input_ids, batch.attention_mask, 6) * batch.completion_mask
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    assert torch.equal(chunked[3, 1:], torch.zeros(5))


def test_whiten_uses_masked_population_moments():
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # Masked values 1, 2, 3, 4: mean 2.5, population variance 1.25.
    expected = torch.tensor([[-1.5, -0.5, 0.5, 0.0], [1.5, 0.0, 0.0, 0.0]]) / (1.25 + 1e-8) ** 0.5
    torch.testing.assert_close(whiten(values, mask), expected, atol=1e-7, rtol=0)
    constant = torch.full((2, 4), 0.5)
    assert torch.equal(whiten(constant, mask), torch.zeros(2, 4))
    shifted = whiten(values, mask, moments=(2.0, 4.0))
    torch.testing.assert_close(shifted[0, :3], torch.tensor([-0.5, 0.0, 0.5]), atol=1e-7, rtol=0)


def test_reward_goes_on_the_last_completion_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    out = last_token_rewards(torch.tensor([1.0, -2.0, 5.0, 0.5]), mask)
    expected = torch.tensor(
        [[0, 0, 1.0, 0], [-2.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0.5]], dtype=torch.float32
    )
    assert torch.equal(out, expected)


def test_explained_variance_hand_case():
    returns = torch.tensor([[1.0, 3.0, 7.0]])
    values = torch.tensor([[1.0, 2.0, 0.0]])
    # Var(R) over the two masked = 1; R - V = 0, 1 -> variance 0.25.
    assert explained_variance(values, returns, torch.tensor([[1, 1, 0]])) == pytest.approx(0.75)
    assert math.isnan(explained_variance(values, torch.ones(1, 3), torch.ones(1, 3)))


def _critic(policy, *extra: str, rows: int = 4):
    config = load_config(None, ["algo.preset=ppo", "algo.gamma=1.0", "algo.lam=1.0", *extra])
    return build_critic(policy, config, "cpu", ForwardSettings(microbatch_rows=rows))


def test_gamma_one_lambda_one_gives_return_minus_value(policy):
    critic = _critic(policy)
    _random_head(critic.model)
    batch = _rollout()
    rewards = torch.tensor([1.0, 0.0, 2.0, float("nan")])
    advantages, targets, metrics = estimate_advantages(
        critic, batch, rewards, kl_coef=0.0, kl_fn=kl_k1
    )
    values = batch_values(critic.model, batch, critic.forward)
    mask = batch.completion_mask.float() * torch.tensor([1.0, 1.0, 1.0, 0.0])[:, None]
    # No discount, no KL: every token's return is its row's reward, A_t = R - V_t.
    returns = rewards.nan_to_num(0.0)[:, None] * mask
    torch.testing.assert_close(targets.returns, returns, atol=1e-6, rtol=0)
    torch.testing.assert_close(targets.old_values, values * mask, atol=1e-6, rtol=0)
    assert torch.equal(targets.mask, mask)
    raw = (returns - values) * mask
    on = mask > 0
    mean, var = raw[on].mean(), raw[on].var(unbiased=False)
    torch.testing.assert_close(advantages, (raw - mean) / (var + 1e-8).sqrt() * mask)
    assert torch.equal(advantages[3], torch.zeros(6))  # the NaN reward's row is left out
    assert metrics["value/mean"] == pytest.approx(float(values[on].mean()), abs=1e-6)
    assert "kl" not in metrics


def test_kl_in_the_reward_is_summed_from_each_token_to_the_end(policy):
    critic = _critic(policy)  # zero head: values 0, so returns are the raw advantages
    batch = _rollout()
    batch.sample_logprobs = -torch.rand(4, 6, generator=torch.Generator().manual_seed(3))
    batch.ref_logprobs = batch.sample_logprobs - 0.1 * torch.arange(6.0)
    batch.sample_logprobs *= batch.completion_mask
    batch.ref_logprobs *= batch.completion_mask
    rewards = torch.tensor([1.0, 0.0, 2.0, 3.0])
    _, targets, metrics = estimate_advantages(critic, batch, rewards, kl_coef=0.5, kl_fn=kl_k1)
    # Row 0 has 4 tokens with k1 = 0, .1, .2, .3: R_t = 1 - 0.5 * sum_{s >= t} k1_s.
    expected = torch.tensor([1 - 0.5 * 0.6, 1 - 0.5 * 0.6, 1 - 0.5 * 0.5, 1 - 0.5 * 0.3])
    torch.testing.assert_close(targets.returns[0, :4], expected, atol=1e-6, rtol=0)
    assert targets.returns[2, 5] == pytest.approx(2 - 0.5 * 0.5, abs=1e-6)
    # Mean k1 over the 13 tokens: rows of 4, 2, 6 and 1 tokens.
    assert metrics["kl"] == pytest.approx((0.6 + 0.1 + 1.5 + 0.0) / 13, abs=1e-6)


def _fixed_targets(critic, batch) -> CriticTargets:
    mask = batch.completion_mask.float()
    returns = torch.tensor([1.0, -1.0, 0.5, 2.0])[:, None] * mask
    old = batch_values(critic.model, batch, critic.forward)
    return CriticTargets(old_values=old, returns=returns, mask=mask)


ALL_ROWS = [torch.arange(4)]
HALVES = [torch.tensor([0, 1]), torch.tensor([2, 3])]


def test_critic_steps_lower_the_value_loss(policy):
    critic = _critic(policy, "algo.value_lr=3e-3", "algo.value_clip=100.0")
    batch = _rollout()
    targets = _fixed_targets(critic, batch)
    losses = [
        optimise_critic(critic, batch, targets, passes=1, minibatches=ALL_ROWS)["value/loss"]
        for _ in range(6)
    ]
    # The first loss is at V = 0: 0.5 * mean R^2 over the 13 tokens.
    assert losses[0] == pytest.approx(0.5 * (4 * 1 + 2 * 1 + 6 * 0.25 + 1 * 4) / 13, abs=1e-6)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False))
    assert losses[-1] < 0.5 * losses[0]


def test_value_clip_holds_the_loss_at_the_clipped_bound(policy):
    critic = _critic(policy, "algo.value_lr=3e-3", "algo.value_clip=0.01")
    batch = _rollout()
    targets = _fixed_targets(critic, batch)
    for _ in range(4):
        stats = optimise_critic(critic, batch, targets, passes=1, minibatches=ALL_ROWS)
    values = batch_values(critic.model, batch, critic.forward)
    per_token = clipped_value_loss(values, targets.old_values, targets.returns, 0.01)
    floor = clipped_value_loss(
        targets.old_values + 0.01 * targets.returns.sign(), targets.old_values, targets.returns, 1
    )
    mask = targets.mask
    assert (per_token * mask).sum() >= (floor * mask).sum() - 1e-6
    assert stats["value/loss"] > 0.9 * 0.5 * (4 + 2 + 1.5 + 4) / 13


def test_critic_microbatches_and_minibatches_match_one_batch(policy):
    batch = _rollout()
    one = _critic(policy, "algo.value_lr=3e-3")
    split = copy.deepcopy(one)
    split.forward = ForwardSettings(microbatch_rows=1)
    targets = _fixed_targets(one, batch)
    a = optimise_critic(one, batch, targets, passes=1, minibatches=ALL_ROWS)
    b = optimise_critic(split, batch, targets, passes=1, minibatches=ALL_ROWS)
    assert a["value/loss"] == pytest.approx(b["value/loss"], abs=1e-6)
    for p, q in zip(one.model.parameters(), split.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    two = optimise_critic(split, batch, targets, passes=2, minibatches=HALVES)
    assert split.optimizer.state[next(split.model.parameters())]["step"] == 1 + 4
    assert two["value/loss"] < b["value/loss"]


def _ppo_config(model_dir: Path, data_file: Path, run_dir: Path, *extra: str):
    return load_config(
        None,
        [
            "algo.preset=ppo",
            f"model.path={model_dir}",
            f"data.path={data_file}",
            "data.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "run.steps=2",
            f"run.dir={run_dir}",
            "reward.timeout=null",
            "optim.lr=1e-3",
            "eval.at_start_end=false",
            "run.device=cpu",
            *extra,
        ],
    )


def test_ppo_setup_has_a_critic_and_puts_the_kl_in_the_reward(tiny_model_dir, data_file, tmp_path):
    s = setup(_ppo_config(tiny_model_dir, data_file, tmp_path / "run"))
    assert s.advantage is not None and s.policy.reference is not None
    assert s.loss_fns.beta == 0.0 and s.loss_fns.kl is kl_k1
    policy_storage = {p.data_ptr() for p in s.policy.model.parameters()}
    assert not policy_storage & {p.data_ptr() for p in s.advantage.model.parameters()}


def test_ppo_can_keep_the_kl_in_the_loss(tiny_model_dir, data_file, tmp_path):
    config = _ppo_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.kl_in_reward=false",
        "algo.kl_estimator=k3",
    )
    s = setup(config)
    assert s.advantage is not None and s.loss_fns.beta == 0.04


def test_two_ppo_steps_train_the_critic_and_checkpoint_it(tiny_model_dir, data_file, tmp_path):
    run_dir = tmp_path / "run"
    train(_ppo_config(tiny_model_dir, data_file, run_dir), quiet=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("value/loss", "value/mean", "value/grad_norm", "kl", "loss/policy", "grad_norm"):
        assert all(isinstance(r[key], float) for r in rows), key
    # Step 1: the zero head predicts 0 everywhere and the policy is the reference.
    assert rows[0]["value/mean"] == 0.0
    assert rows[0]["value/explained_var"] == pytest.approx(0.0, abs=1e-6)
    assert abs(rows[0]["kl"]) < 1e-5
    assert rows[1]["value/mean"] != 0.0
    assert rows[0]["adv/abs_mean"] > 0.1
    ckpt = run_dir / "checkpoints" / "step-000002"
    saved = load_file(ckpt / "value.safetensors")
    assert saved["head.weight"].abs().sum() > 0
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    value_state = state["optimizers"]["value"]["state"]
    assert {float(v["step"]) for v in value_state.values()} == {2.0}


def test_ppo_resume_restores_the_critic(tiny_model_dir, data_file, tmp_path):
    run_dir = tmp_path / "run"
    train(_ppo_config(tiny_model_dir, data_file, run_dir), quiet=True)
    resumed = setup(
        _ppo_config(tiny_model_dir, data_file, run_dir, "run.resume=auto", "run.steps=3")
    )
    assert resumed.start_step == 2
    saved = load_file(run_dir / "checkpoints" / "step-000002" / "value.safetensors")
    for name, param in resumed.advantage.model.state_dict().items():
        assert torch.equal(param, saved[name]), name
    first = next(resumed.advantage.model.parameters())
    assert float(resumed.advantage.optimizer.state[first]["step"]) == 2.0
    # a rate changed at the resume reaches the critic's optimizer too
    changed = setup(
        _ppo_config(tiny_model_dir, data_file, run_dir, "run.resume=auto", "run.steps=3",
                    "algo.value_lr=1e-5", "optim.weight_decay=0.5")
    )  # fmt: skip
    groups = changed.advantage.optimizer.param_groups
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(1e-5, 0.5)] * len(groups)


def test_the_ppo_config_file_selects_the_critic_and_the_kl_in_the_reward():
    config = load_config(REPO / "configs" / "ppo.yaml")
    assert config.algo.estimator == "gae" and config.algo.kl_in_reward
    assert config.algo.kl_estimator == "k1" and config.algo.loss_agg == "token-mean"


def test_kl_in_reward_without_a_critic_is_rejected():
    with pytest.raises(ValueError, match="algo.kl_in_reward needs algo.estimator=gae"):
        load_config(None, ["algo.kl_in_reward=true"])


def test_the_ppo_preset_with_the_kl_in_the_loss_must_leave_k1():
    # the preset's k1 suits the reward; as a loss term its expected gradient is zero
    with pytest.raises(ValueError, match=r"set algo.kl_estimator=k3 \(or k2\)"):
        load_config(None, ["algo.preset=ppo", "algo.kl_in_reward=false"])
    config = load_config(
        None, ["algo.preset=ppo", "algo.kl_in_reward=false", "algo.kl_estimator=k2"]
    )
    assert config.algo.kl_estimator == "k2" and not config.algo.kl_in_reward


def test_the_critic_takes_the_policys_minibatches(tiny_model_dir, data_file, tmp_path):
    """4 groups, algo.minibatches=3: the policy and the critic each take exactly 3 steps a pass,
    on groups {0, 3}, {1} and {2} (not ceil(4 / 3) = 2 groups a step, 2 steps)."""
    from oncurve.advantages import critic as critic_module
    from oncurve.loop.training_step import training_step

    s = setup(_ppo_config(tiny_model_dir, data_file, tmp_path / "run", "algo.minibatches=3"))
    seen: list[list[int]] = []
    real = critic_module.optimise_critic

    def recording(critic, batch, targets, *, minibatches, **kwargs):
        seen.extend(rows.tolist() for rows in minibatches)
        return real(critic, batch, targets, minibatches=minibatches, **kwargs)

    with pytest.MonkeyPatch.context() as patch, s.rewards:
        patch.setattr(critic_module, "optimise_critic", recording)
        training_step(s, 1)
    assert seen == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7], [8, 9, 10, 11]]
    critic_param = next(s.advantage.model.parameters())
    assert int(s.advantage.optimizer.state[critic_param]["step"]) == 3
    policy_param = next(p for p in s.policy.model.parameters() if p.requires_grad)
    assert int(s.optimizer.state[policy_param]["step"]) == 3
