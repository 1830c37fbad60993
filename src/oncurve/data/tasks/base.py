"""The Task protocol: a source of prompt/answer rows and the rewards that score them."""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Protocol, TypeVar

from oncurve.errors import UserError
from oncurve.rewards.registry import RewardFn

T = TypeVar("T")


class TooFewProblems(ValueError):
    """A split asked for more distinct problems than it has (or than a task's search found);
    `rows`: the ones there are, in the order the draw gave them."""

    def __init__(self, message: str, rows: list) -> None:
        super().__init__(message)
        self.rows = rows


class Task(Protocol):
    """A built-in task. The trainer calls `examples` for the train and test splits and scores
    completions with `reward_fns` (each weighted 1.0 unless the task has a `reward_weights`
    dict attribute)."""

    name: str

    def examples(self, split: str, n: int, seed: int) -> list[dict[str, str]]:
        """`n` rows with "prompt", "answer" and any other columns the rewards read; `split` is
        "train" or "test", and the two splits never share a prompt for the same seed. Test
        rows are distinct problems: asking for more than the split has raises
        `TooFewProblems`."""
        ...

    def reward_fns(self) -> dict[str, RewardFn]:
        """Reward functions by metric name: fn(prompts, completions, **columns)."""
        ...


class LeveledTask(Task, Protocol):
    """A task with a difficulty knob, for `data.curriculum=difficulty`: `levels` (at least 2)
    levels, 0 the easiest. `examples(..., level=k)` draws rows of level k; without `level` a
    task draws its own distribution, as any `Task` does."""

    levels: int

    def examples(
        self, split: str, n: int, seed: int, level: int | None = None
    ) -> list[dict[str, str]]: ...


def task_levels(task: Task) -> int:
    """The difficulty levels of `task` (`LeveledTask`), 0 when it has no difficulty knob."""
    return getattr(task, "levels", 0)


def leveled_examples(task: Task, n: int, seed: int) -> list[dict]:
    """`n` train rows (rounded up to a multiple of the levels) of a `LeveledTask`, an equal
    share of each level, easiest first, each with its level in a "level" column."""
    levels = task_levels(task)
    if levels < 2:
        raise UserError(
            f"data.curriculum=difficulty needs a task with difficulty levels (arith, countdown, "
            f"or gym:<dataset> with a reasoning-gym curriculum); {task.name} has none"
        )
    share = -(-n // levels)
    return [
        {**row, "level": level}
        for level in range(levels)
        for row in task.examples("train", share, seed, level=level)
    ]


TEST_BUCKETS = 10  # 1 in 10 problems is held out for the test split


def draw_split(task: str, pool: Sequence[T], split: str, n: int, seed: int) -> list[T]:
    """`n` problems of `split` from its `pool`: train problems drawn with repetition, test
    problems distinct, both in an order seeded by (task, split, seed); asking for more test
    problems than the pool holds gives them all (`all_drawn` says so to the caller)."""
    rng = random.Random(f"{task}:{split}:{seed}")
    if split == "test":
        return rng.sample(list(pool), min(n, len(pool)))
    return [rng.choice(pool) for _ in range(n)]


def all_drawn(task: str, rows: list, n: int) -> list:
    """`rows` when they are the `n` test rows asked for; `TooFewProblems` (holding them) when
    the split had fewer."""
    if len(rows) < n:
        raise TooFewProblems(f"{task}: only {len(rows)} test problems, asked for {n}", rows)
    return rows


def hash_split(key: str) -> str:
    """ "train" or "test" from a fixed hash of `key` (a problem's identity): "test" when the
    key's CRC-32 falls in one bucket of `TEST_BUCKETS`. The hash depends on no seed, so every
    seed of one split avoids every problem of the other."""
    return "test" if zlib.crc32(key.encode()) % TEST_BUCKETS == 0 else "train"


def commuted_split(key: str, twin: str | None) -> str | None:
    """The split of a problem whose commuted twin (the same sum with its operands swapped, one
    problem to learn) has the key `twin`, None when the twin is no problem of the task: "train"
    when `hash_split(key)` says so, as for any problem; "test" when both keys hash to the test
    split; None (neither split) for a problem whose own key hashes to test and its twin's to
    train, so that no held-out problem is a training prompt's twin."""
    split = hash_split(key)
    if split == "test" and twin is not None and hash_split(twin) == "train":
        return None
    return split
