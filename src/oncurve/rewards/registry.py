"""Reward functions by name: built-ins, `module:function` paths, functions given to `train`.

Every built-in follows one protocol: `fn(prompts, completions, **columns) -> list[float | None]`,
where `columns` are the dataset's other fields, repeated per completion (e.g. `answer`), plus
`completion_lengths` and `completion_ids` from the trainer. None means "does not apply to this
row". A `module:function` reward is called as TRL calls it (`oncurve.rewards.trl_contract`). A
`model:PATH_OR_ID` spec is a learned reward model (`oncurve.rewards.model.RewardModel`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rewards.code import code_tests_reward
from oncurve.rewards.countdown import countdown_reward
from oncurve.rewards.extraction import extract_answer
from oncurve.rewards.format import (
    boxed_format_reward,
    length_penalty,
    overlong_penalty,
    tags_format_reward,
    think_answer_format_reward,
)
from oncurve.rewards.matching import answers_match, usable_gold
from oncurve.rewards.model import PREFIX as MODEL_PREFIX
from oncurve.rewards.model import RewardModel
from oncurve.rewards.trl_contract import TrlReward, reward_name

RewardFn = Callable[..., list[float | None]]


def answer_match_reward(
    prompts: list[str], completions: list[str], *, answer: list[Any] | None = None, **columns: Any
) -> list[float | None]:
    """1.0 when the extracted answer (`extract_answer(style="auto")`) matches the `answer`
    column under strict matching (`answers_match`: a numeric reference is matched only by a
    stated number, and no answer may restate the prompt), else 0.0; None for a row whose
    reference answer is missing or malformed (`usable_gold`: empty, NaN, `None`, `0/0`)."""
    return _answer_scores(prompts, completions, answer, strict=True)


def lenient_answer_match_reward(
    prompts: list[str], completions: list[str], *, answer: list[Any] | None = None, **columns: Any
) -> list[float | None]:
    """`answer_match_reward` whose matching also pays for any expression that math-verify finds
    equal to the reference, the question restated included (`reward.answer_match: lenient`)."""
    return _answer_scores(prompts, completions, answer, strict=False)


def _answer_scores(
    prompts: list[str], completions: list[str], answer: list[Any] | None, strict: bool
) -> list[float | None]:
    if answer is None:
        raise UserError("reward 'correct' needs an 'answer' column in the data")
    scores: list[float | None] = []
    for prompt, completion, gold in zip(prompts, completions, answer, strict=True):
        reference = usable_gold(gold)
        if reference is None:
            scores.append(None)
        else:
            right = answers_match(
                extract_answer(completion), reference, prompt=prompt, strict=strict
            )
            scores.append(1.0 if right else 0.0)
    return scores


# The `correct` reward under either matching (`reward.answer_match`).
ANSWER_MATCH_REWARDS = (answer_match_reward, lenient_answer_match_reward)


def with_answer_match(fn: RewardFn, mode: str) -> RewardFn:
    """`fn`, or the `correct` reward of matching `mode` ("strict" | "lenient",
    `reward.answer_match`) when `fn` is the strict one."""
    if fn is answer_match_reward and mode == "lenient":
        return lenient_answer_match_reward
    return fn


def episode_reward(
    prompts: list[str],
    completions: list[str],
    *,
    episode_reward: list[float] | None = None,
    episode_metrics: list[dict[str, float]] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **columns: Any,
) -> list[float | None]:
    """The environment's reward of each multi-turn episode: the `episode_reward` column that
    runs with `rollout.env` add (`oncurve.rollout.episodes`). The numbers a harness returned
    beside an episode's reward (`episode_metrics`) are logged as `env/<name>`, averaged over
    the episodes that have them."""
    if episode_reward is None:
        raise UserError("reward 'env' needs rollout.env: it reads the episodes' own rewards")
    if log_metric is not None:
        for metrics in episode_metrics or []:
            for name, value in metrics.items():
                log_metric(f"env/{name}", value)
    return [float(v) for v in episode_reward]


episode_reward.takes_context = True  # type: ignore[attr-defined]  # its log_metric, for the metrics


# Built-ins that score each row alone: the runner calls them one row at a time, so that a slow
# row costs its own timeout, not the whole batch's (`oncurve.rewards.runner`).
for _fn in (
    *ANSWER_MATCH_REWARDS,
    think_answer_format_reward,
    tags_format_reward,
    boxed_format_reward,
    countdown_reward,
):
    _fn.rowwise = True  # type: ignore[attr-defined]

BUILTINS: dict[str, RewardFn] = {
    "correct": answer_match_reward,
    "format": think_answer_format_reward,
    "tags_format": tags_format_reward,
    "boxed_format": boxed_format_reward,
    "overlong": overlong_penalty,
    "length": length_penalty,
    "countdown": countdown_reward,
    "code_tests": code_tests_reward,
    "env": episode_reward,
}


# Reward functions handed to `oncurve.train(reward_funcs=...)`, by the name their spec carries
# (`given:<name>`): the config names them, the process holds them.
GIVEN_PREFIX = "given:"
_GIVEN: dict[str, RewardFn] = {}


def give_rewards(fns: Sequence[Callable[..., Any] | str]) -> list[str]:
    """Specs that `resolve_reward` resolves to `fns`, passed as TRL's `reward_funcs` are: a
    callable (a function, a factory's closure, an object with `__call__`) is `given:<name>`,
    named as TRL names it (`reward_name`), numbered after the first where two of them share
    one (a run given a function of a name an earlier run of the process was given takes its
    place); a string is a reward model's directory or Hub id, `model:<string>`, as TRL loads
    one. A model object is refused: TRL scores it with a tokenizer given apart, oncurve loads
    a reward model with its own from its path."""
    specs = []
    for fn in fns:
        if isinstance(fn, str):
            specs.append(fn if fn.startswith(MODEL_PREFIX) else MODEL_PREFIX + fn)
            continue
        if isinstance(fn, torch.nn.Module):
            raise UserError(
                f"reward_funcs: a {type(fn).__name__} object; pass a reward model as its "
                "directory or Hub id (a string), which oncurve loads with its tokenizer"
            )
        if not callable(fn):
            raise UserError(f"reward_funcs: {fn!r} is not callable")
        name = reward_name(fn)
        spec, count = f"{GIVEN_PREFIX}{name}", 1
        while spec in specs:
            count += 1
            spec = f"{GIVEN_PREFIX}{name}_{count}"
        _GIVEN[spec] = fn
        specs.append(spec)
    return specs


def resolve_reward(
    spec: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    system_prompt: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, RewardFn]:
    """(metric name, function) for a built-in name, a `package.module:function` path or a
    function given to `train` (`give_rewards`; either's metric name is the function's name;
    called with TRL's contract, `TrlReward`) or
    `model:PATH_OR_ID`, a reward model loaded on `device` in `dtype`, which reads a text prompt
    after `system_prompt` and renders its chat template with `chat_template_kwargs` (named
    `model:<last part of PATH_OR_ID>`; see `oncurve.rewards.model`)."""
    if spec in BUILTINS:
        return spec, BUILTINS[spec]
    if spec.startswith(GIVEN_PREFIX):
        if spec not in _GIVEN:
            raise UserError(
                f"reward {spec!r}: a function passed to oncurve.train(reward_funcs=...), which "
                "this process was not given (pass it again, or name it `module:function`)"
            )
        return spec[len(GIVEN_PREFIX) :], TrlReward(_GIVEN[spec])
    if spec.startswith(MODEL_PREFIX):
        source = spec[len(MODEL_PREFIX) :]
        if not source:
            raise UserError(f"reward {spec!r}: name a model directory or Hub id after 'model:'")
        model = RewardModel(
            source,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            system_prompt=system_prompt,
            chat_template_kwargs=chat_template_kwargs,
        )
        return model.name, model
    if ":" not in spec:
        raise UserError(
            f"reward {spec!r}: not a built-in ({', '.join(BUILTINS)}) "
            "and not a `module:function` import path"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"reward {spec!r}: cannot import module {module_name!r} ({e})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UserError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise UserError(f"reward {spec!r}: {attr!r} is not callable")
    return attr.rsplit(".", 1)[-1], TrlReward(fn)
