import pytest
import torch

from oncurve.algo import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, lookup
from oncurve.errors import UserError


def test_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0, -0.5, -7.0], dtype=torch.float64)
    d = logp - ref
    torch.testing.assert_close(kl_k1(logp, ref), d)
    torch.testing.assert_close(kl_k2(logp, ref), d**2 / 2)
    # k3 = pi_ref / pi - log(pi_ref / pi) - 1
    want = torch.tensor([0.5, -1.0, 0.0, 4.0], dtype=torch.float64)  # d, by hand
    want = torch.exp(-want) + want - 1
    torch.testing.assert_close(kl_k3(logp, ref), want)


def test_k3_nonnegative_and_zero_at_equality():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(1000, generator=gen, dtype=torch.float64) * 15
    ref = -torch.rand(1000, generator=gen, dtype=torch.float64) * 15
    assert (kl_k3(logp, ref) >= 0).all() and (kl_k2(logp, ref) >= 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros(1000, dtype=torch.float64))
    assert torch.equal(kl_k1(logp, logp), torch.zeros(1000, dtype=torch.float64))


def test_k3_unbiased_for_the_kl():
    """Sampling from pi, the means of k1 and k3 both estimate KL(pi || pi_ref)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    # expectation over pi taken exactly, as a weighted sum over the three outcomes
    for fn in (kl_k1, kl_k3):
        torch.testing.assert_close((p * fn(p.log(), q.log())).sum(), exact)


def test_k3_padding_stays_finite():
    logp = torch.tensor([-200.0, 0.0], requires_grad=True)
    kl = kl_k3(logp, torch.zeros(2))
    (kl * torch.tensor([0.0, 1.0])).sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
    # a reference that gives a padding position no probability at all
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    kl = kl_k3(logp, torch.tensor([-float("inf"), -1.0]))
    (kl * torch.tensor([0.0, 1.0])).sum().backward()
    assert torch.isfinite(kl).all() and logp.grad.tolist() == [0.0, 0.0]


def test_k3_keeps_its_value_and_gradient_far_above_the_reference():
    """Where the policy gives a token e^25 times the reference's probability, k3 is
    e^-25 + 25 - 1 and its gradient in the policy's logprob 1 - e^-25 (a clamp of the log-ratio
    from below zeroed both the pull and the logged KL there)."""
    logp = torch.tensor([-0.5, -0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-25.5, -19.5], dtype=torch.float64)
    kl = kl_k3(logp, ref)
    kl.sum().backward()
    d = torch.tensor([25.0, 19.0], dtype=torch.float64)
    torch.testing.assert_close(kl.detach(), torch.exp(-d) + d - 1)
    torch.testing.assert_close(logp.grad, 1 - torch.exp(-d))


def test_lookup_by_table_or_name():
    assert lookup(KL_ESTIMATORS, "k3") is kl_k3
    assert lookup("KL estimator", "k1") is kl_k1
    with pytest.raises(UserError, match=r"unknown policy loss 'x'; choose one of: ppo_clip, gspo"):
        lookup("policy loss", "x")
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; choose one of: k1, k2, k3$"):
        lookup(KL_ESTIMATORS, "k4")


def test_expected_gradient_of_each_estimator_as_a_loss():
    """Sampling from pi and differentiating the estimator (what a loss term does): k1's gradient
    is zero in expectation, k2's is that of KL(pi || pi_ref), k3's that of KL(pi_ref || pi)."""
    logits = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64).log()

    def grad_of(objective):
        logits.grad = None
        objective(logits.log_softmax(0)).backward()
        return logits.grad.clone()

    # the expectation over pi taken exactly, with the sampling weights held fixed
    def expected(fn):
        return lambda logp: (logp.detach().exp() * fn(logp, ref)).sum()

    forward_kl = grad_of(lambda logp: (logp.exp() * (logp - ref)).sum())
    reverse_kl = grad_of(lambda logp: (ref.exp() * (ref - logp)).sum())
    zero = torch.zeros(3, dtype=torch.float64)
    torch.testing.assert_close(grad_of(expected(kl_k1)), zero)
    torch.testing.assert_close(grad_of(expected(kl_k2)), forward_kl)
    torch.testing.assert_close(grad_of(expected(kl_k3)), reverse_kl)
    assert (forward_kl - reverse_kl).abs().max() > 1e-2
