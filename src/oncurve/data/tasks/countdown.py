"""Countdown (as in TinyZero): reach a target from 3-4 numbers with + - * / and brackets, each
number used exactly once. The target is built by combining the numbers, so every example has
a solution; the `answer` column holds that solution (shown in samples, not used to score)."""

from __future__ import annotations

import random

from oncurve.data.tasks.base import TooFewProblems, hash_split
from oncurve.rewards.countdown import countdown_reward
from oncurve.rewards.format import think_answer_format_reward
from oncurve.rewards.registry import RewardFn

PROMPT = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use + - * / "
    "and brackets, and each number must be used exactly once. Think in <think> </think> tags, "
    "then give only the equation in <answer> </answer> tags, e.g. <answer>(1 + 2) * 3</answer>."
)


def make_problem(rng: random.Random, count: int, max_number: int) -> tuple[list[int], int, str]:
    """(numbers, target, a solution) from combining random numbers pairwise; the target is a
    positive integer."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        terms = [(n, str(n)) for n in numbers]
        while len(terms) > 1:
            (a, ea), (b, eb) = (terms.pop(rng.randrange(len(terms))) for _ in range(2))
            options = [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
            if a > b:
                options.append((a - b, f"({ea} - {eb})"))
            if b and a % b == 0:
                options.append((a // b, f"({ea} / {eb})"))
            terms.append(rng.choice(options))
        target, solution = terms[0]
        if 0 < target <= 1000:
            return numbers, target, _strip_outer(solution)


class CountdownTask:
    """Countdown with a count of numbers drawn from `counts` (3 or 4 by default), each in
    1..max_number; satisfies `LeveledTask`: level k draws its count from the k + 1 smallest
    of `counts`, so level 0 has the fewest numbers and the last is the task's own mix."""

    name = "countdown"
    reward_weights = {"correct": 1.0, "format": 0.1}

    def __init__(self, counts: tuple[int, ...] = (3, 4), max_number: int = 99) -> None:
        # a problem needs two numbers to combine, and numbers above 1 to reach a target
        ok = isinstance(counts, list | tuple) and counts
        if not ok or not all(type(c) is int and 2 <= c <= 6 for c in counts):
            raise ValueError(f"counts must be a list of whole numbers in [2, 6], got {counts!r}")
        if type(max_number) is not int or not 2 <= max_number <= 1000:
            raise ValueError(f"max_number must be a whole number in [2, 1000], got {max_number!r}")
        self.counts = tuple(counts)
        self.max_number = max_number
        self.levels = len(counts)

    def examples(
        self, split: str, n: int, seed: int, level: int | None = None
    ) -> list[dict[str, str]]:
        if split not in ("train", "test"):
            raise ValueError(f"countdown: split must be 'train' or 'test', got {split!r}")
        if level is None:
            counts = self.counts
            rng = random.Random(f"countdown-{split}-{seed}")
        elif 0 <= level < self.levels:
            counts = sorted(self.counts)[: level + 1]
            rng = random.Random(f"countdown-{split}-{seed}-level{level}")
        else:
            raise ValueError(f"countdown: level must be in [0, {self.levels}), got {level}")
        rows, seen = [], set()
        # The attempt budget keeps an impossible `n` (more test problems than small numbers
        # make) from looping forever.
        for _ in range(100 * n + 1000):
            if len(rows) == n:
                break
            numbers, target, solution = make_problem(rng, rng.choice(counts), self.max_number)
            key = f"{sorted(numbers)}->{target}"
            if hash_split(key) != split or (split == "test" and key in seen):
                continue
            seen.add(key)
            rows.append(
                {
                    "prompt": PROMPT.format(numbers=numbers, target=target),
                    "answer": solution,
                    "numbers": ",".join(map(str, numbers)),
                    "target": str(target),
                }
            )
        if len(rows) < n:
            raise TooFewProblems(
                f"countdown: only {len(rows)} distinct {split} problems with max_number="
                f"{self.max_number}, asked for {n}",
                rows,
            )
        return rows

    def reward_fns(self) -> dict[str, RewardFn]:
        return {"correct": countdown_reward, "format": think_answer_format_reward}


def _strip_outer(expression: str) -> str:
    if expression.startswith("(") and expression.endswith(")"):
        depth = 0
        for i, ch in enumerate(expression):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and i < len(expression) - 1:
                return expression
        return expression[1:-1]
    return expression
