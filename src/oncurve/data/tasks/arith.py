"""`arith`: multi-digit addition with a column-by-column scratchpad, the bundled default task.

Operands are written zero-padded to `max_digits` digits, so a prompt is `0485+0037=`; its
reference completion lists the column sums from the units up, each as two digits (carry,
digit) and including the carry coming in, then the answer in tags:

    0485+0037= 12 12 05 00 <answer>522</answer>

(5+7 = 12; 8+3+1 = 12; 4+0+1 = 05; 0+0 = 00). The padding puts every column at the same
offsets in every prompt: without it a model must also find which digits line up when the
operands differ in length, a positional skill that tiny models learn slowly and that reward
cannot teach (a model that misaligns a length pattern gets every sample of it wrong, so its
group carries no signal). With it, every step of the procedure is a short lookup, so a small
model learns it in minutes and its mistakes are local (a wrong carry, a misread digit): the
kind that reward, not more supervision, can fix.

Operand values have `min_digits` (1) to `max_digits` digits (the count drawn uniformly for each).
Difficulty levels (`data.curriculum=difficulty`) are digit counts: level k has operands of up to
k + 1 digits (exactly k + 1 while that is below `min_digits`), still written `max_digits` wide,
so the last level is the task's own distribution. Train and test
come from disjoint parts of the problem space: a problem belongs to the test split when a
stable hash of its prompt (`hash_split`) says so, whatever the seed, so no seed of one split
ever yields a prompt of the other; a test problem's commuted twin (`0037+0485=` of
`0485+0037=`) is never a training prompt (`commuted_split`).
"""

from __future__ import annotations

import random
import re
from typing import Any

from oncurve.data.tasks.base import TEST_BUCKETS, TooFewProblems, commuted_split
from oncurve.rewards.extraction import extract_answer
from oncurve.rewards.normalization import MAX_ANSWER_CHARS
from oncurve.rewards.registry import RewardFn

SPLITS = ("train", "test")
_INTEGER_RE = re.compile(r"-?\d+")
_WELL_FORMED_RE = re.compile(r"[^<]*<answer>-?\d+</answer>\s*")


def prompt(a: int, b: int, width: int) -> str:
    """`a+b=` with both operands zero-padded to `width` digits."""
    return f"{a:0{width}d}+{b:0{width}d}="


