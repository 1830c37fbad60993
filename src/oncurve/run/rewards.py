"""The run's rewards: the reward runner a config and its task define."""

from __future__ import annotations

import torch

from oncurve.config import Config
from oncurve.data.prompts import correctness_fn
from oncurve.data.tasks.base import Task
from oncurve.errors import UserError
from oncurve.model.devices import DTYPES, resolve_dtype
from oncurve.rewards.registry import (
    RewardFn,
    episode_reward,
    length_penalty,
    overlong_penalty,
    resolve_reward,
    with_answer_match,
)
from oncurve.rewards.runner import RewardRunner, runner_settings


def build_rewards(
    config: Config, task: Task | None, device: str | torch.device = "cpu"
) -> RewardRunner:
    """The configured reward functions, or when `reward.functions` is empty the environment's, the
    task's own, or for a dataset the `correct` reward; DAPO's soft overlong penalty is added when
    `reward.overlong_buffer` > 0 (never by name), and the `length` penalty is taken against
    `rollout.max_new_tokens`. The runner's verifier is the reward among them that `correctness_fn`
    returns (what evaluation calls correct), if any. A `model:PATH_OR_ID` reward model is loaded on
    `device` (the trainer's) in `model.dtype`, with `model.trust_remote_code`, and reads
    `data.system_prompt` and `data.chat_template_kwargs`. A reward with a `configure` method
    (the `code_tests` reward) is given the `reward` section."""
    fns: list[tuple[str, RewardFn, float]] = []
    reward = config.reward
    if reward.functions:
        device = torch.device(device)
        dtype = DTYPES[resolve_dtype(config.model.dtype, device)]
        for spec in reward.functions:
            name, fn = resolve_reward(
                spec.name,
                device=device,
                dtype=dtype,
                trust_remote_code=config.model.trust_remote_code,
                system_prompt=config.data.system_prompt,
                chat_template_kwargs=config.data.chat_template_kwargs,
            )
            if fn is overlong_penalty:
                raise UserError(
                    "reward.functions: overlong is set by reward.overlong_buffer (its window in "
                    "tokens before rollout.max_new_tokens) and reward.overlong_penalty"
                )
            if fn is length_penalty:  # against the run's own limit, not the function's default
                fn = _with_settings(length_penalty, max_len=config.rollout.max_new_tokens)
            fns.append((name, fn, spec.weight))
    elif config.rollout.env is not None:
        fns = [("env", episode_reward, 1.0)]
    elif task is not None:
        weights = getattr(task, "reward_weights", {})
        fns = [(name, fn, weights.get(name, 1.0)) for name, fn in task.reward_fns().items()]
    else:  # a dataset: its reference answers decide, as evaluation's `correct` does
        fns = [("correct", resolve_reward("correct")[1], 1.0)]
    fns = [(name, with_answer_match(fn, reward.answer_match), w) for name, fn, w in fns]
    if reward.overlong_buffer:
        penalty = _with_settings(
            overlong_penalty,
            max_len=config.rollout.max_new_tokens,
            buffer=reward.overlong_buffer,
            factor=reward.overlong_penalty,
        )
        fns.append(("overlong", penalty, 1.0))
    # A reward with settings of its own (the code sandbox's) takes them now, before step 1.
    for _, fn, _ in fns:
        if hasattr(fn, "configure"):
            fn.configure(reward)
    correct = correctness_fn(config, task)
    # Compared with ==, not `is`: a task's reward may be a bound method, made afresh per access.
    verifier = next((name for name, fn, _ in fns if fn == correct), None)
    return RewardRunner(fns, verifier=verifier, **runner_settings(reward))


def _with_settings(fn: RewardFn, **settings: object) -> RewardFn:
    """`fn` called with `settings` whatever the data's columns are named (a `max_len` or
    `factor` column would override `functools.partial`'s keywords)."""

    def call(prompts: list[str], completions: list[str], **columns: object) -> list:
        return fn(prompts, completions, **{**columns, **settings})

    return call
