import math

import pytest
import torch

from oncurve.algo import AGGREGATIONS, POLICY_LOSSES, cispo, gspo, logprobs_from_logits, ppo_clip

KEYS = {
    "clip/low_frac",
    "clip/high_frac",
    "ratio/mean",
    "ratio/min",
    "ratio/max",
    "ratio/clamped_frac",
}
EPS = {"eps_low": 0.2, "eps_high": 0.28}

# One token per clip region: (advantage, ratio, ppo gradient is zero?)
REGIONS = [
    (1.0, 1.5, True),  # A > 0, ratio above 1 + eps_high: clipped
    (-1.0, 0.5, True),  # A < 0, ratio below 1 - eps_low: clipped
    (1.0, 0.5, False),  # A > 0, ratio low: the unclipped term is the max, gradient kept
    (-1.0, 1.5, False),  # A < 0, ratio high: gradient kept (what dual clip bounds)
    (2.0, 1.1, False),  # inside
    (-0.5, 0.9, False),  # inside
]


def region_inputs():
    adv = torch.tensor([[a for a, _, _ in REGIONS]], dtype=torch.float64)
    ratio = torch.tensor([[r for _, r, _ in REGIONS]], dtype=torch.float64)
    logp = torch.full_like(adv, -1.3, requires_grad=True)
    old = logp.detach() - ratio.log()
    return logp, old, adv, ratio, torch.ones_like(adv)


def test_ppo_clip_gradient_region_by_region():
    logp, old, adv, ratio, mask = region_inputs()
    loss, metrics = ppo_clip(logp, old, adv, mask, **EPS)
    loss.sum().backward()
    zero = torch.tensor([[z for _, _, z in REGIONS]])
    # d(-A r)/d logp = -A r, since d r / d logp = r
    torch.testing.assert_close(logp.grad, torch.where(zero, 0.0, -adv * ratio))
    torch.testing.assert_close(loss, torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28)))
    assert metrics["clip/high_frac"].item() == pytest.approx(1 / 6)
    assert metrics["clip/low_frac"].item() == pytest.approx(1 / 6)
    assert metrics["ratio/min"].item() == pytest.approx(0.5)
    assert metrics["ratio/max"].item() == pytest.approx(1.5)
    assert metrics["ratio/mean"].item() == pytest.approx(ratio.mean().item())


def test_dual_clip_caps_negative_advantage_loss():
    adv = torch.tensor([[-2.0, -2.0, -2.0, 2.0]])
    ratio = torch.tensor([[5.0, 2.0, 0.5, 5.0]])
    logp = torch.zeros_like(adv, requires_grad=True)
    loss, _ = ppo_clip(logp, -ratio.log(), adv, torch.ones_like(adv), **EPS, dual_clip=3.0)
    loss.sum().backward()
    # ratio 5 > c = 3: loss capped at c * |A| = 6 with no gradient; ratio 2 < c: unchanged;
    # ratio below 1 - eps_low: clipped as usual; positive advantages are untouched.
    torch.testing.assert_close(loss, torch.tensor([[6.0, 4.0, 1.6, -2.56]]))
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 4.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_clip(logp, logp.detach(), adv, torch.ones_like(adv), **EPS, dual_clip=0.9)


