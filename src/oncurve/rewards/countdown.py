"""Countdown checker: an arithmetic expression that uses each given number exactly once, only
`+ - * /` and brackets, and equals the target.

The text is untrusted model output, so it is never evaluated: it is parsed with `ast` and only a
whitelist of node types (integer literals, the four binary operators) is walked and computed
with exact `Fraction`s. Anything else (names, calls, attributes, `**`, unary minus, floats)
scores 0 without running. Before parsing, the signs instruct models write are read as the
operators they stand for: `\\times`, `\\cdot`, `×`, `·` as `*`; `\\div`, `÷` as `/`; `−`, `–` as
`-`; `\\left(`/`\\right)` as brackets; LaTeX spacing (`\\,`, `\\;`, `\\quad`, `~`) is dropped.

The `numbers` and `target` columns come from datasets, not from the model: an integer may be
written as a float (`46.0`, `"46.0"`, `"[3.0, 7.0, 25.0]"`) and is read as that integer; a row
whose column is not an integer or a list of them (46.5, NaN, inf, None, a bool, an empty list,
unparseable text) is left unscored (None), with a RuntimeWarning naming its column and value (the
reward runner, which calls countdown one row at a time, names the row's place in the batch).
"""

from __future__ import annotations

import ast
import json
import math
import numbers as numeric
import operator
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from oncurve.rewards.extraction import answer_region, extract_answer
from oncurve.rewards.normalization import last_boxed

MAX_EXPRESSION_CHARS = 256
# A dataset column longer than this is not a Countdown problem (and is not parsed).
MAX_COLUMN_CHARS = 1000
_ALLOWED_CHARS_RE = re.compile(r"[\d+\-*/()\s]+")
_CLOSE_TAG = "</answer>"  # lower case: found in a lowered completion
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: None}
# LaTeX and Unicode spellings of the operators and brackets; a command must end its name
# (`\timesfoo` is not `\times`), so `\cdots` stays unreadable.
_SIGNS = [
    (re.compile(r"\\(?:times|cdot)(?![a-zA-Z])|[×·⋅∗]"), "*"),
    (re.compile(r"\\div(?![a-zA-Z])|[÷∕]"), "/"),
    (re.compile(r"[−–]"), "-"),
    (re.compile(r"\\left\s*\(|\\bigl?\s*\(|\\Bigl?\s*\("), "("),
    (re.compile(r"\\right\s*\)|\\bigr?\s*\)|\\Bigr?\s*\)"), ")"),
    (re.compile(r"\\[,;:! ]|\\q?quad(?![a-zA-Z])|~|\$|\\[()\[\]]"), " "),  # math delimiters too
]
# An integer in text, possibly written as a float with a zero fraction: `46`, `-3`, `46.0`.
_INTEGER_TEXT_RE = re.compile(r"\s*([-+]?\d+)(?:\.0*)?\s*")
_LIST_SEPARATOR_RE = re.compile(r"\s*,\s*|\s+")


class ColumnError(ValueError):
    """A dataset column that cannot be read as what the reward needs; the message says why."""


def parse_integer(value: Any) -> int:
    """An integer column value: an int, an integral finite float (`46.0`), or text of one
    (`"46"`, `"46.0"`); ColumnError for anything else (46.5, NaN, inf, None, a bool, a list)."""
    if isinstance(value, bool):
        raise ColumnError(f"{value!r} is a bool, not an integer")
    if isinstance(value, numeric.Integral):
        return int(value)
    if isinstance(value, numeric.Real):
        number = float(value)
        if not math.isfinite(number) or not number.is_integer():
            raise ColumnError(f"{value!r} is not an integer")
        return int(number)
    if isinstance(value, str):
        match = _INTEGER_TEXT_RE.fullmatch(value) if len(value) <= MAX_COLUMN_CHARS else None
        if match is None:
            raise ColumnError(f"{_short(value)} is not an integer")
        return int(match.group(1))
    raise ColumnError(f"{_short(value)} ({type(value).__name__}) is not an integer")


