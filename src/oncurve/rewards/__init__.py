"""Reward functions: fn(prompts, completions, **columns) -> list[float | None]."""

from oncurve.rewards.extraction import extract_answer
from oncurve.rewards.matching import answers_match
from oncurve.rewards.normalization import normalize_answer, stated_number
from oncurve.rewards.registry import RewardFn, resolve_reward

__all__ = [
    "RewardFn",
    "answers_match",
    "extract_answer",
    "normalize_answer",
    "stated_number",
    "resolve_reward",
]
