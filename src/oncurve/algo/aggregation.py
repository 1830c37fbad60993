"""Reduce a per-token loss `[N, T]` to the scalar that is back-propagated, one signature:

    fn(per_token [N, T], mask [N, T], *, num_seqs, num_tokens, norm_len) -> scalar

`num_seqs` and `num_tokens` are GLOBAL counts: rows and mask tokens of the whole optimizer step
(every microbatch, every rank). Each function is then a sum of per-row terms divided by a
constant, so the losses of the microbatches (and the ranks) add up to the loss of the one big
batch, and so do their gradients. Under DDP, which averages gradients over ranks, scale each
rank's loss by the world size to get the same sum. Rows with no mask tokens contribute 0.
"""

from __future__ import annotations

import torch

from oncurve.algo.registry import AGGREGATIONS, registered


@registered(AGGREGATIONS, "seq-mean-token-mean")
def seq_mean_token_mean(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_seqs: float,
    num_tokens: float,
    norm_len: float,
) -> torch.Tensor:
    """GRPO (DeepSeekMath): `sum_i (sum_t l_it m_it / |o_i|) / num_seqs`, `|o_i| = sum_t m_it`.

    Each sequence weighs the same whatever its length (a long answer's tokens weigh less).
    """
    lengths = mask.sum(1).clamp(min=1)
    return ((per_token * mask).sum(1) / lengths).sum() / num_seqs


@registered(AGGREGATIONS, "token-mean")
def token_mean(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_seqs: float,
    num_tokens: float,
    norm_len: float,
) -> torch.Tensor:
    """DAPO: `sum_it l_it m_it / num_tokens`; each token weighs the same."""
    return (per_token * mask).sum() / num_tokens


@registered(AGGREGATIONS, "seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_seqs: float,
    num_tokens: float,
    norm_len: float,
) -> torch.Tensor:
    """Dr.GRPO: `sum_it l_it m_it / (norm_len * num_seqs)`, `norm_len` a constant such as
    max_new_tokens, so there is no length bias and no dependence on the batch's lengths."""
    return (per_token * mask).sum() / (norm_len * num_seqs)
