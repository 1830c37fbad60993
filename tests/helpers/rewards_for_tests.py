"""Reward functions that tests name by import path (`helpers.rewards_for_tests:...`)."""


def count_digits(prompts, completions, **columns):
    """Fraction of digit characters: varied on random text, so groups have advantages."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def constant(prompts, completions, **columns):
    return [0.5 for _ in completions]


def fails_on_rank_1(prompts, completions, **columns):
    import os

    if os.environ.get("RANK") == "1":
        raise RuntimeError("boom on rank 1")
    return [0.0 for _ in completions]


class DigitsEnv:
    """A multi-turn environment (`rollout.env=helpers.rewards_for_tests:DigitsEnv`): answers
    each turn with how many digits it held, rewards their fraction of its characters, and ends
    the episode after `turns` turns."""

    def __init__(self, turns: int = 2) -> None:
        self.left = turns

    def reset(self, row: dict) -> str:
        return row["prompt"]

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        self.left -= 1
        digits = sum(c.isdigit() for c in turn)
        return f"digits {digits}", digits / max(len(turn), 1), self.left == 0
