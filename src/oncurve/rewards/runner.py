"""Run weighted reward functions over a batch, with timeouts and an error policy.

How a batch is scored, per function:
  1. one call on the whole batch, or, for a function with a true `rowwise` attribute (the
     built-ins that score each row alone), one call per row from the start, each with its own
     timeout: one slow row then costs its own timeout, not the batch's and then its own again;
  2. only if the whole-batch call raised or timed out: one call per row (1-element lists), to
     find the rows at fault. A row that raises stops the run (`on_error="raise"`, a `RewardError`
     naming the function and the sample index) or scores None and is counted (`on_error="none"`);
     a row that times out, or raises TimeoutError (a verifier that gave up on it, such as
     `correct`'s bounded math-verify call), scores `timeout_score` and is counted. Functions that
     need the whole batch (group-wise scores) get no per-row rescue: their rows are scored one by
     one in step 2.
`reward/slowest_row_s` is the longest time one call on one row took, or for a function called on
the whole batch, that call's time (a bound on each of its rows).

Timeouts need a process: a Python thread cannot be stopped, so a hung verifier in a thread would
hang training. With `timeout_s` set, the calls run in one persistent worker process, forked at
the first `score()` and kept until `close()` (or the end of a `with` block). Each batch (prompts,
completions, columns: plain picklable data) goes to the worker over a pipe and the results stream
back; the functions themselves are inherited through fork, so closures and lambdas work. The
parent waits at most `timeout_s` per call, kills the worker on a hang (or finds it dead) and forks
a fresh one for the remaining calls.

Why one worker and not a fork per batch: whatever a reward function loads lazily (math-verify
and sympy take ~0.6 s to import) or caches survives from one batch to the next instead of being
paid again every step, and the fork is paid once. The parent's objects are frozen out of the
garbage collector while forking (`gc.freeze`), so the worker's collections do not walk the
trainer's hundreds of thousands of objects and copy their memory pages on write. A consequence
of forking once: a reward function sees the parent's module state as it was at the fork (the
first batch, or the first after a hang); what changes during training must reach it through the
columns. Reward functions must not rely on CUDA or on threads of the parent inside the worker.
With `timeout_s=None` everything runs in-process.

A function with a true `runs_in_process` attribute (a reward model on the trainer's device,
`oncurve.rewards.model.RewardModel`) is always called in the trainer's process, also when the
others go to the worker: no timeout applies to it (a hang there hangs training), and a failure
on its whole batch is still retried row by row.

Summing: `total` is the weighted sum over functions; a None from one function counts as 0 when
another function scored that row, and the row's total is NaN when every function returned None
(the trainer leaves NaN rows out of group statistics). With a `verifier` (the function that
decides whether an answer is right), a row it scored None is NaN whatever the others scored: a
shaping term such as DAPO's overlong penalty would otherwise turn an unverifiable answer into a
wrong one. NaN and inf values are treated as None.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rewards.math import SYMBOLIC_BATCH_BUDGET_S, symbolic_budget
from oncurve.rewards.registry import RewardFn

# A job is (function index, row index or None for the whole batch). An outcome is
# (kind, payload, exception, seconds the call took): ("ok", values, None, s),
# ("error", message, exc | None, s), ("fatal", message, None, s) for a wrong return value,
# ("timeout", message | None, None, s).
_Job = tuple[int, int | None]
_Outcome = tuple[str, Any, BaseException | None, float]


class RewardError(UserError):
    """A reward function raised, or returned something other than one number/None per row."""


@dataclass
class RewardResult:
    total: torch.Tensor  # [N] weighted sum; NaN where the verifier or every function gave None
    per_fn: torch.Tensor  # [N, n_fns] each function's score; NaN for None
    # reward/<name> (mean over non-None), reward/timeouts, reward/errors, reward/slowest_row_s
    metrics: dict[str, float]
    verifier_scores: torch.Tensor | None = None  # [N] the verifier's column of per_fn, if any


class RewardRunner:
    """Scores completions with `fns`, a list of (name, fn, weight); `verifier` names the one
    among them that decides correctness, if any (see the module docstring). With a timeout it
    owns a worker process: `close()` it, or use it as a context manager."""

    def __init__(
        self,
        fns: list[tuple[str, RewardFn, float]],
        timeout_s: float | None = 10.0,
        on_error: str = "raise",
        timeout_score: float | None = None,
        verifier: str | None = None,
    ) -> None:
        if not fns:
            raise UserError("at least one reward function is needed")
        if on_error not in ("raise", "none"):
            raise UserError(f"reward on_error must be 'raise' or 'none', got {on_error!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise UserError(f"reward timeout must be positive or None, got {timeout_s}")
        names = [name for name, _, _ in fns]
        if len(set(names)) != len(names):
            raise UserError(f"reward names must be unique, got {names}")
        if verifier is not None and verifier not in names:
            raise UserError(f"reward verifier {verifier!r} is not one of the rewards {names}")
        self.fns = fns
        self.verifier = verifier
        self._verifier_column = None if verifier is None else names.index(verifier)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.timeout_score = timeout_score
        self._worker: _Worker | None = None

    @property
    def filter_name(self) -> str:
        """What dynamic sampling and the curriculum compare within a group: the verifier's
        name, or "total"."""
        return "total" if self.verifier is None else repr(self.verifier)

    def close(self) -> None:
        """Stop the worker process, if one runs; a later `score()` forks a new one."""
        if self._worker is not None:
            self._worker.stop(wait_s=1.0)
            self._worker = None

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def score(
        self, prompts: list[str], completions: list[str], columns: dict[str, Sequence[Any]]
    ) -> RewardResult:
        """Score N completions; `columns` are the dataset's other fields, N values each."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        for key, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")
        batch = (prompts, completions, columns)
        values = [[math.nan] * n for _ in self.fns]  # per function, per row; NaN for None
        counts: dict[str, float] = {"timeouts": 0, "errors": 0, "slowest_row_s": 0.0}
        retry: list[int] = []
        jobs: list[_Job] = []
        for f, (_, fn, _) in enumerate(self.fns):
            jobs += [(f, i) for i in range(n)] if getattr(fn, "rowwise", False) else [(f, None)]
        # symbolic comparisons of one batch share a budget: N hostile rows cost about one
        # timeout, not N (in the worker process, `_serve` opens the same budget)
        budget = symbolic_budget(SYMBOLIC_BATCH_BUDGET_S)
        with budget, contextlib.closing(self._run(jobs, batch)) as outcomes:
            for (f, row), outcome in zip(jobs, outcomes, strict=True):
                kind, payload, _, seconds = outcome
                counts["slowest_row_s"] = max(counts["slowest_row_s"], seconds)
                if row is not None:
                    values[f][row] = self._row_score(f, row, outcome, counts)
                elif kind == "ok":
                    values[f] = [math.nan if v is None else v for v in payload]
                elif kind == "fatal":
                    raise RewardError(payload)
                else:
                    retry.append(f)
        for f in retry:
            with symbolic_budget(SYMBOLIC_BATCH_BUDGET_S):
                values[f] = self._score_rows(f, batch, counts)
        per_fn = torch.tensor(values, dtype=torch.float32).T.reshape(n, len(self.fns))
        return _result(per_fn, self.fns, counts, self._verifier_column)

    def concat(self, results: Sequence[RewardResult]) -> RewardResult:
        """One result for the rows of `results` (batches this runner scored), in order: what one
        `score` call on all of them would return, its metrics over every row."""
        counts = {
            kind: sum(r.metrics[f"reward/{kind}"] for r in results)
            for kind in ("timeouts", "errors")
        }
        counts["slowest_row_s"] = max(r.metrics["reward/slowest_row_s"] for r in results)
        per_fn = torch.cat([r.per_fn for r in results])
        return _result(per_fn, self.fns, counts, self._verifier_column)

    def _score_rows(self, f: int, batch: tuple, counts: dict[str, float]) -> list[float]:
        """The N scores of function `f` called one row at a time (NaN for None)."""
        jobs = [(f, i) for i in range(len(batch[1]))]
        column = []
        with contextlib.closing(self._run(jobs, batch)) as outcomes:
            for (_, i), outcome in zip(jobs, outcomes, strict=True):
                counts["slowest_row_s"] = max(counts["slowest_row_s"], outcome[3])
                column.append(self._row_score(f, i, outcome, counts))
        return column

    def _row_score(self, f: int, i: int, outcome: _Outcome, counts: dict[str, float]) -> float:
        """Row `i`'s score by function `f` from the outcome of its own call (NaN for None),
        under the error and timeout policy; counts its timeout or error."""
        kind, payload, exc, _ = outcome
        if kind == "ok":
            return math.nan if payload[0] is None else payload[0]
        if kind == "fatal":
            raise RewardError(payload)
        if kind == "timeout":
            counts["timeouts"] += 1
            return math.nan if self.timeout_score is None else self.timeout_score
        if self.on_error == "raise":
            name = self.fns[f][0]
            raise RewardError(f"reward {name!r} failed on sample {i}: {payload}") from exc
        counts["errors"] += 1
        return math.nan

    def memory_bytes(self) -> int:
        """Device bytes the reward functions hold (a reward model's weights), for the memory
        plan: the sum of their `memory_bytes()`, for those that have one."""
        return sum(fn.memory_bytes() for _, fn, _ in self.fns if hasattr(fn, "memory_bytes"))

    def _run(self, jobs: list[_Job], batch: tuple) -> Iterator[_Outcome]:
        """One outcome per job, in order; in the worker process when a timeout is set, except
        for the functions that run in-process (see the module docstring)."""
        start = 0
        while start < len(jobs):
            here = self._in_process(jobs[start])
            end = start + 1
            while end < len(jobs) and self._in_process(jobs[end]) == here:
                end += 1
            if here:
                for job in jobs[start:end]:
                    yield _run_job(self.fns, job, batch)
            else:
                yield from self._run_in_worker(jobs[start:end], batch)
            start = end

    def _in_process(self, job: _Job) -> bool:
        fn = self.fns[job[0]][1]
        return self.timeout_s is None or bool(getattr(fn, "runs_in_process", False))

    def _run_in_worker(self, jobs: list[_Job], batch: tuple) -> Iterator[_Outcome]:
        start = 0
        try:
            while start < len(jobs):
                if self._worker is None or not self._worker.process.is_alive():
                    self.close()
                    self._worker = _Worker(self.fns)
                worker = self._worker
                with contextlib.suppress(BrokenPipeError):  # dead: receiving reports it
                    worker.requests.send((jobs[start:], batch))
                for _ in jobs[start:]:
                    start += 1
                    outcome = self._receive(worker)
                    yield outcome
                    if self._worker is not worker:
                        break
        finally:
            # Stopped early (a RewardError, an interrupt): the worker still owes outcomes that
            # the next batch would read as its own.
            if start < len(jobs):
                self.close()

    def _receive(self, worker: _Worker) -> _Outcome:
        """The worker's next outcome; on a timeout or a death the worker is stopped."""
        if not worker.outcomes.poll(self.timeout_s):
            worker.stop(wait_s=0.0)
            self._worker = None
            return ("timeout", None, None, self.timeout_s)
        try:
            return worker.outcomes.recv()
        except (EOFError, OSError):
            exit_code = worker.stop(wait_s=1.0)
            self._worker = None
            return ("error", f"worker process died (exit code {exit_code})", None, 0.0)