def parse_numbers(value: Any) -> list[int]:
    """A row's `numbers` column as ints: a list or tuple (or a 1-D array) of integers, or text
    of one: `"3, 7, 25"`, `"3 7 25"`, `"[3, 7, 25]"`, `"[3.0, 7.0, 25.0]"` (read as a JSON or
    Python literal, never digit by digit). ColumnError for an empty list, an element that is not
    an integer (`parse_integer`), or anything else (None, a set, a lone number, bad text)."""
    if isinstance(value, str):
        items = _list_from_text(value)
    elif hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:  # numpy, torch
        items = value.tolist()
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        items = list(value)
    else:
        raise ColumnError(f"{_short(value)} ({type(value).__name__}) is not a list of integers")
    if not items:
        raise ColumnError(f"{_short(value)} is an empty list")
    try:
        return [parse_integer(item) for item in items]
    except ColumnError as e:
        raise ColumnError(f"{_short(value)} holds {e}") from None


def normalize_expression(expression: str) -> str:
    """`expression` with LaTeX and Unicode operator signs and brackets written as `+ - * / ( )`
    and LaTeX spacing dropped (see the module docstring); nothing else is changed."""
    for pattern, replacement in _SIGNS:
        expression = pattern.sub(replacement, expression)
    return expression


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, integer literals in order) of an expression of integers, `+ - * /` and
    brackets (in any spelling `normalize_expression` reads); None when it is anything else,
    malformed, or divides by zero."""
    if len(expression) > 4 * MAX_EXPRESSION_CHARS:
        return None
    expression = normalize_expression(expression).strip()
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
    if len(expression) > 4 * MAX_EXPRESSION_CHARS:
        return False
    lhs, _, rhs = normalize_expression(expression).partition("=")
    rhs = rhs.strip().removesuffix(".").strip()  # `3 * 7 + 25 = 46.`
    if rhs and rhs != str(target):
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
) -> list[float | None]:
    """1.0 when the completion's `<answer>` (or `\\boxed{}`) equation is a correct Countdown
    solution for the row's `numbers` and `target` columns, else 0.0; of both, the one stated
    last (a box after the tags, or the tags after a box). The equation is read where
    `correct` reads an answer (`answer_region`): after the reasoning (the last `</think>`),
    outside fenced programs; in the reasoning only when nothing follows it. None for a row whose
    columns cannot be read (`parse_numbers`, `parse_integer`), with a RuntimeWarning naming the
    column and its value."""
    if numbers is None or target is None:
        raise ValueError("reward 'countdown' needs 'numbers' and 'target' columns in the data")
    scores: list[float | None] = []
    for completion, nums, tgt in zip(completions, numbers, target, strict=True):
        try:
            column = "numbers"
            row_numbers = parse_numbers(nums)
            column = "target"
            row_target = parse_integer(tgt)
        except ColumnError as e:
            message = f"a row left unscored, its {column} column unreadable: {e}"
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            scores.append(None)
            continue
        region, _ = answer_region(completion)
        tagged = extract_answer(region, "tags")
        if tagged:
            # the last equation stated is the answer, as for `correct`: a box after the tags
            after = region[region.lower().rfind(_CLOSE_TAG) + len(_CLOSE_TAG) :]
            expression = last_boxed(after) or last_boxed(tagged) or tagged
        else:
            expression = last_boxed(region)
        ok = expression is not None and check_equation(expression, row_numbers, row_target)
        scores.append(1.0 if ok else 0.0)
    return scores


def _list_from_text(text: str) -> list[Any]:
    """The items of a list written as text: a JSON or Python list/tuple literal, or integers
    separated by commas or spaces; ColumnError when it is none of those."""
    stripped = text.strip()
    if len(stripped) > MAX_COLUMN_CHARS:
        raise ColumnError(f"text of {len(stripped)} characters is not a list of integers")
    if stripped.startswith(("[", "(")):
        try:
            items = json.loads(stripped)
        except (ValueError, RecursionError):
            try:
                items = ast.literal_eval(stripped)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                raise ColumnError(f"{_short(text)} is not a list of integers") from None
        if not isinstance(items, list | tuple):
            raise ColumnError(f"{_short(text)} is not a list of integers")
        return list(items)
    return _LIST_SEPARATOR_RE.split(stripped) if stripped else []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
