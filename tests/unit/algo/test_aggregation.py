import pytest
import torch

from oncurve.algo import AGGREGATIONS, kl_k3, ppo_clip

NORM_LEN = 7.0


def loop_aggregate(name, per_token, mask):
    rows = [(per_token[i][mask[i] > 0]).tolist() for i in range(per_token.shape[0])]
    n, tokens = len(rows), sum(len(r) for r in rows)
    if name == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows if r) / n
    if name == "token-mean":
        return sum(sum(r) for r in rows) / tokens
    return sum(sum(r) for r in rows) / NORM_LEN / n


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    n, t = 8, 7
    lengths = torch.tensor([7, 3, 1, 0, 5, 7, 2, 4])  # includes an empty row
    mask = (torch.arange(t) < lengths[:, None]).float()
    logp = torch.randn(n, t, generator=gen, dtype=torch.float64).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    ref = logp.detach() + 0.2 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, 1, generator=gen, dtype=torch.float64).expand(n, t)
    return logp, old, ref, adv, mask


def objective(logp, old, ref, adv, mask):
    loss, _ = ppo_clip(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    return loss + 0.04 * kl_k3(logp, ref)


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_matches_loop_and_hand_values(name):
    logp, old, ref, adv, mask = batch()
    per_token = objective(logp, old, ref, adv, mask).detach()
    counts = {"num_seqs": 8.0, "num_tokens": float(mask.sum()), "norm_len": NORM_LEN}
    got = AGGREGATIONS[name](per_token, mask, **counts)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(loop_aggregate(name, per_token, mask), rel=1e-12)


def test_hand_values():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [4.0, 99.0, 99.0], [99.0, 99.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    counts = {"num_seqs": 3.0, "num_tokens": 4.0, "norm_len": 4.0}
    # rows: mean 4/3, mean 4, empty row 0 -> (4/3 + 4) / 3
    assert AGGREGATIONS["seq-mean-token-mean"](per_token, mask, **counts).item() == pytest.approx(
        16 / 9
    )
    assert AGGREGATIONS["token-mean"](per_token, mask, **counts).item() == pytest.approx(2.0)
    assert AGGREGATIONS["seq-mean-token-sum-norm"](per_token, mask, **counts).item() == (
        pytest.approx(8 / 12)
    )


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_microbatches_and_ranks_equal_one_batch(name):
    """Global counts make the loss a sum over rows, so splitting the batch changes nothing."""
    agg = AGGREGATIONS[name]
    logp, old, ref, adv, mask = batch(seed=1)
    counts = {"num_seqs": 8.0, "num_tokens": float(mask.sum()), "norm_len": NORM_LEN}

    def loss_of(rows):
        per_token = objective(logp[rows], old[rows], ref[rows], adv[rows], mask[rows])
        return agg(per_token, mask[rows], **counts)

    full = loss_of(slice(0, 8))
    full.backward()
    full_grad, logp.grad = logp.grad.clone(), None

    # gradient accumulation: 4 microbatches of 2, each backward adds into .grad
    accumulated = 0.0
    for start in range(0, 8, 2):
        micro = loss_of(slice(start, start + 2))
        micro.backward()
        accumulated += micro.item()
    assert accumulated == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(logp.grad, full_grad, rtol=1e-12, atol=1e-14)

    # 2 ranks of 4 rows, each with its own gradient; DDP all-reduces the MEAN of the ranks'
    # gradients, so each rank's loss is scaled by the world size
    world, rank_grads, rank_losses = 2, [], []
    for rank in range(world):
        logp.grad = None
        loss = loss_of(slice(4 * rank, 4 * rank + 4))
        (loss * world).backward()
        rank_grads.append(logp.grad.clone())
        rank_losses.append(loss.item())
    assert sum(rank_losses) == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(torch.stack(rank_grads).mean(0), full_grad, rtol=1e-12, atol=1e-14)
    assert full_grad.abs().max() > 1e-3
