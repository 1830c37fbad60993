"""Countdown checker: an arithmetic expression that uses each given number exactly once, only
`+ - * /` and brackets, and equals the target.

The text is untrusted model output, so it is never evaluated: it is parsed with `ast` and only a
whitelist of node types (integer literals, the four binary operators) is walked and computed
with exact `Fraction`s. Anything else (names, calls, attributes, `**`, unary minus, floats)
scores 0 without running.
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from oncurve.rewards.answers import extract_answer

MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS_RE = re.compile(r"[\d+\-*/()\s]+")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: None}


def parse_numbers(value: Any) -> list[int]:
    """A row's `numbers` column as ints: a list, or a string like "3, 7, 25" or "[3, 7, 25]"."""
    if isinstance(value, str):
        return [int(n) for n in re.findall(r"-?\d+", value)]
    return [int(n) for n in value]


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, integer literals in order) of an expression of integers, `+ - * /` and
    brackets; None when it is anything else, malformed, or divides by zero."""
    expression = expression.strip()
    if len(expression) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS_RE.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    literals: list[int] = []
    try:
        value = _walk(tree.body, literals)
    except (ZeroDivisionError, RecursionError):
        return None
    if value is None:
        return None
    return value, literals


def check_equation(expression: str, numbers: Sequence[int], target: int) -> bool:
    """True when `expression` (optionally followed by `= target`) uses each of `numbers`
    exactly once and evaluates exactly to `target`."""
    lhs, _, rhs = expression.partition("=")
    if rhs.strip() and rhs.strip() != str(target):
        return False
    result = evaluate_expression(lhs)
    if result is None:
        return False
    value, literals = result
    return value == target and Counter(literals) == Counter(int(n) for n in numbers)


def countdown_reward(
    prompts: list[str],
    completions: list[str],
    *,
    numbers: list[Any] | None = None,
    target: list[Any] | None = None,
    **columns: Any,
) -> list[float]:
    """1.0 when the completion's `<answer>` (or `\\boxed{}`) equation is a correct Countdown
    solution for the row's `numbers` and `target` columns, else 0.0."""
    if numbers is None or target is None:
        raise ValueError("reward 'countdown' needs 'numbers' and 'target' columns in the data")
    scores = []
    for completion, nums, tgt in zip(completions, numbers, target, strict=True):
        expression = extract_answer(completion, "tags") or extract_answer(completion, "boxed")
        ok = expression is not None and check_equation(expression, parse_numbers(nums), int(tgt))
        scores.append(1.0 if ok else 0.0)
    return scores


def _walk(node: ast.AST, literals: list[int]) -> Fraction | None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            return None
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _walk(node.left, literals)
        right = _walk(node.right, literals)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Div):
            return left / right
        return _OPS[type(node.op)](left, right)
    return None