def solution(a: int, b: int, width: int) -> str:
    """The reference completion of `prompt(a, b, width)` (without EOS): one column sum per
    digit of the padded operands, then the tagged answer."""
    if a < 0 or b < 0:
        raise ValueError(f"arith: operands must be non-negative, got {a} and {b}")
    if max(a, b) >= 10**width:
        raise ValueError(f"arith: operands {a} and {b} do not fit in {width} digits")
    columns, carry = [], 0
    for i in range(width):
        total = (a // 10**i) % 10 + (b // 10**i) % 10 + carry
        columns.append(f"{total:02d}")
        carry = total // 10
    return f" {' '.join(columns)} <answer>{a + b}</answer>"


def exact_sum_reward(
    prompts: list[str], completions: list[str], *, answer: list[Any], **columns: Any
) -> list[float | None]:
    """1.0 when the last `<answer>...</answer>` holds the sum as an integer, else 0.0. An
    untagged number, even the right one, earns nothing (the task asks for the tags), and so
    does an expression equal to the sum: a general matcher's symbolic equality would pay for
    the question copied into the tags (`<answer>0485+0037</answer>`), a hack far easier to
    learn than addition. A reference that is no integer (a data file's, scored by this task's
    reward) leaves its row unscored (None)."""
    scores: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        reference = "" if gold is None else str(gold).strip()
        if len(reference) > MAX_ANSWER_CHARS or not _INTEGER_RE.fullmatch(reference):
            scores.append(None)
            continue
        found = extract_answer(completion, style="tags")
        right = (
            found is not None
            and len(found) <= MAX_ANSWER_CHARS  # int() refuses 4,300 digits or more
            and _INTEGER_RE.fullmatch(found)
            and int(found) == int(reference)
        )
        scores.append(1.0 if right else 0.0)
    return scores


def tagged_integer_format_reward(
    prompts: list[str], completions: list[str], **columns: Any
) -> list[float]:
    """1.0 when the completion has one `<answer>` pair, holding an integer, and nothing after
    it but whitespace (a completion that runs on past its answer is not well formed)."""
    return [1.0 if _WELL_FORMED_RE.fullmatch(c) else 0.0 for c in completions]


class ArithTask:
    """Addition of two numbers of `min_digits` to `max_digits` digits each, written
    `max_digits` wide; satisfies `LeveledTask`, with `max_digits` levels.

    Rewards: "correct" (weight 1.0) and "format" (weight 0.1). The format term is small so a
    well-formed wrong answer (0.1) stays far below a right one (1.1); it only matters for a
    policy that breaks its tags, where it ranks tidy completions above broken ones in a group
    whose answers are all wrong.
    """

    name = "arith"
    reward_weights = {"correct": 1.0, "format": 0.1}

    def __init__(self, max_digits: int = 4, min_digits: int = 1) -> None:
        # an int, not merely a number: a float or bool passes the bounds and then breaks the
        # zero-padding format or the operand draw
        # a sum has up to max_digits + 1 digits, and `correct` reads none past MAX_ANSWER_CHARS
        if type(max_digits) is not int or not 1 <= max_digits < MAX_ANSWER_CHARS:
            raise ValueError(
                f"max_digits must be a whole number in [1, {MAX_ANSWER_CHARS - 1}], "
                f"got {max_digits!r}"
            )
        if type(min_digits) is not int or not 1 <= min_digits <= max_digits:
            raise ValueError(
                f"min_digits must be a whole number in [1, max_digits={max_digits}], "
                f"got {min_digits!r}"
            )
        self.max_digits = max_digits
        self.min_digits = min_digits
        self.levels = max_digits

    def examples(
        self, split: str, n: int, seed: int, level: int | None = None
    ) -> list[dict[str, str]]:
        """`n` problems of `split` ("train" or "test") drawn with `seed`, of difficulty `level`
        (None: the task's own distribution): rows {"prompt", "answer", "solution"}. Test
        problems are distinct, so each counts once in an accuracy; train problems may repeat,
        so that small problems (there are only 100 one-digit sums) keep their share of the
        stream however long it is."""
        if split not in SPLITS:
            raise ValueError(f"arith: split must be one of {', '.join(SPLITS)}, got {split!r}")
        if n < 0:
            raise ValueError(f"arith: n must be non-negative, got {n}")
        if level is None:
            digits = (self.min_digits, self.max_digits)
            rng = random.Random(f"arith:{split}:{self.max_digits}:{seed}")
        elif 0 <= level < self.levels:
            digits = (min(self.min_digits, level + 1), level + 1)
            rng = random.Random(f"arith:{split}:{self.max_digits}:{seed}:level{level}")
        else:
            raise ValueError(f"arith: level must be in [0, {self.levels}), got {level}")
        want_test = split == "test"
        rows, seen = [], set()
        # The attempt budget keeps an impossible `n` (more test problems than exist) from
        # looping forever; a test problem needs its twin's hash to say test too, about one
        # draw in a hundred, so its budget is that many times larger.
        budget = (100 * n + 1000) * (TEST_BUCKETS if want_test else 1)
        for _ in range(budget):
            if len(rows) == n:
                break
            a, b = self._operand(rng, *digits), self._operand(rng, *digits)
            text = prompt(a, b, self.max_digits)
            twin = prompt(b, a, self.max_digits)
            if commuted_split(text, twin) != split or (want_test and text in seen):
                continue
            seen.add(text)
            rows.append(
                {
                    "prompt": text,
                    "answer": str(a + b),
                    "solution": solution(a, b, self.max_digits),
                }
            )
        if len(rows) < n:
            raise TooFewProblems(
                f"arith: only {len(rows)} distinct test problems with max_digits="
                f"{self.max_digits}, asked for {n}",
                rows,
            )
        return rows

    def reward_fns(self) -> dict[str, RewardFn]:
        return {"correct": exact_sum_reward, "format": tagged_integer_format_reward}

    def _operand(self, rng: random.Random, fewest: int, most: int) -> int:
        digits = rng.randint(fewest, most)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)
