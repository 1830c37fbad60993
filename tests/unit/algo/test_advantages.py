import math

import pytest
import torch

from oncurve.algo import ADVANTAGE_ESTIMATORS, clipped_value_loss, gae, group_advantages
from oncurve.algo import rloo_advantages as rloo


def loop_advantages(rewards, group_size, scale, eps, leave_one_out):
    """Reference: one group at a time in Python floats."""
    values = rewards.tolist()
    finite = [v for v in values if math.isfinite(v)]
    mu_all = sum(finite) / len(finite)
    batch_std = math.sqrt(sum((v - mu_all) ** 2 for v in finite) / len(finite))
    out = []
    for start in range(0, len(values), group_size):
        group = values[start : start + group_size]
        ok = [v for v in group if math.isfinite(v)]
        k = len(ok)
        mu = sum(ok) / k if k else 0.0
        std = math.sqrt(sum((v - mu) ** 2 for v in ok) / k) if k else 0.0
        for v in group:
            if not math.isfinite(v) or k < 2 or max(ok) == min(ok):
                out.append(0.0)
                continue
            a = v - (sum(ok) - v) / (k - 1) if leave_one_out else v - mu
            out.append(a / {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[scale])
    return torch.tensor(out, dtype=torch.float64)


def test_worked_example_population_std():
    rewards = torch.tensor([1.0] * 6 + [0.0] * 4)
    adv = group_advantages(rewards, 10)
    # population std: sqrt(0.6 * 0.4) = 0.49; the sample std would be 0.516 and give +0.77.
    assert round(adv[0].item(), 2) == 0.82
    assert round(adv[-1].item(), 2) == -1.22
    assert torch.allclose(adv[:6], torch.tensor(0.4 / math.sqrt(0.24)), atol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_degenerate_groups_are_exactly_zero(name, scale):
    fn = ADVANTAGE_ESTIMATORS[name]
    # 0.1 is not exact in binary: a mean of ten of them is not 0.1 either.
    rewards = torch.tensor([0.1] * 4 + [0.7] * 4 + [0.3, 0.9, 0.2, 0.4])
    adv = fn(rewards, 4, scale=scale, eps=1e-6)
    assert torch.equal(adv[:8], torch.zeros(8))
    assert (adv[8:] != 0).all()


def test_shift_and_scale_invariance_group_scale():
    rewards = torch.randn(24, dtype=torch.float64)
    adv = group_advantages(rewards, 6, "group", eps=0.0)
    torch.testing.assert_close(group_advantages(rewards + 3.5, 6, "group", eps=0.0), adv)
    torch.testing.assert_close(group_advantages(rewards * 7.0, 6, "group", eps=0.0), adv)
    # without a std, scaling the rewards scales the advantages; shifting still changes nothing
    none = group_advantages(rewards, 6, "none")
    torch.testing.assert_close(group_advantages(rewards + 3.5, 6, "none"), none)
    torch.testing.assert_close(group_advantages(rewards * 7.0, 6, "none"), 7.0 * none)


def test_scale_none_is_reward_minus_group_mean():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0, 0.0, 2.0])
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0, 2.0, -2.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, 4, "none"), expected)


def test_scale_batch_uses_batch_std_or_override():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    dev = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    adv = group_advantages(rewards, 4, "batch", eps=0.0)
    torch.testing.assert_close(adv, dev / 0.5)  # half ones: population std 0.5
    override = group_advantages(rewards, 4, "batch", eps=0.0, batch_std=torch.tensor(2.0))
    torch.testing.assert_close(override, dev / 2.0)


def test_nan_rewards_are_left_out_and_get_zero():
    nan = float("nan")
    rewards = torch.tensor([1.0, nan, 0.0, 1.0, nan, nan, nan, 5.0, nan, nan, nan, nan])
    adv = group_advantages(rewards, 4, "none")
    # group 1: finite mean 2/3; group 2: a single finite reward; group 3: all missing.
    expected = torch.tensor([1 / 3, 0.0, -2 / 3, 1 / 3] + [0.0] * 8)
    torch.testing.assert_close(adv, expected)
    assert torch.isfinite(group_advantages(rewards, 4, "group")).all()
    assert torch.isfinite(group_advantages(rewards, 4, "batch")).all()
    # RLOO: baseline is the mean of the OTHER finite rewards
    torch.testing.assert_close(rloo(rewards, 4)[:4], torch.tensor([0.5, 0.0, -1.0, 0.5]))


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_loop_equals_vectorised(scale, leave_one_out):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (64,), generator=gen).double() * 0.5
    rewards += torch.randn(64, generator=gen, dtype=torch.float64) * (
        torch.rand(64, generator=gen) < 0.3
    )
    rewards[torch.rand(64, generator=gen) < 0.1] = float("nan")
    rewards[:8] = 1.0  # one all-equal group
    fn = rloo if leave_one_out else group_advantages
    got = fn(rewards.float(), 8, scale=scale, eps=1e-6)
    want = loop_advantages(rewards.float().double(), 8, scale, 1e-6, leave_one_out)
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-6)


def test_bad_shape_and_scale_raise():
    with pytest.raises(ValueError, match="group_size=4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(torch.zeros(8), 4, scale="std")


def loop_gae(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(values)
    for i in range(values.shape[0]):
        steps = [t for t in range(values.shape[1]) if mask[i, t]]
        running = 0.0
        for j in reversed(range(len(steps))):
            t = steps[j]
            next_v = values[i, steps[j + 1]] if j + 1 < len(steps) else 0.0
            running = rewards[i, t] + gamma * next_v - values[i, t] + gamma * lam * running
            adv[i, t] = running
    return adv


@pytest.mark.parametrize(
    ("gamma", "expected"),
    [
        # gamma 1: deltas .1, .1, .3 -> A2 = .3, A1 = .1 + .95 * .3, A0 = .1 + .95 * A1
        (1.0, [0.46575, 0.385, 0.3]),
        # gamma .9: deltas .04, .03, .3 -> A1 = .03 + .855 * .3, A0 = .04 + .855 * A1
        (0.9, [0.2849575, 0.2865, 0.3]),
    ],
)
def test_gae_hand_computed(gamma, expected):
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma, 0.95)
    want = torch.tensor([expected + [0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, (want + values) * mask)


def test_gae_loop_equals_vectorised_with_holes():
    gen = torch.Generator().manual_seed(1)
    rewards, values = torch.randn(2, 6, 10, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 10, generator=gen) < 0.7).long()
    mask[0] = 0
    adv, _ = gae(rewards, values, mask, 0.99, 0.9)
    torch.testing.assert_close(adv, loop_gae(rewards, values, mask, 0.99, 0.9), rtol=0, atol=1e-12)


def test_clipped_value_loss_cases():
    old = torch.zeros(4)
    values = torch.tensor([0.1, 0.5, 0.5, -0.5])
    returns = torch.tensor([0.0, 1.0, 0.0, 0.0])
    loss = clipped_value_loss(values, old, returns, clip_range=0.2)
    # inside the clip; clipped prediction 0.2 further from 1.0 -> its error wins;
    # moving away from the return: unclipped 0.5 error wins; symmetric on the negative side.
    torch.testing.assert_close(loss, torch.tensor([0.005, 0.32, 0.125, 0.125]))
