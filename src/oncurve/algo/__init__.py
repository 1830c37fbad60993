"""Per-token GRPO math: pure torch functions, no config objects, no I/O."""

from oncurve.algo.advantages import clipped_value_loss, gae, group_advantages, rloo_advantages
from oncurve.algo.aggregation import seq_mean_token_mean, seq_mean_token_sum_norm, token_mean
from oncurve.algo.correction import (
    correction_metrics,
    logprob_diff_mean,
    sequence_mask,
    sequence_truncate,
    token_mask,
    token_truncate,
)
from oncurve.algo.kl import kl_k1, kl_k2, kl_k3, warmup_beta
from oncurve.algo.logprobs import entropy_from_logits, logprobs_from_hidden, logprobs_from_logits
from oncurve.algo.losses import cispo, gspo, ppo_clip
from oncurve.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    lookup,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "cispo",
    "clipped_value_loss",
    "correction_metrics",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "gspo",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "logprob_diff_mean",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "lookup",
    "ppo_clip",
    "rloo_advantages",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "sequence_mask",
    "sequence_truncate",
    "token_mask",
    "token_mean",
    "token_truncate",
    "warmup_beta",
]
