"""The importance-sampling corrections (`algo.is_correction`, `algo.is_cap`): each mode's weights
against hand values, the setting's check and how null settles, a training step against the same
step assembled by hand with the weights applied, and training runs that sample from truncated
distributions, whose weights are then exactly 1."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import yaml
from helpers.configs import raw_gradient_config
from helpers.first_step import run_first_step
from helpers.hand_assembly import (
    count_digit_rewards,
    forward_logprobs,
    grpo_advantages,
    k3,
    model_at,
    seq_mean_token_mean,
)
from helpers.models import tiny_qwen2
from helpers.runs import metric_rows

from oncurve.algo import IS_CORRECTIONS, correction_metrics, logprob_diff_mean
from oncurve.config import load_config
from oncurve.loop.trainer import setup, train
from oncurve.rollout import TorchSampler
from oncurve.rollout import registry as sampler_registry
from oncurve.run.settle import RunFacts, settle_is_cap

# --- the weights ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(IS_CORRECTIONS))
def test_equal_logprobs_give_weights_of_exactly_one_and_nothing_capped(mode):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 7, generator=gen) * 5
    mask = torch.ones(3, 7)
    mask[1, 4:] = 0
    weights, capped = IS_CORRECTIONS[mode](old, old.clone(), mask, cap=2.0)
    assert torch.equal(weights, torch.ones(3, 7))
    assert not capped.any()
    stats = correction_metrics(weights, capped, mask)
    assert float(stats["is/capped_frac"]) == 0.0 and float(stats["is/weight_mean"]) == 1.0


# old - sampler per token: row 0 has ratios 1.5, 3, 0.5 (product 2.25, past the cap of 2), row 1
# 1.25, 1, 0.5 (product 0.625); the last column is off the mask, with a gap of 50 and a sampler
# logprob of -inf, and counts nowhere
GAPS = [
    [math.log(1.5), math.log(3.0), -math.log(2.0), 50.0],
    [math.log(1.25), 0.0, -math.log(2.0), 0.0],
]
CAPPED_BY_TOKEN = [[False, True, False, False], [False, False, False, False]]
CAPPED_BY_SEQUENCE = [[True, True, True, False], [False, False, False, False]]
HAND = {
    "token_truncate": ([[1.5, 2.0, 0.5, 1.0], [1.25, 1.0, 0.5, 1.0]], CAPPED_BY_TOKEN),
    "token_mask": ([[1.5, 0.0, 0.5, 1.0], [1.25, 1.0, 0.5, 1.0]], CAPPED_BY_TOKEN),
    "sequence_truncate": ([[2.0, 2.0, 2.0, 1.0], [0.625] * 3 + [1.0]], CAPPED_BY_SEQUENCE),
    "sequence_mask": ([[0.0, 0.0, 0.0, 1.0], [0.625] * 3 + [1.0]], CAPPED_BY_SEQUENCE),
}


@pytest.mark.parametrize("mode", sorted(HAND))
def test_planted_gaps_give_the_hand_computed_weights(mode):
    gaps = torch.tensor(GAPS, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    old = torch.full_like(gaps, -0.7, requires_grad=True)
    sampler = old.detach() - gaps
    sampler[0, 3] = -math.inf
    weights, capped = IS_CORRECTIONS[mode](old, sampler, mask, cap=2.0)
    expected, expected_capped = HAND[mode]
    expected_weights = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    assert capped.tolist() == expected_capped
    assert not weights.requires_grad
    stats = correction_metrics(weights, capped, mask)
    on = mask.bool()
    assert float(stats["is/capped_frac"]) == pytest.approx(sum(map(sum, expected_capped)) / 6)
    mean = float(expected_weights[on].mean())
    assert float(stats["is/weight_mean"]) == pytest.approx(mean, abs=1e-12)
    mean_gap = (math.log(1.5) + math.log(3.0) + 2 * math.log(2.0) + math.log(1.25)) / 6
    assert float(logprob_diff_mean(old, sampler, mask)) == pytest.approx(mean_gap, abs=1e-12)


@pytest.mark.parametrize("mode", sorted(IS_CORRECTIONS))
def test_a_gap_past_float_range_is_past_the_cap_and_a_bad_cap_is_refused(mode):
    """A log-ratio of 200 (exp overflows float32) is truncated to the cap of 3 or masked, like
    any ratio past it; the second token's ratio of 1 is kept, unless its sequence is capped."""
    old = torch.zeros(1, 2)
    sampler = torch.tensor([[-200.0, 0.0]])
    weights, capped = IS_CORRECTIONS[mode](old, sampler, torch.ones(1, 2), cap=3.0)
    whole = mode.startswith("sequence")
    value = 3.0 if mode.endswith("truncate") else 0.0
    assert weights.tolist() == [[value, value if whole else 1.0]]
    assert capped.tolist() == [[True, whole]]
    with pytest.raises(ValueError, match="cap must be > 0"):
        IS_CORRECTIONS[mode](old, old, torch.ones(1, 2), cap=0.0)


