"""Symbolic answer equivalence through `math-verify` (optional extra `math`)."""

from __future__ import annotations

import functools
import threading
from typing import Any


@functools.cache
def _math_verify() -> Any | None:
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def has_math_verify() -> bool:
    """True when the optional `math-verify` package is installed."""
    return _math_verify() is not None


def symbolic_equal(predicted: str, gold: str) -> bool | None:
    """Whether two LaTeX/plain answers are mathematically equal (`\\frac{\\sqrt2}{2}` =
    `\\sqrt{2}/2`, `(x+1)^2` = `x^2+2x+1`); None when math-verify is not installed."""
    mv = _math_verify()
    if mv is None:
        return None
    # math-verify's own timeout uses SIGALRM, which only the main thread may set; elsewhere the
    # reward runner's process timeout is the guard.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    parsed_gold = mv.parse(_as_latex(gold), parsing_timeout=timeout)
    parsed_pred = mv.parse(_as_latex(predicted), parsing_timeout=timeout)
    if not parsed_gold or not parsed_pred:
        return False
    return bool(mv.verify(parsed_gold, parsed_pred, timeout_seconds=timeout))


def _as_latex(text: str) -> str:
    return text if "$" in text or "\\boxed" in text else f"${text}$"
