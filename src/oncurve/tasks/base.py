"""The Task protocol: a source of prompt/answer rows and the rewards that score them."""

from __future__ import annotations

import hashlib
from typing import Protocol

from oncurve.rewards.registry import RewardFn


class Task(Protocol):
    """A built-in task. The trainer calls `examples` for the train and test splits and scores
    completions with `reward_fns` (each weighted 1.0 unless the task has a `reward_weights`
    dict attribute)."""

    name: str

    def examples(self, split: str, n: int, seed: int) -> list[dict[str, str]]:
        """`n` rows with "prompt", "answer" and any other columns the rewards read; `split` is
        "train" or "test", and the two splits never share a prompt for the same seed."""
        ...

    def reward_fns(self) -> dict[str, RewardFn]:
        """Reward functions by metric name: fn(prompts, completions, **columns)."""
        ...


def hash_split(key: str, test_percent: int = 10) -> str:
    """ "train" or "test" from a fixed hash of `key` (a problem's identity), so generated splits
    never share a problem whatever the seed."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 100
    return "test" if bucket < test_percent else "train"
