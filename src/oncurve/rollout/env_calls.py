"""An environment's `step` called so that no environment can end or hang a run: each call on a
daemon thread of its own, given what is left of its episode's time, its result checked. An
exception, a call past the episode's time, a result that is not (text or None, a finite
number, a bool), an `episode_end` that is none of `ENDINGS`, or rewards whose sum is past
float32's range is a fault, which the reward settings turn into the episode's score
(`EnvFaults`)."""

from __future__ import annotations

import math
import numbers
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy

from oncurve.errors import UserError

ERROR, TIMEOUT = "error", "timeout"
# What ended an episode that no fault ended: the environment (`done`, or no observation; a
# harness that returned), a turn cut at the token limit, or the turn limit (`max_turns`).
DONE, LENGTH, MAX_TURNS = "done", "length", "max_turns"
ENDINGS = (DONE, LENGTH, MAX_TURNS)


@dataclass(frozen=True)
class EnvFaults:
    """What a faulty environment costs: `timeout_s` seconds of `step` calls per episode (None:
    no limit), then the episode ends and scores `timeout_score` (None: unscored); a step that
    raises or returns a malformed result stops the run in one line (`on_error` "raise") or
    leaves the episode unscored ("none")."""

    timeout_s: float | None = None
    on_error: str = "raise"
    timeout_score: float | None = 0.0

    def score(self, kind: str, why: str) -> float:
        """The episode's reward after a fault of `kind` (NaN: unscored); UserError with `why`
        when faults stop the run."""
        if kind == TIMEOUT:
            return math.nan if self.timeout_score is None else self.timeout_score
        if self.on_error == "raise":
            raise UserError(f"rollout.env: {why} (reward.errors=none scores such episodes None)")
        return math.nan


@dataclass(frozen=True)
class StepResult:
    """One `step` call's (observation, reward, done) and, when it ended the episode, what the
    environment says ended it (`ending`, one of `ENDINGS`), or its fault ("error" or
    "timeout") and why; `seconds` the call took (at most the time it was given)."""

    observation: str | None = None
    reward: float = 0.0
    done: bool = True
    fault: str | None = None
    why: str = ""
    seconds: float = 0.0
    ending: str = DONE


# The largest float32: an episode's reward is summed in it.
_FLOAT32_MAX = 3.4028234663852886e38


def call_steps(envs: list[Any], turns: list[str], seconds: list[float | None]) -> list[StepResult]:
    """`envs[i].step(turns[i])` for every i at once, each on a daemon thread (a call that never
    returns is left running and cannot hold the process at exit), waiting at most `seconds[i]`
    for it (None: as long as it takes); the environment of a call left running is abandoned
    (`abandon`) at its own limit. A step that ends its episode (done, or no observation) takes
    its ending from the environment's `episode_end` (None or none at all: `done`)."""
    results: list[StepResult | None] = [None] * len(envs)

    def call(i: int) -> None:
        start = time.perf_counter()
        try:
            result = _checked(envs[i].step(turns[i]), time.perf_counter() - start)
            results[i] = _with_ending(envs[i], result)
        # an environment's own bug, `sys.exit` in a library's code included: its episode's
        # fault, not the run's (nor a timeout: the call ended)
        except BaseException as error:
            why = f"step raised {type(error).__name__}: {error}"
            results[i] = StepResult(fault=ERROR, why=_one_line(why))

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(envs))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    outcomes: dict[int, StepResult] = {}
    # the soonest time limit first: a call left running is abandoned at its own limit, so that
    # what it holds (the games' generators) is free for the calls with more time left
    for i in sorted(range(len(envs)), key=lambda i: math.inf if seconds[i] is None else seconds[i]):
        limit = seconds[i]
        thread = threads[i]
        thread.join(None if limit is None else max(0.0, start + limit - time.perf_counter()))
        result = results[i]
        if thread.is_alive() or result is None:
            abandon(envs[i])
            why = f"step took longer than the {limit or 0:g} s left of its episode"
            result = StepResult(fault=TIMEOUT, why=why, seconds=limit or 0.0)
        outcomes[i] = result
    return [outcomes[i] for i in range(len(envs))]


