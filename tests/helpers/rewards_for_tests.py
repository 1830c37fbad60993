"""Reward functions that tests name by import path (`helpers.rewards_for_tests:...`)."""

import asyncio


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


# Written as TRL's documentation writes reward functions: keyword arguments, conversational
# completions indexed `completion[0]["content"]`, the gold as `solution`, the extra arguments.


def think_format_reward(completions, **kwargs):
    """TRL's shape of a format reward on conversational data."""
    return [1.0 if "<" in completion[0]["content"] else 0.0 for completion in completions]


def accuracy_reward(completions, solution, **kwargs):
    """TRL's shape of an accuracy reward: `solution` is a dataset column."""
    contents = [completion[0]["content"] for completion in completions]
    return [
        1.0 if gold in content else 0.0 for content, gold in zip(contents, solution, strict=True)
    ]


def logging_reward(prompts, completions, completion_ids, trainer_state, log_extra, log_metric,
                   **kwargs):  # fmt: skip
    """Every extra argument TRL passes: scores the completion's token count, logs the step and
    the run's steps, the prompt's last message and a metric."""
    log_extra("step_seen", [trainer_state.global_step] * len(completions))
    log_extra("of_steps", [trainer_state.max_steps] * len(completions))
    log_extra("asked", [prompt[-1]["content"] for prompt in prompts])
    log_metric("logging_reward/tokens", sum(map(len, completion_ids)) / len(completion_ids))
    return [float(len(ids)) for ids in completion_ids]


async def async_length_reward(completions, **kwargs):
    """An `async def` reward, as TRL awaits them."""
    await asyncio.sleep(0)
    return [float(len(completion[0]["content"])) for completion in completions]


FIRST_LOOP = []


async def same_loop_reward(completions, **kwargs):
    """1.0 per completion while every call runs on the event loop of the first (as a client
    made on the first call needs); an error on any other loop."""
    loop = asyncio.get_running_loop()
    FIRST_LOOP[:] = FIRST_LOOP or [loop]
    if loop is not FIRST_LOOP[0]:
        raise RuntimeError("awaited on another event loop than the first call's")
    return [1.0] * len(completions)


def text_prompt_reward(prompts, completions, **kwargs):
    """A reward for TRL's standard format: prompts and completions are text."""
    assert all(isinstance(p, str) for p in prompts + completions), (prompts, completions)
    return [float(len(completion)) for completion in completions]


def raises_value_error(prompts, completions, **columns):
    raise ValueError("no score for these")
