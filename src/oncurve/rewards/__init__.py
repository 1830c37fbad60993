"""Reward functions: fn(prompts, completions, **columns) -> list[float | None]."""

from oncurve.rewards.answers import answers_match, extract_answer, normalize_answer, stated_number
from oncurve.rewards.registry import RewardFn, resolve_reward

__all__ = [
    "RewardFn",
    "answers_match",
    "extract_answer",
    "normalize_answer",
    "stated_number",
    "resolve_reward",
]
