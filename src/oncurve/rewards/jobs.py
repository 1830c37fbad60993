"""One job of the reward runner: a reward function called on the whole batch or on one row,
timed, and what it returned checked; the outcome says how it went, whichever process ran it.
A call on one row keeps the warnings it says (as the warning filters let them through) in its
outcome instead of showing them: the runner says them with the row's place in the batch."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from oncurve.errors import UserError
from oncurve.rewards.registry import RewardFn
from oncurve.rewards.trl_contract import (
    REWARD_LOOP,
    ColumnMissing,
    RewardLog,
    TrainerState,
    call_context,
)

# A job is (function index, row index or None for the whole batch). An outcome is
# (kind, payload, exception, seconds the call took, what the call logged or None, what a call
# on one row warned): ("ok", values, None, s, log, said), ("error", message, exc | None, s, None,
# said), ("fatal", message, None, s, None, said) for a wrong return value, ("timeout",
# message | None, None, s, None, said). A batch is (prompts, completions, columns, trainer state).
Job = tuple[int, int | None]
Said = tuple[tuple[type[Warning], str], ...]  # (category, message) per warning, in order
Outcome = tuple[str, Any, BaseException | None, float, RewardLog | None, Said]
Batch = tuple[list[str], list[str], dict[str, Sequence[Any]], TrainerState]


class RewardError(UserError):
    """A reward function raised, or returned something other than one number/None per row."""


# what torch raises when a forked process touches CUDA that its parent initialised
_FORKED_CUDA = "CUDA in forked subprocess"


def _forked_cuda_message(name: str) -> str:
    return (
        f"reward {name!r} uses CUDA, which the forked worker that runs rewards under "
        "reward.timeout cannot: make it CPU-only, or set reward.timeout=null to run rewards in "
        "the trainer's process"
    )


def run_jobs(
    fns: list[tuple[str, RewardFn, float]], jobs: list[Job], batch: Batch
) -> Iterator[Outcome]:
    """One outcome per job, in order. The whole-batch calls of async rewards are awaited
    together, on the process's `REWARD_LOOP`, before the first outcome; every other call runs
    in turn."""
    together = [job for job in jobs if job[1] is None and getattr(fns[job[0]][1], "is_async", 0)]
    outcomes = REWARD_LOOP.run(_gather(fns, together, batch)) if together else []
    awaited = dict(zip(together, outcomes, strict=True))
    for job in jobs:
        yield awaited[job] if job in awaited else run_job(fns, job, batch)


async def _gather(
    fns: list[tuple[str, RewardFn, float]], jobs: list[Job], batch: Batch
) -> list[Outcome]:
    async def one(job: Job) -> Outcome:
        name, fn, _ = fns[job[0]]
        prompts, completions, columns, state = batch
        log = RewardLog()
        start = time.perf_counter()
        try:
            values = _listed(
                await fn.coroutine(prompts, completions, **call_context(log, state), **columns)
            )
        except Exception as e:
            return _failed(name, e, time.perf_counter() - start, ())
        return _returned(name, values, len(completions), None, time.perf_counter() - start, log, ())

    return list(await asyncio.gather(*(one(job) for job in jobs)))


def run_job(fns: list[tuple[str, RewardFn, float]], job: Job, batch: Batch) -> Outcome:
    """Call function `job[0]` of `fns` on the batch, or on row `job[1]` alone, and time the
    call; what it raised, returned or logged, and on one row what it warned, becomes the outcome.
    A function that takes the call's context (`takes_context`: TRL's contract) also gets the
    trainer state and the log's functions, by TRL's names (`call_context`)."""
    f, row = job
    name, fn, _ = fns[f]
    prompts, completions, columns, state = batch
    if row is not None:
        prompts, completions = prompts[row : row + 1], completions[row : row + 1]
        columns = {key: values[row : row + 1] for key, values in columns.items()}
    log = RewardLog() if getattr(fn, "takes_context", False) else None
    context = {} if log is None else call_context(log, state)
    start = time.perf_counter()
    with _kept(row is not None) as said:
        try:
            values = _listed(fn(prompts, completions, **context, **columns))
        except Exception as e:
            return _failed(name, e, time.perf_counter() - start, tuple(said))
    seconds = time.perf_counter() - start
    return _returned(name, values, len(completions), row, seconds, log, tuple(said))


def _listed(values: Any) -> Any:
    """An iterator's values (a generator's, a `map`'s) as a list, in the order it yields them,
    as TRL takes a reward's return value; anything else as it is. Iterated inside the call, so
    what the iterator raises is the call's error and its time the call's."""
    return list(values) if isinstance(values, Iterator) else values


@contextlib.contextmanager
def _kept(keep: bool) -> Iterator[list[tuple[type[Warning], str]]]:
    """The warnings said in the block, kept instead of shown when `keep`. Only the showing is
    replaced: the filters and their registries still decide which warnings are said (ignored,
    raised, once), and a filter the block adds (a library imported lazily) stays."""
    said: list[tuple[type[Warning], str]] = []
    if not keep:
        yield said
        return

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        said.append((category, str(message)))

    shown = warnings.showwarning
    warnings.showwarning = show
    try:
        yield said
    finally:
        warnings.showwarning = shown


def _failed(name: str, e: Exception, seconds: float, said: Said) -> Outcome:
    if isinstance(e, TimeoutError):
        return ("timeout", f"{type(e).__name__}: {e}", None, seconds, None, said)
    if _FORKED_CUDA in str(e):  # not the row's fault: no row can be scored so
        return ("fatal", _forked_cuda_message(name), None, seconds, None, said)
    if isinstance(e, ColumnMissing):
        return ("fatal", f"reward {name!r}: {e}", None, seconds, None, said)
    return ("error", f"{type(e).__name__}: {e}", e, seconds, None, said)


def _returned(
    name: str,
    values: Any,
    n: int,
    row: int | None,
    seconds: float,
    log: RewardLog | None,
    said: Said,
) -> Outcome:
    try:
        return ("ok", _check_values(name, values, n, row), None, seconds, log, said)
    except _TooLarge as e:  # a value of the row's, as an exception is: the error policy decides
        return ("error", str(e), e, seconds, None, said)
    except RewardError as e:
        return ("fatal", str(e), None, seconds, None, said)


def _check_values(name: str, values: Any, n: int, row: int | None) -> list[float | None]:
    """Plain floats (None for None, NaN or inf) from an ordered sequence (a list, a tuple, a 1-D
    array; an iterator arrives listed, `_listed`) of numbers or None; RewardError for anything else:
    a set, a dict or its views, or any other iterable whose order is not the rows', a string, a
    value that is not a number; and `_TooLarge`, which the error policy handles as a row's error,
    for a number too large for a float (an int of 309 digits or more)."""
    where = "" if row is None else f" for sample {row} alone"
    ordered = isinstance(values, Sequence) or hasattr(values, "__array__")  # numpy, torch
    try:
        if not ordered or isinstance(values, str | bytes):
            raise TypeError
        values = list(values)
    except TypeError:
        raise RewardError(
            f"reward {name!r} returned {type(values).__name__}{where}; expected a list of "
            f"{n} floats or None, in the order of the rows"
        ) from None
    if len(values) != n:
        raise RewardError(
            f"reward {name!r} returned {len(values)} values for {n} completions{where}"
        )
    checked: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            checked.append(None)
            continue
        sample = i if row is None else row
        try:
            number = None if isinstance(value, str | bytes) else float(value)
        except OverflowError:
            raise _TooLarge(
                f"reward {name!r} returned {_size(value)} ({type(value).__name__}), too large "
                f"for a float, for sample {sample}; expected a float or None"
            ) from None
        except Exception:  # a value whose __float__ raises anything: not a number either
            number = None
        if number is None:
            raise RewardError(
                f"reward {name!r} returned {value!r} ({type(value).__name__}) for sample "
                f"{sample}; expected a float or None"
            )
        checked.append(number if math.isfinite(number) else None)
    return checked


class _TooLarge(RewardError):
    """A returned number too large for a float: the row's fault, not the function's."""


def _size(value: Any) -> str:
    """A number too large for a float, shortly: its size in decimal digits, since writing it
    out could take pages (Python refuses past 4,300 digits)."""
    try:
        bits = abs(int(value)).bit_length()
    except (TypeError, ValueError, OverflowError):
        return "a number"
    return f"a number of about {int(bits * math.log10(2)) + 1} digits"
