"""Symbolic answer equivalence through `math-verify` (optional extra `math`)."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from typing import Any

# One comparison (both parses and the check) stops after this: below the reward runner's default
# timeout (10 s), so a slow row ends as a counted timeout without losing the worker process.
SYMBOLIC_TIMEOUT_S = 3.0


@functools.cache
def _math_verify() -> Any | None:
    try:
        import math_verify
        import math_verify.grader
        import math_verify.parser
    except ImportError:
        return None
    # Its own timeouts are off (our deadline bounds the whole comparison instead: their alarms
    # would cancel it); this flag silences its warning that they are.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def has_math_verify() -> bool:
    """True when the optional `math-verify` package is installed."""
    return _math_verify() is not None


def symbolic_equal(predicted: str, gold: str) -> bool | None:
    """Whether two LaTeX/plain answers are mathematically equal (`\\frac{\\sqrt2}{2}` =
    `\\sqrt{2}/2`, `(x+1)^2` = `x^2+2x+1`); None when math-verify is not installed.

    Raises TimeoutError after SYMBOLIC_TIMEOUT_S seconds, when called on the main thread (the
    reward runner's worker, or a trainer scoring in-process): the deadline is a SIGALRM timer,
    which only the main thread may set. Elsewhere, or while another timer is pending, the
    caller's own timeout is the only bound."""
    mv = _math_verify()
    if mv is None:
        return None
    with _deadline(SYMBOLIC_TIMEOUT_S):
        parsed_gold = mv.parse(_as_latex(gold), parsing_timeout=None)
        parsed_pred = mv.parse(_as_latex(predicted), parsing_timeout=None)
        if not parsed_gold or not parsed_pred:
            return False
        return bool(mv.verify(parsed_gold, parsed_pred, timeout_seconds=None))


class _Expired(BaseException):
    """Raised by the deadline's alarm. Not an Exception, so that sympy's and math-verify's
    `except Exception` cannot swallow it and compute on."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    usable = threading.current_thread() is threading.main_thread()
    if not usable or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired:
        raise TimeoutError(f"symbolic comparison took more than {seconds} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _as_latex(text: str) -> str:
    return text if "$" in text or "\\boxed" in text else f"${text}$"
