"""`code`: "Write a Python function `f(x)` that returns x plus 7.", scored by hidden tests.

Each problem is a template with one parameter: integer arithmetic (plus, minus, times,
remainder, the larger or smaller of x and k, divisibility), strings (repeat, first or last
characters, count a letter) and lists (scale each number, count those above k, sum plus k).
The specs are one line each and ask for a one-line body, so a 135M-parameter instruct model
writes many of them right from the start and reward has something to teach: to answer every
one with a clean fenced function, without prose that breaks it or top-level code that fails.
Run it with `data.chat_template=true`.

A row holds the prompt, the reference solution as `answer` (shown in samples, not scored) and
`tests`: three assert-style cases (`assert f(12) == 19`) on inputs drawn by a generator seeded
with the prompt, so the same problem always has the same tests. Problems are split by
`tasks.base.hash_split` of the prompt.

Reward: "correct" (weight 1.0), the `code_tests` reward (`oncurve.rewards.code`): the fraction
of the three tests the completion's last ```python block passes. The held-out accuracy counts a
program correct when it passes all three.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oncurve.data.tasks.base import all_drawn, draw_split, hash_split
from oncurve.rewards.code import code_tests_reward
from oncurve.rewards.registry import RewardFn

SPLITS = ("train", "test")
TESTS_PER_PROBLEM = 3
INSTRUCTION = "Reply with the code in a ```python block."
WORDS = ("banana", "apple", "cherry", "level", "kiwi", "mississippi", "code", "tree", "hello")


# Each draws the TESTS_PER_PROBLEM distinct inputs of a problem with parameter k.


def _ints(rng: random.Random, k: Any) -> list[int]:
    return rng.sample(range(100), TESTS_PER_PROBLEM)


def _around(rng: random.Random, k: int) -> list[int]:
    # one each side of k and k itself: `return x` and `return k` each fail one, and so are wrong
    return [k - rng.randint(1, 30), k + rng.randint(1, 30), k]


def _multiples(rng: random.Random, k: int) -> list[int]:
    # a multiple and two others: neither `return True` nor `return False` passes them all
    a = rng.randint(1, 9)
    return [k * a, k * a + 1, k * (a + 1) + 1]


def _words(rng: random.Random, k: Any) -> list[str]:
    return rng.sample(WORDS, TESTS_PER_PROBLEM)


def _words_with(rng: random.Random, letter: str) -> list[str]:
    # one word with the letter, so that `return 0` fails it
    first = rng.choice([w for w in WORDS if letter in w])
    return [first, *rng.sample([w for w in WORDS if w != first], TESTS_PER_PROBLEM - 1)]


def _lists(rng: random.Random, k: Any) -> list[list[int]]:
    # distinct lengths keep the three lists distinct
    return [[rng.randint(0, 20) for _ in range(n)] for n in (2, 3, 5)]


def _lists_above(rng: random.Random, k: int) -> list[list[int]]:
    # two numbers above k first, so that neither `return 0` nor `return 1` passes
    return [[k + 1, k + 2], *_lists(rng, k)[1:]]


@dataclass(frozen=True)
class Template:
    """A family of problems: `spec` and `body` are format strings of the parameter `k`;
    `arg` names the function's argument and `inputs(rng, k)` draws the tests' inputs."""

    spec: str  # what the function returns, after "that returns"
    body: str  # the reference's return expression
    arg: str
    inputs: Callable[[random.Random, Any], list[Any]]
    params: tuple[Any, ...]


TEMPLATES = (
    Template("x plus {k}", "x + {k}", "x", _ints, tuple(range(1, 51))),
    Template("x minus {k}", "x - {k}", "x", _ints, tuple(range(1, 51))),
    Template("x times {k}", "x * {k}", "x", _ints, tuple(range(2, 21))),
    Template("the remainder of x divided by {k}", "x % {k}", "x", _ints, tuple(range(2, 13))),
    Template("the larger of x and {k}", "max(x, {k})", "x", _around, tuple(range(0, 100, 3))),
    Template("the smaller of x and {k}", "min(x, {k})", "x", _around, tuple(range(0, 100, 3))),
    Template(
        "True if x is divisible by {k}, else False",
        "x % {k} == 0",
        "x",
        _multiples,
        tuple(range(2, 13)),
    ),
    Template("the string s repeated {k} times", "s * {k}", "s", _words, tuple(range(2, 6))),
    Template("the first {k} characters of the string s", "s[:{k}]", "s", _words, (1, 2, 3, 4)),
    Template("the last {k} characters of the string s", "s[-{k}:]", "s", _words, (1, 2, 3, 4)),
    Template(
        "how many times the letter {k!r} appears in the string s",
        "s.count({k!r})",
        "s",
        _words_with,
        tuple("aeiklnoprst"),
    ),
    Template("the string s reversed", "s[::-1]", "s", _words, (None,)),
    Template(
        "the list xs with every number multiplied by {k}",
        "[n * {k} for n in xs]",
        "xs",
        _lists,
        tuple(range(2, 11)),
    ),
    Template(
        "how many numbers in the list xs are greater than {k}",
        "sum(1 for n in xs if n > {k})",
        "xs",
        _lists_above,
        tuple(range(0, 20, 2)),
    ),
    Template(
        "the sum of the numbers in the list xs plus {k}",
        "sum(xs) + {k}",
        "xs",
        _lists,
        tuple(range(0, 21)),
    ),
)


@dataclass(frozen=True)
class Problem:
    """One problem: a template with its parameter `k`."""

    template: Template
    k: Any

    @property
    def prompt(self) -> str:
        spec = self.template.spec.format(k=self.k)
        return (
            f"Write a Python function `f({self.template.arg})` that returns {spec}. {INSTRUCTION}"
        )

    @property
    def solution(self) -> str:
        """The reference solution, as the model should write it."""
        return f"def f({self.template.arg}):\n    return {self.template.body.format(k=self.k)}\n"

    def tests(self) -> list[str]:
        """`TESTS_PER_PROBLEM` assert-style tests on distinct inputs, the same for every call."""
        namespace: dict[str, Any] = {}
        # our own template code, not a completion: the expected values are what it returns
        exec(self.solution, namespace)
        inputs = self.template.inputs(random.Random(self.prompt), self.k)
        return [f"assert f({x!r}) == {namespace['f'](x)!r}" for x in inputs]


def problems(split: str) -> list[Problem]:
    """Every problem of `split`, in template order."""
    found = [Problem(t, k) for t in TEMPLATES for k in t.params]
    return [p for p in found if hash_split(p.prompt) == split]


class CodeTask:
    """One-line Python functions from a spec, scored by hidden tests; satisfies `Task`."""

    name = "code"

    def examples(self, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """`n` rows {"prompt", "answer", "tests"} of `split`: train rows drawn with repetition
        (seeded), test rows distinct, in a seeded order; asking for more test rows than exist
        is an error."""
        if split not in SPLITS:
            raise ValueError(f"code: split must be one of {', '.join(SPLITS)}, got {split!r}")
        chosen = draw_split("code", problems(split), split, n, seed)
        # a problem's tests are computed once, however often the train split repeats it
        rows = {
            p: {"prompt": p.prompt, "answer": p.solution, "tests": p.tests()} for p in set(chosen)
        }
        return all_drawn("code", [dict(rows[p]) for p in chosen], n)

    def reward_fns(self) -> dict[str, RewardFn]:
        return {"correct": code_tests_reward}