@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("agg_name", sorted(AGGREGATIONS))
def test_ratio_one_gradient_is_reinforce(loss_name, agg_name):
    """At pi_old == pi (mu = 1) every loss's gradient is the policy gradient of -A * logp."""
    gen = torch.Generator().manual_seed(0)
    n, t, vocab, dim = 4, 5, 11, 6
    weight = torch.randn(vocab, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    feats = torch.randn(n, t, dim, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, vocab, (n, t), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    adv = torch.randn(n, 1, generator=gen, dtype=torch.float64).expand(n, t)
    counts = {"num_seqs": n, "num_tokens": float(mask.sum()), "norm_len": 5.0}
    agg = AGGREGATIONS[agg_name]

    def grad_of(objective):
        weight.grad = None
        logp = logprobs_from_logits(feats @ weight.T, labels).double()
        agg(objective(logp), mask, **counts).backward()
        return weight.grad.clone()

    policy = POLICY_LOSSES[loss_name]
    got = grad_of(lambda logp: policy(logp, logp.detach(), adv, mask, **EPS)[0])
    want = grad_of(lambda logp: -adv * logp)
    assert got.abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_gspo_ratio_is_constant_within_a_sequence():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    old = logp.detach() + 0.3 * torch.randn(3, 6, generator=gen, dtype=torch.float64)
    old[:, -1] = -1000.0  # padding: unrelated values must not leak in
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    adv = -1 - torch.rand(3, 6, generator=gen, dtype=torch.float64)  # per-token, negative
    # A < 0 and a wide clip range: the loss is -A times the ratio
    loss, metrics = gspo(logp, old, adv, mask, eps_low=0.99, eps_high=100.0)
    loss.sum().backward()
    for i in range(3):
        on = mask[i].bool()
        s_i = math.exp((logp[i, on] - old[i, on]).mean().item())
        torch.testing.assert_close(loss[i, on] / -adv[i, on], torch.full_like(loss[i, on], s_i))
        # token form: d loss_t / d logp_t = -A_t s_i, with no cross-token terms; 0 on padding
        torch.testing.assert_close(logp.grad[i, on], -adv[i, on] * s_i)
        assert (loss[i, ~on] == 0).all() and (logp.grad[i, ~on] == 0).all()
    assert metrics["ratio/min"] <= metrics["ratio/max"] and torch.isfinite(metrics["ratio/max"])


def test_gspo_clips_whole_sequences():
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    # row 0: mean log ratio 0.3 (one token far off, the others not); row 1: ratio 1
    old = torch.tensor([[-0.9, 0.0, 0.0], [0.5, -0.5, 0.0]], dtype=torch.float64)
    adv = torch.ones(2, 3, dtype=torch.float64)
    loss, metrics = gspo(logp, old, adv, torch.ones(2, 3), **EPS)
    loss.sum().backward()
    assert (logp.grad[0] == 0).all()
    torch.testing.assert_close(logp.grad[1], -torch.ones(3, dtype=torch.float64))
    assert metrics["clip/high_frac"].item() == pytest.approx(0.5)


def test_cispo_gradient_flows_when_clipped():
    logp, old, adv, ratio, mask = region_inputs()
    loss, metrics = cispo(logp, old, adv, mask, **EPS)
    loss.sum().backward()
    weight = ratio.clamp(0.8, 1.28)
    torch.testing.assert_close(logp.grad, -weight * adv)
    assert (logp.grad != 0).all()
    torch.testing.assert_close(loss, -weight * adv * logp.detach())
    # clipping is by ratio alone: 1.5 twice above, 0.5 twice below
    assert metrics["clip/high_frac"].item() == pytest.approx(2 / 6)
    assert metrics["clip/low_frac"].item() == pytest.approx(2 / 6)


def test_cispo_without_a_lower_bound_is_the_papers_weight():
    """epsilon 1 bounds the weight below at 0, which a ratio never reaches: sg(min(r, 1 +
    eps_high)) * A * log p, MiniMax-M1's objective; a ratio of 3 keeps its weight of 3 under a
    cap of 5."""
    logp, old, adv, ratio, mask = region_inputs()
    loss, metrics = cispo(logp, old, adv, mask, eps_low=1.0, eps_high=4.0)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -ratio.clamp(max=5.0) * adv)
    assert metrics["clip/low_frac"].item() == 0.0
    big = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    cispo(big, big.detach() - math.log(3.0), torch.ones(1, 1, dtype=torch.float64),
          torch.ones(1, 1), eps_low=1.0, eps_high=4.0)[0].sum().backward()  # fmt: skip
    assert big.grad.item() == pytest.approx(-3.0)


@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
def test_padding_is_zero_and_finite(loss_name):
    logp = torch.tensor([[-1.0, -2.0, -5.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, 200.0]])  # the padding value would overflow exp()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.full((1, 3), 0.7)
    loss, metrics = POLICY_LOSSES[loss_name](logp, old, adv, mask, **EPS, dual_clip=3.0)
    loss.sum().backward()
    assert set(metrics) == KEYS
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())
    assert loss[0, 2] == 0 and logp.grad[0, 2] == 0
    assert (
        torch.isfinite(logp.grad).all()
        and torch.isfinite(torch.stack(list(metrics.values()))).all()
    )
    assert metrics["ratio/max"].item() < 1.2


def clamp_case(loss_name: str, big: float):
    """Rows with log-ratio +big (A = -1), -big (A = +1), and 0.1 then padding (A = +1): one
    log-ratio per row, so GSPO's sequence ratio equals the token ratio."""
    logp = torch.zeros(3, 2, requires_grad=True)
    log_ratio = torch.tensor([[big, big], [-big, -big], [0.1, 0.0]])
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    loss, metrics = POLICY_LOSSES[loss_name](logp, logp.detach() - log_ratio, adv, mask, **EPS)
    loss.sum().backward()
    return loss, logp.grad, metrics


@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES))
def test_log_ratio_beyond_20_acts_as_20_and_is_counted(loss_name):
    loss, grad, metrics = clamp_case(loss_name, 50.0)
    at_20, _, metrics_20 = clamp_case(loss_name, 20.0)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, at_20)
    assert metrics["ratio/max"].item() == pytest.approx(math.exp(20), rel=1e-6)
    assert metrics["ratio/min"].item() == pytest.approx(math.exp(-20), rel=1e-6)
    # the four tokens of rows 0 and 1, of five in the mask; exactly 20 is not clamped
    assert metrics["ratio/clamped_frac"].item() == pytest.approx(4 / 5)
    assert metrics_20["ratio/clamped_frac"].item() == 0.0


@pytest.mark.parametrize("loss_name", ["ppo_clip", "gspo"])
def test_clamped_tokens_by_hand(loss_name):
    loss, grad, _ = clamp_case(loss_name, 50.0)
    # A = -1, r = e^20: the unclipped -A r is the max; A = +1, r = e^-20: -A r beats -A 0.8;
    # r = e^0.1 lies inside [0.8, 1.28]. No gradient through the clamp.
    e = math.exp
    want = torch.tensor([[e(20), e(20)], [-e(-20), -e(-20)], [-e(0.1), 0.0]])
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0], [0.0, 0.0], [-e(0.1), 0.0]]))
