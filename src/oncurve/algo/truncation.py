"""The truncated sampling distribution (top-k, top-p, min-p) as the policy being trained.

With truncation the sampler draws from pi_K(a|s) = pi(a|s) / Z_K(s), over the tokens K(s) that
the truncation keeps under the policy's own logits at s. oncurve trains that policy: the
sampler records log pi_K of what it drew and the training forward applies the same truncation
to its own logits, so at mu = 1 both are one distribution and the importance weight is exact.
Which tokens are kept is piecewise constant in the logits, so the gradient flows through the
kept logits alone.

`keep_threshold` is the one definition of K that the samplers and the training forward share:
a logit per row, and K is every token whose logit reaches it. A threshold, not a mask, because
the training forward's backward recomputes the logits in vocabulary blocks, with other kernels
whose rounding may differ: it sits halfway between the least likely kept token and the likeliest
dropped one, so that such rounding does not move a token across it.

The chosen token always counts in its own normaliser (`chosen_normaliser`): log p_a / (Z_K + p_a)
for a token outside K. For a token inside K that is log pi_K(a); outside it, where pi_K(a) = 0
(an update moved the policy, the reference model's truncation, rounding at the boundary, the
padding and observation tokens of a row), it is finite and continuous as the token leaves K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Truncation:
    """Which tokens the sampling distribution keeps, applied in this order (as transformers
    does): the `top_k` likeliest (0 keeps all; ties with the k-th are kept), then, renormalised,
    the smallest set of likeliest tokens whose mass reaches `top_p` (ties with its least likely
    are kept), then the tokens whose probability is at least `min_p` times the top one's."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def active(self) -> bool:
        """Whether any token can be dropped."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0


KEEP_ALL = Truncation()


def keep_mask(logits: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """`[..., V]` True on the tokens that `truncation` keeps, from `[..., V]` float32 logits
    (already divided by the temperature); at least the likeliest token of each row. Static
    shapes and no host reads, so that a captured decode step can hold it."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < truncation.top_k < logits.shape[-1]:
        kth = logits.topk(truncation.top_k, dim=-1).values[..., -1:]
        keep = logits >= kth
        logits = logits.masked_fill(~keep, float("-inf"))
    if truncation.top_p < 1 or truncation.min_p > 0:
        probs = logits.softmax(-1)
    if truncation.top_p < 1:
        sorted_probs = probs.sort(dim=-1, descending=True).values
        # the nucleus: the tokens whose more likely ones hold less than top_p of the mass; its
        # smallest probability is the floor, so nothing is scattered back to vocabulary order
        # (a scatter that deterministic mode reroutes through a host copy on CUDA)
        before = sorted_probs.cumsum(-1) - sorted_probs
        kept = (before < truncation.top_p).sum(-1, keepdim=True)
        keep &= probs >= sorted_probs.gather(-1, kept - 1)
    if truncation.min_p > 0:
        keep &= probs >= truncation.min_p * probs.amax(-1, keepdim=True)
    return keep


def keep_threshold(logits: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """`[..., 1]` the logit that the tokens `truncation` keeps reach (`logits >= threshold`)
    and the ones it drops do not: halfway between the least likely kept token and the likeliest
    dropped one (-inf when none is dropped). From `[..., V]` float32 logits divided by the
    temperature; static shapes and no host reads."""
    keep = keep_mask(logits, truncation)
    least_kept = logits.masked_fill(~keep, float("inf")).amin(-1, keepdim=True)
    most_dropped = logits.masked_fill(keep, float("-inf")).amax(-1, keepdim=True)
    middle = (least_kept + most_dropped) / 2  # -inf when none is dropped
    # two neighbouring floats have no float between them: the middle then rounds to one of them
    clear = (middle > most_dropped) | (most_dropped == float("-inf"))
    return torch.where(clear, middle, least_kept)


def kept_logsumexp(logits: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """`[..., 1]` log Z_K: the logsumexp of the `[..., V]` logits that reach `threshold`
    `[..., 1]`."""
    kept = logits.masked_fill(logits < threshold, float("-inf"))
    return torch.logsumexp(kept, dim=-1, keepdim=True)


def chosen_normaliser(
    chosen: torch.Tensor, kept_lse: torch.Tensor, threshold: torch.Tensor
) -> torch.Tensor:
    """`[..., 1]` the log-normaliser of the chosen tokens' probability, whose logits are
    `chosen` `[..., 1]`: over the kept tokens (`kept_lse`, `[..., 1]`) and the chosen token
    itself, so log Z_K when it reaches `threshold` `[..., 1]`, else log(Z_K + p_a). Its
    log-probability is `chosen` minus this."""
    return torch.where(chosen >= threshold, kept_lse, torch.logaddexp(kept_lse, chosen))


def truncated_entropy(logits: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """`[...]` the entropy of the truncated distribution pi_K: softmax over the `[..., V]` logits
    that reach `threshold` `[..., 1]`."""
    kept = logits.masked_fill(logits < threshold, float("-inf"))
    return torch.special.entr(kept.softmax(-1)).sum(-1)