class _Worker:
    """A forked process that runs (jobs, batch) requests and sends back one outcome per job."""

    def __init__(self, fns: list[tuple[str, RewardFn, float]]) -> None:
        context = multiprocessing.get_context("fork")
        job_reader, self.requests = context.Pipe(duplex=False)
        self.outcomes, outcome_writer = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_serve,
            args=(job_reader, outcome_writer, (self.requests, self.outcomes), fns),
            name="oncurve-reward-worker",
            daemon=True,
        )
        # Frozen objects are invisible to the worker's garbage collector, which would otherwise
        # walk every object inherited from the trainer and copy their pages on write.
        gc.freeze()
        try:
            self.process.start()
        finally:
            gc.unfreeze()
        job_reader.close()
        outcome_writer.close()

    def stop(self, wait_s: float) -> int | None:
        """Close the pipes (an idle worker then exits), kill the process if it has not exited
        after `wait_s`; the exit code it had before any kill (None if it was still running)."""
        self.requests.close()
        self.process.join(wait_s)
        exit_code = self.process.exitcode
        if exit_code is None:
            self.process.kill()
            self.process.join()
        self.outcomes.close()
        return exit_code


def _serve(requests: Any, outcomes: Any, parent_ends: tuple, fns: list) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when the worker stops. SIGTERM
    # must stop it (multiprocessing terminates daemon children at exit), not run the trainer's
    # inherited stop handler.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Without the parent's ends open here, the parent's exit, however abrupt, ends recv() below.
    for end in parent_ends:
        end.close()
    while True:
        try:
            jobs, batch = requests.recv()
        except EOFError:
            return
        with symbolic_budget(SYMBOLIC_BATCH_BUDGET_S):
            for job in jobs:
                kind, payload, exc, seconds = _run_job(fns, job, batch)
                outcome = (kind, payload, None if exc is None else _picklable(exc), seconds)
                try:
                    outcomes.send(outcome)
                except BrokenPipeError:
                    return