# --- the setting ----------------------------------------------------------------------------


# its check: tests/unit/config/test_config.py


def recorded_is_cap(s) -> float:
    return yaml.safe_load((s.run_dir / "config.yaml").read_text())["algo"]["is_cap"]


def test_null_settles_to_off_on_the_cpu_and_the_run_records_it(
    tiny_model_dir, data_file, tmp_path, capsys
):
    s = setup(raw_gradient_config(tiny_model_dir, data_file, tmp_path / "run"))
    assert s.config.algo.is_cap == 0.0 and s.loss_fns.is_correction is None
    assert recorded_is_cap(s) == 0.0
    assert "truncated distribution" not in capsys.readouterr().err


def test_null_settles_to_2_with_the_cuda_graph_sampler(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    # the test needs no CUDA graph: the backend's contract is what settles the cap
    class MismatchedSampler(TorchSampler):
        exact_logprobs = False

    assert not sampler_registry.BACKENDS["cuda_graph"].sampler.exact_logprobs
    hf = sampler_registry.BACKENDS["hf"]
    mismatched = dataclasses.replace(hf, sampler=MismatchedSampler)
    monkeypatch.setitem(sampler_registry.BACKENDS, "cuda_graph", mismatched)
    config = raw_gradient_config(
        tiny_model_dir, data_file, tmp_path / "run", "rollout.backend=cuda_graph"
    )
    s = setup(config)
    assert s.config.algo.is_cap == 2.0 and s.loss_fns.is_cap == 2.0
    assert s.loss_fns.is_correction is IS_CORRECTIONS["token_truncate"]
    assert recorded_is_cap(s) == 2.0


def test_auto_settles_from_the_backend_it_picks_and_a_set_value_is_kept(monkeypatch):
    model = tiny_qwen2(16)
    auto = load_config(None, ["rollout.backend=auto"])

    def settled_cap(config) -> float:
        return settle_is_cap(config, RunFacts.gather(config, model)).algo.is_cap

    assert settled_cap(auto) == 0.0  # cpu_llama
    monkeypatch.setattr(sampler_registry, "auto_backend", lambda _: "cuda_graph")
    assert settled_cap(auto) == 2.0
    for value in (0.0, 1.5):
        assert settled_cap(load_config(None, [f"algo.is_cap={value}"])) == value


# --- a step ---------------------------------------------------------------------------------

# old - sampler planted on the completion tokens, in turn: token weights 1.2, capped at 1.5
# (3 > 1.5), 0.5, 1, 1.4; five, so that rows of 8 tokens get different weights (equal mean
# weights in every row would scale the loss, whose group advantages sum to 0, from 0 to 0), and
# rows whose products of ratios are 2.52 x 1.8, 1.5, 0.7, 1.68 or 5.04 by where they start in
# the cycle: with a cap of 4, masked for three of the five starts
CAPS = {"token_truncate": 1.5, "sequence_mask": 4.0}
PLANTED = (math.log(1.2), math.log(3.0), -math.log(2.0), 0.0, math.log(1.4))


def plant_sampler_gap(s) -> dict[str, torch.Tensor]:
    """Make the sampler's logprobs of its tokens lower than its own by `PLANTED`, cycled over
    the completion tokens; returns {"gap": the `[N, T]` planted gaps} once step 1 sampled."""
    generate, planted = s.sampler.generate_ids, {}

    def generate_ids(*args, **kwargs):
        rollout = generate(*args, **kwargs)
        on = rollout.completion_mask.bool()
        cycle = torch.tensor(PLANTED, dtype=rollout.logprobs.dtype)
        gap = torch.zeros_like(rollout.logprobs)
        gap[on] = cycle[torch.arange(int(on.sum())) % len(PLANTED)]
        rollout.logprobs = rollout.logprobs - gap
        planted["gap"] = gap
        return rollout

    s.sampler.generate_ids = generate_ids
    return planted


def hand_weights(mode: str, old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor):
    """`[N, T]` weights of `mode` at its cap, written out: per token min(ratio, cap), or per
    row the product of its token ratios, 0 past the cap."""
    log_ratio = (old - sampler) * mask
    if mode == "token_truncate":
        return log_ratio.exp().clamp(max=CAPS[mode])
    ratio = log_ratio.sum(1, keepdim=True).exp()
    return torch.where(ratio > CAPS[mode], 0.0, ratio).expand_as(old)


def hand_is_loss(model, rollout, adv, old, mode, *, beta, eps, weigh="policy"):
    """One pass's loss at `model`'s weights, back-propagated into a fresh `.grad`: the PPO clip
    per token, weighted by `hand_weights`, plus beta x k3 against pi_ref = old, averaged per
    sequence then over sequences. `weigh`="all" weights the KL term too and "none" nothing:
    what the step must not do."""
    model.zero_grad(set_to_none=True)
    mask = rollout.completion_mask.float()
    weights = hand_weights(mode, old, rollout.logprobs, mask)
    logp = forward_logprobs(model, rollout)
    ratio = (logp - old).exp()
    a = adv[:, None]
    policy = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps, 1 + eps))
    kl = beta * k3(logp, old)
    if weigh == "none":
        weights = torch.ones_like(weights)
    per_token = weights * (policy + kl) if weigh == "all" else weights * policy + kl
    total = seq_mean_token_mean(per_token, mask)
    total.backward()
    return float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", sorted(CAPS))