def call_reset(env: Any, row: dict[str, Any], seconds: float | None) -> str:
    """`env.reset(row)` on a daemon thread, waiting at most `seconds` (None: as long as it
    takes): the episode's first message, or a one-line UserError when it raised, took longer
    (the environment then abandoned) or returned something other than text (no episode can
    start: the run stops)."""
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(env.reset(row))
        except BaseException as error:  # handed to the caller's thread
            outcome.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        abandon(env)
        raise UserError(
            f"rollout.env: reset took longer than {seconds:g} s (rollout.env_timeout_s)"
        )
    (first,) = outcome
    if isinstance(first, UserError):
        raise first
    if isinstance(first, Exception):
        why = _one_line(f"reset raised {type(first).__name__}: {first}")
        raise UserError(f"rollout.env: {why}") from None
    if isinstance(first, BaseException):
        raise first
    if not isinstance(first, str):
        raise UserError(
            f"rollout.env: reset returned {type(first).__name__}, not the first message's text"
        )
    return first


def abandon(env: Any) -> None:
    """Tells `env` that a call of it is left running and its episode is over (its `abandon`,
    where it has one), so that it frees what the call holds for the other episodes."""
    hook = getattr(env, "abandon", None)
    if hook is not None:
        hook()


def _checked(result: Any, seconds: float) -> StepResult:
    """`step`'s return value as a StepResult, or an error naming what is wrong with it."""
    if not isinstance(result, tuple) or len(result) != 3:
        why = f"step returned {type(result).__name__}, not (observation, reward, done)"
        return StepResult(fault=ERROR, why=why, seconds=seconds)
    observation, reward, done = result
    if (
        isinstance(reward, bool)
        or not isinstance(reward, numbers.Real)
        # NaN: the episode is unscored (no answer to score it against); past float32's range
        # the episode's reward would be infinite
        or abs(reward) > _FLOAT32_MAX
    ):
        why = f"step returned the reward {reward!r}, not a finite number or NaN"
        return StepResult(fault=ERROR, why=_one_line(why), seconds=seconds)
    if observation is not None and not isinstance(observation, str):
        why = f"step returned an observation of type {type(observation).__name__}, not text"
        return StepResult(fault=ERROR, why=why, seconds=seconds)
    # a flag, not anything truthy: `done="no"` would end the episode
    if not isinstance(done, bool | numpy.bool_):
        why = f"step returned done={done!r}, not True or False"
        return StepResult(fault=ERROR, why=_one_line(why), seconds=seconds)
    return StepResult(observation, float(reward), bool(done), seconds=seconds)


def _with_ending(env: Any, result: StepResult) -> StepResult:
    """`result` with what `env` says ended its episode, when the step ended it; an error when
    what it says is none of `ENDINGS`."""
    if result.fault is not None or not (result.done or result.observation is None):
        return result
    said = getattr(env, "episode_end", None)
    if said is None:
        return result
    if said not in ENDINGS:
        named = f"{', '.join(ENDINGS[:-1])} or {ENDINGS[-1]}"
        why = _one_line(f"step ended the episode with episode_end={said!r}, not {named}")
        return StepResult(fault=ERROR, why=why, seconds=result.seconds)
    return replace(result, ending=said)


def add_reward(total: float, result: StepResult) -> tuple[float, StepResult]:
    """The episode's reward `total` with a faultless step's reward added, and the step's
    result; an error fault instead when the sum is past float32's range (the episode's reward
    would be infinite), the total then as it was. NaN sums to NaN: unscored, no fault."""
    if result.fault is not None:
        return total, result
    summed = total + result.reward
    if abs(summed) > _FLOAT32_MAX:
        why = f"the episode's rewards sum to {summed:g}, not a finite float32"
        return total, StepResult(fault=ERROR, why=why, seconds=result.seconds)
    return summed, result


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]
