"""Reward functions written for TRL's `GRPOTrainer`, called as TRL calls them.

TRL calls a reward function with keywords: `prompts`, `completions`, `completion_ids`, every other
dataset column by its name, `trainer_state` (its `global_step` the optimizer steps done before the
sampling, and `max_steps` the run's, as TRL counts them), and `log_extra(column, values)` /
`log_metric(name, value)`, whose values land in samples.jsonl and the step's metrics. When the
dataset's prompts are messages, `prompts` are the rows' message lists (after the system prompt the
policy was given) and each completion is one assistant message,
`[{"role": "assistant", "content": text}]`, which is what `completion[0]["content"]` reads. An
`async def` function is awaited on `REWARD_LOOP`, the one event loop that every async reward of the
process shares for the run, as TRL's; the runner awaits the batch calls of several together
(`oncurve.rewards.jobs.run_jobs`), an object whose `__call__` is `async def` among them, as TRL
does.

A `module:function` reward is wrapped in `TrlReward`; the built-ins keep the plain protocol of
`oncurve.rewards.registry` (texts, columns).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from oncurve.background_loop import BackgroundLoop

# The column that holds a conversational row's messages (`oncurve.data.files.load_rows`).
MESSAGES_COLUMN = "prompt_messages"
# The loop every async reward function of this process is awaited on.
REWARD_LOOP = BackgroundLoop("oncurve-rewards")


@dataclass(frozen=True)
class TrainerState:
    """What TRL's `trainer_state` offers a reward function: the optimizer steps done (0 while
    the first step is sampled and in an evaluation before it) and the run's number of optimizer
    steps, when known (`oncurve.loop.collect.trainer_state`)."""

    global_step: int
    max_steps: int | None = None


@dataclass
class RewardLog:
    """What one call of a reward function logged: `extra` column -> one value per completion
    it scored, `metrics` name -> the values it logged."""

    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def log_extra(self, column: str, values: list[Any]) -> None:
        """TRL's `log_extra`: one value per completion, shown beside each in samples.jsonl."""
        self.extra.setdefault(str(column), []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        """TRL's `log_metric`: a number, averaged over the step into its metrics; NaN and inf
        are left out of the average, as a reward's None is."""
        number = float(value)
        if math.isfinite(number):
            self.metrics.setdefault(str(name), []).append(number)


class ColumnMissing(TypeError):
    """A reward function needs an argument that no column of the data holds: the function's
    fault, not a row's, so no error policy scores it as a row's error."""


def call_context(log: RewardLog, state: TrainerState) -> dict[str, Any]:
    """The keywords a reward that takes the call's context (`takes_context`) gets beside the
    columns: TRL's own names, which no column may take (`oncurve.data.files.TRAINER_COLUMNS`),
    so that every other name stays free for the data's columns."""
    return {"trainer_state": state, "log_extra": log.log_extra, "log_metric": log.log_metric}


class TrlReward:
    """A reward function with TRL's contract (see the module docstring), callable as a
    `RewardFn` that also takes the call's context (`call_context`). Attributes the runner reads
    (`rowwise`, `runs_in_process`) are the function's own."""

    takes_context = True

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__name__ = reward_name(fn)
        self.is_async = _is_async(fn)
        try:  # read once: every call of the function asks what it takes
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a callable without one is called as TRL calls it
            self.signature = None
        for attribute in ("rowwise", "runs_in_process"):
            if hasattr(fn, attribute):
                setattr(self, attribute, getattr(fn, attribute))

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> Any:
        """The function's scores; `columns` hold the call's context (`call_context`) too."""
        result = self._call(prompts, completions, columns)
        return REWARD_LOOP.run(_awaited(result)) if inspect.isawaitable(result) else result

    def coroutine(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> Coroutine[Any, Any, Any]:
        """The call as a coroutine, to be awaited beside other async rewards."""
        return _awaited(self._call(prompts, completions, columns))

    def _call(self, prompts: list[str], completions: list[str], columns: dict[str, Any]) -> Any:
        columns = dict(columns)
        messages = columns.pop(MESSAGES_COLUMN, None)
        if messages is not None:
            prompts = messages
            completions = [[{"role": "assistant", "content": text}] for text in completions]
        context = _accepted(self.signature, columns)
        keywords = {"prompts": prompts, "completions": completions, **context}
        if _binds(self.signature, tuple(keywords)):
            return self.fn(**keywords)
        parameters = self.signature.parameters if self.signature is not None else {}
        if "completions" in parameters or "prompts" in parameters:  # TRL's names: by keyword
            taken = _accepted(self.signature, keywords)
            missing = [name for name in _required(self.signature) if name not in taken]
            if missing:  # called positionally, it would take the completions for it
                raise ColumnMissing(
                    f"its argument {missing[0]!r} is no column of the data nor anything the "
                    "trainer passes"
                )
            return self.fn(**taken)
        return self.fn(prompts, completions, **context)


def reward_name(fn: Callable[..., Any]) -> str:
    """The name TRL logs a reward function under: its `__name__`, a `functools.partial`'s being
    the function's it wraps, and an object's without one its class's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` returns a coroutine, as TRL tells: an `async def` function, a
    `functools.partial` of one, or an object whose `__call__` is `async def`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def _awaited(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


def _accepted(signature: inspect.Signature | None, context: dict[str, Any]) -> dict[str, Any]:
    """The keywords of `context` that a function of `signature` can take: all of them when it
    takes `**kwargs` (or has no signature), else those it names. The trainer passes columns a
    dataset does not have (`answer` read off TRL's `solution`, `completion_lengths`), which a
    function listing TRL's keywords one by one does not take."""
    if signature is None:
        return context
    parameters = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return context
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {name: value for name, value in context.items() if name in named}


def _required(signature: inspect.Signature) -> list[str]:
    """The parameters of `signature` a keyword call must give (no default)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, parameter in signature.parameters.items()
        if parameter.kind in kinds and parameter.default is inspect.Parameter.empty
    ]


def _binds(signature: inspect.Signature | None, names: tuple[str, ...]) -> bool:
    """Whether a function of `signature` takes every one of `names` by keyword, as TRL calls a
    reward (a parameter list of its own, `**kwargs` alone, or a wrapper's `*args, **kwargs`);
    else one that names `completions` or `prompts` is called with the keywords it takes (one it
    needs and no column holds is an error), and any other positionally, as `fn(prompts,
    completions, **columns)`, whatever its first two parameters are named. A callable without a
    signature is called as TRL calls it."""
    if signature is None:
        return True
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError:
        return False
    return True
