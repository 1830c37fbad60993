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

A warning said in a call on one row cannot name the row's place in the batch: it is kept
(`oncurve.rewards.jobs`) and said again once the batch is scored, naming the rows whose calls
said it (`reward 'countdown' on rows 2, 5 of 8: ...`; the warning filters decide which calls say
it, under Python's default filter the first), in its own category, each message of a function
once a run. A whole batch call's warnings are shown as the function says them.

With `timeout_s` set, the calls run in one persistent worker process (see worker.py: how it is
forked, fed and replaced after a hang); with `timeout_s=None` everything runs in-process.

A function with a true `runs_in_process` attribute (a reward model on the trainer's device,
`oncurve.rewards.model.RewardModel`) is always called in the trainer's process, also when the
others go to the worker: no timeout applies to it (a hang there hangs training), and a failure
on its whole batch is still retried row by row.

Summing: `total` is the weighted sum over functions; a None from one function counts as 0 when
another function scored that row, and the row's total is NaN when every function returned None
(the trainer leaves NaN rows out of group statistics), as TRL sums them; the first such rows
of a run are said in one warning, as TRL warns of them. With a `verifier` (the function that
decides whether an answer is right), a row it scored None is NaN whatever the others scored: a
shaping term such as DAPO's overlong penalty would otherwise turn an unverifiable answer into a
wrong one. NaN and inf values are treated as None.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rewards.jobs import Batch, Job, Outcome, RewardError, Said, run_jobs
from oncurve.rewards.math import SYMBOLIC_BATCH_BUDGET_S, symbolic_budget
from oncurve.rewards.registry import RewardFn
from oncurve.rewards.trl_contract import RewardLog, TrainerState
from oncurve.rewards.worker import Worker


@dataclass
class RewardResult:
    total: torch.Tensor  # [N] weighted sum; NaN where the verifier or every function gave None
    per_fn: torch.Tensor  # [N, n_fns] each function's score; NaN for None
    # reward/<name> (mean over non-None), reward/timeouts, reward/errors, reward/slowest_row_s
    metrics: dict[str, float]
    verifier_scores: torch.Tensor | None = None  # [N] the verifier's column of per_fn, if any
    # what rewards logged: `log_extra` column -> N values (None for rows it skipped), and
    # `log_metric` name -> every value logged (`logged_metrics` averages them)
    extra: dict[str, list[Any]] = field(default_factory=dict)
    logged: dict[str, list[float]] = field(default_factory=dict)
    # the reward function that logged each `log_extra` column and, first, each `log_metric` name
    extra_by: dict[str, str] = field(default_factory=dict)
    logged_by: dict[str, str] = field(default_factory=dict)


# The `reward/` metrics the trainer logs of its own, beside one per reward function.
TRAINER_REWARD_METRICS = {
    "mean": "the total reward's mean",
    "std": "the total reward's std",
    "timeouts": "calls that ran out of time",
    "errors": "calls that raised",
    "slowest_row_s": "the slowest row's seconds",
}


class RewardRunner:
    """Scores completions with `fns`, a list of (name, fn, weight); `verifier` names the one
    among them that decides correctness, if any (see the module docstring). With
    `say_unscored`, the first rows of a run that no function scored (each returned None, failed
    or timed out) are said in one warning. With a timeout it owns a worker process: `close()`
    it, or use it as a context manager."""

    def __init__(
        self,
        fns: list[tuple[str, RewardFn, float]],
        timeout_s: float | None = 10.0,
        on_error: str = "raise",
        timeout_score: float | None = None,
        verifier: str | None = None,
        say_unscored: bool = True,
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
        if taken := [name for name in names if name in TRAINER_REWARD_METRICS]:
            raise UserError(
                f"reward {taken[0]!r}: its metric would be reward/{taken[0]}, a name the trainer "
                f"logs itself ({TRAINER_REWARD_METRICS[taken[0]]}); rename the function"
            )
        if verifier is not None and verifier not in names:
            raise UserError(f"reward verifier {verifier!r} is not one of the rewards {names}")
        self.fns = fns
        self.verifier = verifier
        self._verifier_column = None if verifier is None else names.index(verifier)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.timeout_score = timeout_score
        self._worker: Worker | None = None
        self._warned: set[tuple[str, str]] = set()  # (function, what) said once a run
        self._say_unscored = say_unscored

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
        self,
        prompts: list[str],
        completions: list[str],
        columns: dict[str, Sequence[Any]],
        state: TrainerState | None = None,
    ) -> RewardResult:
        """Score N completions; `columns` are the dataset's other fields, N values each;
        `state` is the trainer's, for the rewards that take it (TRL's `trainer_state`)."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} completions")
        for key, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")
        batch = (prompts, completions, columns, state or TrainerState(0))
        values = [[math.nan] * n for _ in self.fns]  # per function, per row; NaN for None
        logs = _Logs(n)
        counts: dict[str, float] = {"timeouts": 0, "errors": 0, "slowest_row_s": 0.0}
        retry: list[int] = []
        jobs: list[Job] = []
        for f, (_, fn, _) in enumerate(self.fns):
            jobs += [(f, i) for i in range(n)] if getattr(fn, "rowwise", False) else [(f, None)]
        # symbolic comparisons of one batch share a budget: N hostile rows cost about one
        # timeout, not N (the worker process opens the same budget for each batch it is sent)
        budget = symbolic_budget(SYMBOLIC_BATCH_BUDGET_S)
        with budget, contextlib.closing(self._run(jobs, batch)) as outcomes:
            for (f, row), outcome in zip(jobs, outcomes, strict=True):
                kind, payload, _, seconds, log, said = outcome
                counts["slowest_row_s"] = max(counts["slowest_row_s"], seconds)
                logs.add(self.fns[f][0], log, row)
                if row is not None:
                    logs.keep(f, row, said)
                    values[f][row] = self._row_score(f, row, outcome, counts)
                elif kind == "ok":
                    values[f] = [math.nan if v is None else v for v in payload]
                elif kind == "fatal":
                    raise RewardError(payload)
                else:
                    retry.append(f)
                    self._warn_once(
                        f,
                        "batch",
                        f"failed on a whole batch ({payload or kind}): its rows are scored one "
                        "call each, so a reward that compares a batch's rows scores them alone",
                    )
        for f in retry:
            with symbolic_budget(SYMBOLIC_BATCH_BUDGET_S):
                values[f] = self._score_rows(f, batch, counts, logs)
        for (f, category, message), rows in logs.said.items():
            self._warn_once(f, f"said {message}", f"on {_rows(rows, n)}: {message}", category)
        per_fn = torch.tensor(values, dtype=torch.float32).T.reshape(n, len(self.fns))
        if self._say_unscored and (unscored := per_fn.isnan().all(1).nonzero().flatten().tolist()):
            self._say_unscored = False
            warnings.warn(
                f"no reward function scored {_rows(unscored, n)} (prompt "
                f"{prompts[unscored[0]][:60]!r}): each returned None, failed or timed out "
                "there; a row no function scores gets no reward and is left out of its group's "
                "statistics; check that some reward scores every row (said once a run)",
                RuntimeWarning,
                stacklevel=2,
            )
        return _result(per_fn, self.fns, counts, self._verifier_column, logs)

    def concat(self, results: Sequence[RewardResult]) -> RewardResult:
        """One result for the rows of `results` (batches this runner scored), in order: what one
        `score` call on all of them would return, its metrics over every row."""
        counts = {
            kind: sum(r.metrics[f"reward/{kind}"] for r in results)
            for kind in ("timeouts", "errors")
        }
        counts["slowest_row_s"] = max(r.metrics["reward/slowest_row_s"] for r in results)
        per_fn = torch.cat([r.per_fn for r in results])
        sizes = [len(r.total) for r in results]
        logs = _Logs(sum(sizes))
        for r in results:
            for column, name in r.extra_by.items():
                logs.own_column(column, name)
            for metric, name in r.logged_by.items():
                logs.metrics_by.setdefault(metric, name)
            for metric, numbers in r.logged.items():
                logs.metrics.setdefault(metric, []).extend(numbers)
        logs.extra = {
            name: [v for r, size in zip(results, sizes, strict=True)
                   for v in r.extra.get(name, [None] * size)]
            for name in logs.extra_by
        }  # fmt: skip
        return _result(per_fn, self.fns, counts, self._verifier_column, logs)

    def _score_rows(
        self, f: int, batch: Batch, counts: dict[str, float], logs: _Logs
    ) -> list[float]:
        """The N scores of function `f` called one row at a time (NaN for None)."""
        jobs = [(f, i) for i in range(len(batch[1]))]
        column = []
        with contextlib.closing(self._run(jobs, batch)) as outcomes:
            for (_, i), outcome in zip(jobs, outcomes, strict=True):
                counts["slowest_row_s"] = max(counts["slowest_row_s"], outcome[3])
                logs.add(self.fns[f][0], outcome[4], i)
                logs.keep(f, i, outcome[5])
                column.append(self._row_score(f, i, outcome, counts))
        return column

    def _row_score(self, f: int, i: int, outcome: Outcome, counts: dict[str, float]) -> float:
        """Row `i`'s score by function `f` from the outcome of its own call (NaN for None),
        under the error and timeout policy; counts its timeout or error."""
        kind, payload, exc, *_ = outcome
        if kind == "ok":
            return math.nan if payload[0] is None else payload[0]
        if kind == "fatal":
            raise RewardError(payload)
        if kind == "timeout":
            counts["timeouts"] += 1
            score = "unscored" if self.timeout_score is None else f"scored {self.timeout_score}"
            self._warn_once(
                f,
                "timeout",
                f"took longer than reward.timeout ({self.timeout_s} s) on a row, which is {score} "
                "(reward.timeout_score); a slow reward (a model judge) needs a larger "
                "reward.timeout, or null",
            )
            return math.nan if self.timeout_score is None else self.timeout_score
        if self.on_error == "raise":
            name = self.fns[f][0]
            raise RewardError(f"reward {name!r} failed on sample {i}: {payload}") from exc
        counts["errors"] += 1
        return math.nan

    def _warn_once(
        self, f: int, what: str, message: str, category: type[Warning] = RuntimeWarning
    ) -> None:
        """Say `message` about function `f` the first time `what` happens to it in the run."""
        name = self.fns[f][0]
        if (name, what) not in self._warned:
            self._warned.add((name, what))
            warnings.warn(f"reward {name!r} {message}", category, stacklevel=3)

    def memory_bytes(self) -> int:
        """Device bytes the reward functions hold (a reward model's weights), for the memory
        plan: the sum of their `memory_bytes()`, for those that have one."""
        return sum(fn.memory_bytes() for _, fn, _ in self.fns if hasattr(fn, "memory_bytes"))

    def _run(self, jobs: list[Job], batch: Batch) -> Iterator[Outcome]:
        """One outcome per job, in order; in the worker process when a timeout is set, except
        for the functions that run in-process (see the module docstring)."""
        start = 0
        while start < len(jobs):
            here = self._in_process(jobs[start])
            end = start + 1
            while end < len(jobs) and self._in_process(jobs[end]) == here:
                end += 1
            if here:
                yield from run_jobs(self.fns, jobs[start:end], batch)
            else:
                yield from self._run_in_worker(jobs[start:end], batch)
            start = end

    def _in_process(self, job: Job) -> bool:
        fn = self.fns[job[0]][1]
        return self.timeout_s is None or bool(getattr(fn, "runs_in_process", False))

    def _run_in_worker(self, jobs: list[Job], batch: Batch) -> Iterator[Outcome]:
        start = 0
        try:
            while start < len(jobs):
                if self._worker is None or not self._worker.process.is_alive():
                    self.close()
                    self._worker = Worker(self.fns)
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

    def _receive(self, worker: Worker) -> Outcome:
        """The worker's next outcome; on a timeout or a death the worker is stopped."""
        if not worker.outcomes.poll(self.timeout_s):
            worker.stop(wait_s=0.0)
            self._worker = None
            return ("timeout", None, None, self.timeout_s, None, ())
        try:
            return worker.outcomes.recv()
        except (EOFError, OSError):
            exit_code = worker.stop(wait_s=1.0)
            self._worker = None
            return ("error", f"worker process died (exit code {exit_code})", None, 0.0, None, ())


def logged_metrics(result: RewardResult, taken: Collection[str]) -> dict[str, float]:
    """The mean of each metric the rewards logged in `result` (`log_metric`), by its name. A
    name among `taken` (the metrics the trainer logs in the same row) or under `eval/` (the
    trainer's evaluation rows of the same step) is a RewardError naming the reward: one of
    the two values would be lost, or read as the other."""
    for name, owner in result.logged_by.items():
        if name in taken or name.startswith("eval/"):
            whose = (
                "a metric the trainer logs in the step's row"
                if name in taken
                else "a metric of the trainer's evaluation rows"
            )
            raise RewardError(
                f"reward {owner!r} logged {name!r} with log_metric, {whose}; choose another "
                f"name, such as '{owner}/{name}'"
            )
    return {name: sum(numbers) / len(numbers) for name, numbers in result.logged.items()}


def logged_columns(result: RewardResult, taken: Collection[str]) -> dict[str, list[Any]]:
    """The columns the rewards logged in `result` (`log_extra`); one among `taken` (those
    samples.jsonl writes itself) is a RewardError naming the reward: the trainer's value would
    replace the reward's."""
    for column, owner in result.extra_by.items():
        if column in taken:
            raise RewardError(
                f"reward {owner!r} logged {column!r} with log_extra, a column samples.jsonl "
                f"writes itself; choose another name, such as '{owner}/{column}'"
            )
    return result.extra


def runner_settings(reward: Any) -> dict[str, Any]:
    """`RewardRunner`'s policy from a config's `reward` section (timeout, score of a timed-out
    row, errors): training and evaluation both score under it."""
    return {
        "timeout_s": reward.timeout,
        "timeout_score": reward.timeout_score,
        "on_error": reward.errors,
    }


class _Logs:
    """What the calls on one batch of N completions logged (`RewardLog`s), gathered: a whole
    batch call's `log_extra` columns must hold N values, a call on one row's one; and what the
    calls on one row warned, with the rows that warned it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.extra: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[float]] = {}
        self.extra_by: dict[str, str] = {}  # column -> the function that logged it
        self.metrics_by: dict[str, str] = {}  # metric -> the first function that logged it
        # (function index, category, message) -> the rows whose calls said it, in order
        self.said: dict[tuple[int, type[Warning], str], list[int]] = {}

    def keep(self, f: int, row: int, said: Said) -> None:
        for category, message in said:
            rows = self.said.setdefault((f, category, message), [])
            if row not in rows:  # a call may say a message twice
                rows.append(row)

    def add(self, name: str, log: RewardLog | None, row: int | None) -> None:
        if log is None:
            return
        for logged, names in (("log_extra", log.extra), ("log_metric", log.metrics)):
            if "step" in names:  # metrics.jsonl's and samples.jsonl's rows are numbered by it
                raise RewardError(
                    f"reward {name!r} logged 'step' with {logged}; the trainer numbers its rows "
                    "with that name: choose another"
                )
        for column, values in log.extra.items():
            expected = self.n if row is None else 1
            if len(values) != expected:
                where = "" if row is None else f" for sample {row} alone"
                raise RewardError(
                    f"reward {name!r} logged {len(values)} values of {column!r}{where}; "
                    f"log_extra takes one per completion ({expected})"
                )
            self.own_column(column, name)
            kept = self.extra.setdefault(column, [None] * self.n)
            if row is None:
                kept[:] = values
            else:
                kept[row] = values[0]
        for metric, numbers in log.metrics.items():
            self.metrics_by.setdefault(metric, name)
            self.metrics.setdefault(metric, []).extend(numbers)

    def own_column(self, column: str, name: str) -> None:
        """Record that function `name` logged `column`; a column another function logged is a
        RewardError: samples.jsonl holds one value of it per completion, and one would be lost.
        (Two functions' metrics of one name are averaged together, as TRL averages them.)"""
        owner = self.extra_by.setdefault(column, name)
        if owner != name:
            raise RewardError(
                f"reward {name!r} logged {column!r} with log_extra, a column reward {owner!r} "
                "logged too; choose another name"
            )


def _rows(rows: list[int], n: int) -> str:
    """Rows of a batch of `n`, the first five named: "row 2 of 8", "rows 0, 1, 2, 3, 4 and 3
    more of 8"."""
    if len(rows) == 1:
        return f"row {rows[0]} of {n}"
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"rows {', '.join(map(str, rows[:5]))}{more} of {n}"


def _result(
    per_fn: torch.Tensor,
    fns: list[tuple[str, RewardFn, float]],
    counts: dict[str, float],
    verifier_column: int | None,
    logs: _Logs,
) -> RewardResult:
    """The weighted sum of `per_fn` `[N, n_fns]` (see the module docstring), its metrics and
    what the rewards logged (`logs`)."""
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
    return RewardResult(
        total,
        per_fn,
        metrics,
        verifier_scores,
        logs.extra,
        logs.metrics,
        logs.extra_by,
        logs.metrics_by,
    )
