"""Named presets (`algo.preset`) and the defaults an advantage estimator brings."""

from __future__ import annotations

import weakref
from fractions import Fraction
from typing import Any

# Each preset is a nested mapping of sections, as in a YAML file: it may set keys of any section.
# GSPO's clip, DAPO's clip-higher and CISPO's cap bind only where the policy has moved since
# sampling: with algo.mu * algo.minibatches = 1 every importance ratio is 1. Their papers update
# off-policy (GSPO: each rollout batch in 4 minibatches, as TRL's GSPO recipe's
# steps_per_generation=4; DAPO: 16, 512 prompts in minibatches of 32; MiniMax-M1's CISPO too):
# their presets take 4, which the default 16 prompts per step fill on up to 4 ranks.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # DeepSeekMath: group z-score, per-sequence token mean, k3 KL in the loss, symmetric clip.
    "grpo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "ppo_clip",
            "loss_agg": "seq-mean-token-mean",
            "beta": 0.04,
            "epsilon": 0.2,
        },
    },
    # Dr.GRPO: no std division, constant length normaliser, no KL.
    "dr_grpo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "none",
            "loss": "ppo_clip",
            "loss_agg": "seq-mean-token-sum-norm",
            "beta": 0.0,
            "epsilon": 0.2,
        },
    },
    # DAPO: token-level loss, clip-higher, dynamic sampling, soft overlong penalty
    # (`PRESET_SHARES`), no KL.
    "dapo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "ppo_clip",
            "loss_agg": "token-mean",
            "beta": 0.0,
            "epsilon": 0.2,
            "epsilon_high": 0.28,
            "dynamic_sampling": True,
            "minibatches": 4,
        },
    },
    # GSPO: sequence-level ratio with its much smaller clip range.
    "gspo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "gspo",
            "loss_agg": "seq-mean-token-mean",
            "beta": 0.0,
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
            "minibatches": 4,
        },
    },
    # CISPO (MiniMax-M1): token-level REINFORCE with a stopped-gradient importance weight,
    # capped above only (a ratio is never below 1 - 1), at 5 as TRL recommends; no KL.
    "cispo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "cispo",
            "loss_agg": "token-mean",
            "beta": 0.0,
            "epsilon": 1.0,
            "epsilon_high": 4.0,
            "minibatches": 4,
        },
    },
    # PPO with a learned critic (the baseline GRPO is measured against).
    "ppo": {
        "algo": {
            "estimator": "gae",
            "adv_scale": "none",
            "loss": "ppo_clip",
            "loss_agg": "token-mean",
            "beta": 0.04,
            "epsilon": 0.2,
            # The classic RLHF penalty: -beta * log(pi/pi_ref) on every token's reward.
            "kl_in_reward": True,
            "kl_estimator": "k1",
        },
    },
}


# Settings a preset sizes as a share of rollout.max_new_tokens (rounded up), layered with the
# preset once max_new_tokens is final (the user's, the bundled model's or the default): DAPO's
# soft overlong penalty covers the last 4096 of its 20480 new tokens.
PRESET_SHARES: dict[str, dict[str, dict[str, Fraction]]] = {
    "dapo": {"reward": {"overlong_buffer": Fraction(1, 5)}},
}


# Layered above the preset, below the user's keys: a preset's adv_scale is chosen for its own
# estimator, and group-std scaling would turn RLOO into GRPO x k/(k-1) (TRL and verl divide
# RLOO advantages by no std). Keys of the algo section.
ESTIMATOR_DEFAULTS: dict[str, dict[str, Any]] = {"rloo": {"adv_scale": "none"}}


# Layered just above the field defaults, below the preset, when model.path is `default`: the
# bundled 0.8M-parameter model's own settings (the defaults are a real pretrained model's). Its
# context has room for 64 new tokens, and it learns arith at 1e-4 in 150 steps.
BUNDLED_MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "optim": {"lr": 1e-4},
    "rollout": {"max_new_tokens": 64},
    "eval": {"num_prompts": 500},
}


# The algo sections loading built, whose preset it applied (below the settings given): a config
# made or changed in Python with another algo section has had no preset applied.
_APPLIED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def mark_preset_applied(algo: Any) -> None:
    """Record that loading applied `algo.preset` to the config that holds `algo`."""
    _APPLIED[id(algo)] = algo


def preset_applied(algo: Any) -> bool:
    """Whether `algo` is an algo section loading built (and applied its preset to)."""
    return _APPLIED.get(id(algo)) is algo