def runner_settings(reward: Any) -> dict[str, Any]:
    """`RewardRunner`'s policy from a config's `reward` section (timeout, score of a timed-out
    row, errors): training and evaluation both score under it."""
    return {
        "timeout_s": reward.timeout,
        "timeout_score": reward.timeout_score,
        "on_error": reward.errors,
    }


def _picklable(exc: BaseException) -> BaseException | None:
    # the message already carries the type and text; the object is only for `raise ... from`
    import pickle

    try:
        pickle.dumps(exc)
    except Exception:
        return None
    return exc


# what torch raises when a forked process touches CUDA that its parent initialised
_FORKED_CUDA = "CUDA in forked subprocess"


def _forked_cuda_message(name: str) -> str:
    return (
        f"reward {name!r} uses CUDA, which the forked worker that runs rewards under "
        "reward.timeout cannot: make it CPU-only, or set reward.timeout=null to run rewards in "
        "the trainer's process"
    )


def _run_job(fns: list[tuple[str, RewardFn, float]], job: _Job, batch: tuple) -> _Outcome:
    f, row = job
    name, fn, _ = fns[f]
    prompts, completions, columns = batch
    if row is not None:
        prompts, completions = prompts[row : row + 1], completions[row : row + 1]
        columns = {key: values[row : row + 1] for key, values in columns.items()}
    start = time.perf_counter()
    try:
        values = fn(prompts, completions, **columns)
    except TimeoutError as e:
        return ("timeout", f"{type(e).__name__}: {e}", None, time.perf_counter() - start)
    except Exception as e:
        if _FORKED_CUDA in str(e):  # not the row's fault: no row can be scored so
            return ("fatal", _forked_cuda_message(name), None, time.perf_counter() - start)
        return ("error", f"{type(e).__name__}: {e}", e, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    try:
        return ("ok", _check_values(name, values, len(completions), row), None, seconds)
    except _TooLarge as e:  # a value of the row's, as an exception is: the error policy decides
        return ("error", str(e), e, seconds)
    except RewardError as e:
        return ("fatal", str(e), None, seconds)


def _check_values(name: str, values: Any, n: int, row: int | None) -> list[float | None]:
    """Plain floats (None for None, NaN or inf) from an ordered sequence (a list, a tuple, a 1-D
    array) of numbers or None; RewardError for anything else: a set, a dict or its views, or any
    other iterable whose order is not the rows', a string, a value that is not a number; and
    `_TooLarge`, which the error policy handles as a row's error, for a number too large for a
    float (an int of 309 digits or more)."""
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
        except (TypeError, ValueError):
            number = None
        except OverflowError:
            raise _TooLarge(
                f"reward {name!r} returned {_size(value)} ({type(value).__name__}), too large "
                f"for a float, for sample {sample}; expected a float or None"
            ) from None
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


def _result(
    per_fn: torch.Tensor,
    fns: list[tuple[str, RewardFn, float]],
    counts: dict[str, float],
    verifier_column: int | None,
) -> RewardResult:
    """The weighted sum of `per_fn` `[N, n_fns]` (see the module docstring) and its metrics."""
    weights = torch.tensor([w for _, _, w in fns], dtype=torch.float32)
    scored = ~torch.isnan(per_fn)  # [N, n_fns]
    total = (torch.where(scored, per_fn, 0.0) * weights).sum(1)
    counted = scored.any(1) if verifier_column is None else scored[:, verifier_column]
    total = torch.where(counted, total, math.nan)
    metrics = {
        f"reward/{name}": float(per_fn[scored[:, f], f].mean()) if scored[:, f].any() else math.nan
        for f, (name, _, _) in enumerate(fns)
    }
    for kind in ("timeouts", "errors", "slowest_row_s"):
        metrics[f"reward/{kind}"] = float(counts[kind])
    verifier_scores = None if verifier_column is None else per_fn[:, verifier_column]
    return RewardResult(total, per_fn, metrics, verifier_scores)
