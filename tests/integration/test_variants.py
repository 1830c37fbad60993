"""RLOO, GSPO and CISPO, and a sampling temperature other than 1, through the trainer: the first
step's loss and gradients against the same step assembled by hand from each variant's formula.

The hand assembly shares nothing with `oncurve.algo` but the reward function: logprobs come from
the HF model's full logits, advantages, ratios, clips, KL and the aggregation are written out
here and in helpers/hand_assembly.py. With mu=2 the step has two optimizer steps over one
sample; the second pass's ratio is not 1, so it is where the clip acts, and it is checked at
the weights the trainer had then (captured before the optimizer's second step), so the check
does not depend on AdamW.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.configs import GROUP, raw_gradient_config
from helpers.first_step import Step, run_first_step
from helpers.hand_assembly import (
    count_digit_rewards,
    forward_logprobs,
    grpo_advantages,
    k3,
    model_at,
    seq_mean_token_mean,
)

from oncurve.loop.trainer import setup
from oncurve.types import RolloutBatch

# --- the hand assembly ----------------------------------------------------------------------


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r_i minus the mean of the other k - 1 rewards of its group."""
    out = []
    for g in range(0, len(rewards), GROUP):
        r = rewards[g : g + GROUP].tolist()
        out += [
            r[i] - sum(r[j] for j in range(GROUP) if j != i) / (GROUP - 1) for i in range(GROUP)
        ]
    return torch.tensor(out, dtype=torch.float32)


def ppo_per_token(logp, old, adv, eps_low, eps_high):
    ratio = (logp - old).exp()
    a = adv[:, None]
    return torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high))


def hand_loss(
    model: torch.nn.Module,
    rollout: RolloutBatch,
    loss: str,
    adv: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    *,
    eps_low: float,
    eps_high: float,
    beta: float,
    temperature: float = 1.0,
) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    """One pass's loss at `model`'s weights, back-propagated into a fresh `.grad`. Returns the
    loss, the gradients by name, and the ratio's min and max and the clip fractions over the
    completion tokens, with each loss's conventions."""
    model.zero_grad(set_to_none=True)
    mask = rollout.completion_mask.float()
    on = mask > 0
    logp = forward_logprobs(model, rollout, temperature)
    a = adv[:, None].expand_as(logp)
    if loss == "ppo_clip":
        ratio = (logp - old).exp()
        per_token = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high))
    elif loss == "gspo":
        # the sequence-level objective: -min(s_i A_i, clip(s_i) A_i), the same for every token
        s = (((logp - old) * mask).sum(1) / mask.sum(1)).exp()
        per_seq = torch.maximum(-adv * s, -adv * s.clamp(1 - eps_low, 1 + eps_high))
        per_token = per_seq[:, None].expand_as(logp)
        ratio = s[:, None].expand_as(logp)
    elif loss == "cispo":
        ratio = (logp - old).exp().detach()
        per_token = -ratio.clamp(1 - eps_low, 1 + eps_high) * a * logp
    else:
        raise ValueError(loss)
    if beta > 0:
        per_token = per_token + beta * k3(logp, ref)
    total = seq_mean_token_mean(per_token, mask)
    total.backward()
    ratio = ratio.detach()
    low, high = ratio < 1 - eps_low, ratio > 1 + eps_high
    if loss != "cispo":  # PPO's clip removes a gradient only where A pushes past the bound
        low, high = low & (a < 0), high & (a > 0)
    count = float(mask.sum())
    info = {
        "ratio/min": float(ratio[on].min()),
        "ratio/max": float(ratio[on].max()),
        "clip/low_frac": float((low & on).sum()) / count,
        "clip/high_frac": float((high & on).sum()) / count,
    }
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return float(total.detach()), grads, info


def check_step(
    s,
    monkeypatch,
    loss: str,
    estimator: str,
    *,
    eps_low: float,
    eps_high: float,
    beta: float,
    temperature: float = 1.0,
) -> tuple[Step, list[dict[str, float]]]:
    """Run step 1 of `s` (pi_old = pi_ref = the initial weights) and check every pass's loss,
    gradients, ratio range and clip fractions, and the advantages, against the hand assembly;
    returns the step and the hand assembly's ratio and clip statistics of each pass."""
    initial = copy.deepcopy(s.policy.model)
    step = run_first_step(s, monkeypatch)
    rewards = count_digit_rewards(step.rollout)
    adv = {"grpo": grpo_advantages, "rloo": rloo_advantages}[estimator](rewards)
    torch.testing.assert_close(step.batch.advantages, adv, atol=1e-6, rtol=0)
    assert step.metrics["adv/abs_mean"] == pytest.approx(float(adv.abs().mean()), abs=1e-6)
    with torch.no_grad():
        old = forward_logprobs(initial, step.rollout, temperature)
    passes = []
    assert len(step.stats) == len(step.grads) == s.config.algo.mu
    for k, weights in enumerate(step.weights):
        model = model_at(initial, weights)
        value, grads, info = hand_loss(
            model,
            step.rollout,
            loss,
            adv,
            old,
            old if beta > 0 else None,
            eps_low=eps_low,
            eps_high=eps_high,
            beta=beta,
            temperature=temperature,
        )
        stats = step.stats[k]
        assert stats["loss/policy"] == pytest.approx(value, abs=1e-6), k
        for name, grad in grads.items():
            scale = float(grad.abs().max())
            assert scale > 0, name
            # relative to the parameter's largest gradient: the two assemblies sum in different
            # orders, so entries near 0 differ by rounding at the scale of the largest ones
            torch.testing.assert_close(step.grads[k][name], grad, atol=1e-5 * scale, rtol=0)
        for key in ("ratio/min", "ratio/max"):
            assert stats[key] == pytest.approx(info[key], abs=2e-6), (k, key)
        for key in ("clip/low_frac", "clip/high_frac"):
            assert stats[key] == pytest.approx(info[key], abs=1e-6), (k, key)
        passes.append(info)
    # pass 1 runs at pi_old's weights: ratio 1, nothing clipped; pass 2 is where the clip acts
    for key in ("ratio/min", "ratio/max"):
        assert step.stats[0][key] == pytest.approx(1.0, abs=1e-6), key
    assert step.stats[0]["clip/low_frac"] == step.stats[0]["clip/high_frac"] == 0.0
    return step, passes