def test_a_step_weights_the_policy_term_as_assembled_by_hand(
    tiny_model_dir, data_file, tmp_path, monkeypatch, mode
):
    """A token and a sequence correction with the sampler's logprobs planted below the
    trainer's: both passes of step 1 (mu=2; GRPO, k3 KL at beta 0.5) equal the hand assembly
    with the weights on the policy term only, and `is/capped_frac` is the fraction of tokens
    capped: planted past the cap, or in a row whose product of ratios is."""
    cap = CAPS[mode]
    config = raw_gradient_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        f"algo.is_correction={mode}",
        f"algo.is_cap={cap}",
        "algo.beta=0.5",
        "algo.mu=2",
        "algo.epsilon=0.05",
        "optim.lr=1e-2",
    )
    s = setup(config)
    assert s.loss_fns.is_cap == cap and s.loss_fns.is_correction is IS_CORRECTIONS[mode]
    initial = copy.deepcopy(s.policy.model)
    planted = plant_sampler_gap(s)
    step = run_first_step(s, monkeypatch)
    adv = grpo_advantages(count_digit_rewards(step.rollout))
    with torch.no_grad():
        old = forward_logprobs(initial, step.rollout)
    mask = step.rollout.completion_mask.float()
    on = mask.bool()
    gap = planted["gap"]
    if mode == "token_truncate":
        capped_tokens = gap == math.log(3.0)
    else:
        capped_tokens = (gap * mask).sum(1, keepdim=True).exp().expand_as(gap) > cap
    capped = float((capped_tokens & on).sum()) / int(on.sum())
    assert 0 < capped < 1
    weight_mean = float(hand_weights(mode, old, step.rollout.logprobs, mask)[on].mean())
    for k, weights in enumerate(step.weights):
        model = model_at(initial, weights)
        value, grads = hand_is_loss(model, step.rollout, adv, old, mode, beta=0.5, eps=0.05)
        stats = step.stats[k]
        assert stats["loss/policy"] == pytest.approx(value, abs=1e-6), k
        for name, grad in grads.items():
            scale = float(grad.abs().max())
            torch.testing.assert_close(step.grads[k][name], grad, atol=1e-5 * scale, rtol=0)
        assert stats["is/capped_frac"] == pytest.approx(capped, abs=1e-7), k
        assert stats["is/weight_mean"] == pytest.approx(weight_mean, abs=1e-5), k
        assert stats["logprob_diff/mean"] == pytest.approx(float(gap[on].abs().mean()), abs=1e-5)
        # what the check tells apart: no weights, and (past pass 1, which runs at pi_ref's
        # weights, where the KL term is 0) the weights on the KL term too
        for weigh in ("none", "all") if k else ("none",):
            wrong, _ = hand_is_loss(
                model, step.rollout, adv, old, mode, beta=0.5, eps=0.05, weigh=weigh
            )
            assert abs(wrong - value) > 1e-4, (k, weigh)
    assert step.metrics["is/capped_frac"] == pytest.approx(capped, abs=1e-7)


def test_is_correction_none_weighs_nothing(tiny_model_dir, data_file, tmp_path):
    config = raw_gradient_config(
        tiny_model_dir, data_file, tmp_path / "run", "algo.is_correction=none"
    )
    assert setup(config).loss_fns.is_correction is None


# --- truncated sampling ---------------------------------------------------------------------


@pytest.mark.parametrize("truncation", ["rollout.top_p=0.9", "rollout.top_k=5"])
def test_truncated_sampling_trains_the_truncated_policy_exactly(
    tiny_model_dir, data_file, tmp_path, capsys, truncation
):
    """With top-p or top-k, the sampler's logprobs and the training forward's are those of one
    truncated distribution: at mu = 1 the importance weights are 1 to float32 rounding (full
    logprobs in the trainer would be off by up to log 1/0.9 and more), and nothing warns."""
    run_dir = tmp_path / "run"
    config = raw_gradient_config(
        tiny_model_dir, data_file, run_dir, truncation, "run.steps=2", "algo.is_cap=2",
        "run.preflight=true",
    )  # fmt: skip
    train(config)
    rows = [row for row in metric_rows(run_dir) if "ratio/min" in row]
    assert len(rows) == 2
    for row in rows:
        assert row["ratio/min"] == row["ratio/max"] == 1.0
        assert row["logprob_diff/max"] < 1e-5
        assert abs(row["logprob_diff/mean"]) < 1e-6
        assert row["is/weight_mean"] == pytest.approx(1.0, abs=1e-6)
        assert row["is/capped_frac"] == 0.0
    assert "truncated" not in capsys.readouterr().err
