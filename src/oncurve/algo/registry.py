"""Name -> function tables, one per kind; configs name entries by string. A new variant is a
function with its kind's signature, one line here, and its test."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from oncurve.algo.advantages import group_advantages, rloo_advantages
from oncurve.algo.aggregation import seq_mean_token_mean, seq_mean_token_sum_norm, token_mean
from oncurve.algo.kl import kl_k1, kl_k2, kl_k3
from oncurve.algo.losses import cispo, gspo, ppo_clip
from oncurve.errors import UserError

# fn(rewards [B*G], group_size, *, scale, eps, batch_std=None) -> [B*G]
ADVANTAGE_ESTIMATORS: dict[str, Callable] = {"grpo": group_advantages, "rloo": rloo_advantages}
# fn(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high, dual_clip) -> (loss, metrics)
POLICY_LOSSES: dict[str, Callable] = {"ppo_clip": ppo_clip, "gspo": gspo, "cispo": cispo}
# fn(per_token, mask, *, num_seqs, num_tokens, norm_len) -> scalar
AGGREGATIONS: dict[str, Callable] = {
    "seq-mean-token-mean": seq_mean_token_mean,
    "token-mean": token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
# fn(logprobs, ref_logprobs) -> [N, T]
KL_ESTIMATORS: dict[str, Callable] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}

TABLES: dict[str, dict[str, Callable]] = {
    "advantage estimator": ADVANTAGE_ESTIMATORS,
    "policy loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "KL estimator": KL_ESTIMATORS,
}


def lookup(table: str | Mapping[str, Callable], name: str) -> Callable:
    """The entry `name` of `table` (one of the dicts above, or its key in `TABLES`).

    Raises `UserError` (a ValueError), e.g. "unknown policy loss 'x'; choose one of: ...".
    """
    if isinstance(table, str):
        if table not in TABLES:
            raise ValueError(f"unknown registry {table!r}; choose one of: {', '.join(TABLES)}")
        kind, entries = table, TABLES[table]
    else:
        kind = next((k for k, t in TABLES.items() if t is table), "entry")
        entries = table
    if name not in entries:
        raise UserError(f"unknown {kind} {name!r}; choose one of: {', '.join(entries)}")
    return entries[name]