def clipped(info: dict[str, float]) -> float:
    return info["clip/low_frac"] + info["clip/high_frac"]


# --- the tests ------------------------------------------------------------------------------


def test_rloo_step_matches_hand_assembled_leave_one_out(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """estimator=rloo with no std scaling: A_i = r_i - mean of the other 3 rewards (4/3 of
    GRPO's centred reward), PPO clip, k3 KL; mu=2 so that the second pass's loss is not ~0 and
    its clip (bounds 0.05 / 0.08) removes some tokens' gradient."""
    config = raw_gradient_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.estimator=rloo",
        "algo.adv_scale=none",
        "algo.beta=0.04",
        "algo.mu=2",
        "algo.epsilon=0.05",
        "algo.epsilon_high=0.08",
        "optim.lr=1e-2",
    )
    s = setup(config)
    _, passes = check_step(
        s, monkeypatch, "ppo_clip", "rloo", eps_low=0.05, eps_high=0.08, beta=0.04
    )
    assert 0 < clipped(passes[1]) < 1


def test_gspo_step_matches_the_hand_assembled_sequence_level_objective(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """The gspo preset (sequence-level ratio s_i = exp(mean_t log ratio), clip 3e-4 / 4e-4,
    seq-mean-token-mean, no KL), assembled as GSPO states it: per row -min(s_i A_i,
    clip(s_i) A_i), averaged over rows. mu=2 passes of one minibatch at lr 1e-4 move some
    rows' s_i past a bound and leave others inside it, so the second pass checks both
    branches."""
    config = raw_gradient_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.preset=gspo",
        "algo.mu=2",
        "algo.minibatches=1",
        "optim.lr=1e-4",
    )
    a = config.algo
    assert (a.loss, a.loss_agg, a.epsilon, a.epsilon_high, a.beta) == (
        "gspo",
        "seq-mean-token-mean",
        3e-4,
        4e-4,
        0.0,
    )
    s = setup(config)
    _, passes = check_step(s, monkeypatch, "gspo", "grpo", eps_low=3e-4, eps_high=4e-4, beta=0.0)
    assert 0 < clipped(passes[1]) < 1


def test_cispo_step_matches_hand_assembled_clipped_reinforce(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """loss=cispo: -sg(clip(r, 0.95, 1.08)) A logp per token, seq-mean-token-mean, no KL. The
    first pass is REINFORCE (weight 1); in the second some weights are capped, and unlike PPO
    the capped tokens keep their gradient."""
    config = raw_gradient_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.loss=cispo",
        "algo.beta=0.0",
        "algo.mu=2",
        "algo.epsilon=0.05",
        "algo.epsilon_high=0.08",
        "optim.lr=1e-2",
    )
    s = setup(config)
    _, passes = check_step(s, monkeypatch, "cispo", "grpo", eps_low=0.05, eps_high=0.08, beta=0.0)
    assert 0 < clipped(passes[1]) < 1


def test_temperature_scales_pi_old_pi_ref_and_the_loss(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """rollout.temperature=0.7: the sampler's logprobs, pi_old and pi_ref are all
    log softmax(logits / 0.7) of the initial weights, and both passes of the step (GRPO, k3 KL
    at beta 0.04) equal the hand assembly at that temperature."""
    config = raw_gradient_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "rollout.temperature=0.7",
        "algo.beta=0.04",
        "algo.mu=2",
        "algo.epsilon=0.05",
        "algo.epsilon_high=0.08",
        "optim.lr=1e-2",
    )
    s = setup(config)
    initial = copy.deepcopy(s.policy.model)
    step, passes = check_step(
        s, monkeypatch, "ppo_clip", "grpo", eps_low=0.05, eps_high=0.08, beta=0.04, temperature=0.7
    )
    assert 0 < clipped(passes[1]) < 1
    mask = step.rollout.completion_mask.bool()
    with torch.no_grad():
        cooled = forward_logprobs(initial, step.rollout, 0.7)
        plain = forward_logprobs(initial, step.rollout, 1.0)
    assert float((cooled - plain)[mask].abs().max()) > 0.1  # the temperature matters here
    for name, logprobs in (
        ("pi_old", step.batch.old_logprobs),
        ("pi_ref", step.batch.ref_logprobs),
    ):
        torch.testing.assert_close(logprobs[mask], cooled[mask], atol=1e-6, rtol=0, msg=name)
        assert (logprobs[~mask] == 0).all(), name
    # the sampler's, to the trainer's health-check precision
    torch.testing.assert_close(step.rollout.logprobs[mask], cooled[mask], atol=1e-5, rtol=0)
