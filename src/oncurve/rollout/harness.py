"""Episodes an agent harness plays against the policy's OpenAI-compatible endpoint.

`rollout.env: harness:package.module:function` names `async def function(client, model, row)`
that plays one episode of a dataset row with `client`, an `openai.AsyncOpenAI` of the episode's
own (its calls are the episode's, `Endpoint.episode_url`), and returns the episode's reward (a
number, or None: unscored). The G episodes of every row play at once, their requests batched
into the sampler's calls. An episode's transcript is its calls chained token for token: each
call's prompt must begin with the previous call's prompt and completion, exactly as sampled (the
endpoint splices earlier turns back as their tokens); what a later prompt adds (the harness's
tool results, the environment's messages) is fed, read by the forward and out of the loss
(`tool_mask`). An episode whose harness raised, or returned a reward that is not a number or a
mapping without "reward", is scored as `reward.errors` says (raise: the run stops in one line;
none: unscored), one past `rollout.env_timeout_s` scores `reward.timeout_score`; one that asked
nothing, rewrote a turn's text, broke the chain or outgrew its budget is unscored. Each of them
is dropped (all its tokens out of the loss), with one warning line a step.

`rollout.env_timeout_s` bounds the time an episode spends outside its calls to the endpoint
(its environment's time, as the in-process loop counts only `step`): a play's clock stops while
one of its episodes has a request in the endpoint (`Endpoint.seconds_in_calls`), so long
completions cost it nothing, and a harness that neither calls nor returns still times out.

A harness may return, instead of a number, a mapping with the reward under "reward" and other
numbers beside it (the parts of a rubric, say), which are logged as `env/<name>` metrics, and
what ended the episode under "episode_end" ("done", "length": it outgrew its room, "max_turns":
its turn limit; a turn cut at `max_new_tokens` marks it "length" whatever it says). A
harness that scores a group together (`HarnessSettings.groups`: `verifiers`' rubrics compare a
prompt's episodes) is called once per row with the G episodes' clients, `play(clients, model,
row)`, and returns G outcomes, an exception standing for an episode that failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import math
import numbers
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.rollout.endpoint import Call, Endpoint
from oncurve.rollout.env_calls import DONE, ENDINGS, ERROR, LENGTH, TIMEOUT, EnvFaults
from oncurve.types import RolloutBatch

Play = Callable[[Any, str, dict[str, Any]], Awaitable[Any]]
# Plays at once, each on its own thread and event loop: enough for every group of a step's
# batch, few enough that a thousand single episodes do not start a thousand threads
MAX_PLAY_THREADS = 128
PREFIX = "harness:"
# Seconds between two looks at a play's clock while it waits on the endpoint (a timeout can
# come this late)
MIN_LOOK_S = 0.01
# An episode's outcome: its reward (None: unscored), its fault and why, its metrics, and what
# its harness says ended it (`env_calls.ENDINGS`).
Outcome = tuple[float | None, str | None, str, dict[str, float], str]


@dataclasses.dataclass(frozen=True)
class HarnessSettings:
    """The harness's function, the turns and observation tokens an episode may hold (its
    budget), what a fault costs, whether the function plays a row's G episodes at once, the
    chat template's tokens around a message between two turns (`feed_overhead`), which an
    observation's budget holds beside its text, and the variables the endpoint renders the
    template with (`data.chat_template_kwargs`)."""

    play: Play
    max_turns: int
    max_observation_tokens: int
    faults: EnvFaults = EnvFaults()
    groups: bool = False
    observation_overhead: int = 0
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def budget(self, max_new_tokens: int) -> int:
        """Completion columns an episode can fill: every turn at full length, every
        observation at its longest with its template tokens."""
        feeds = (self.max_turns - 1) * (self.max_observation_tokens + self.observation_overhead)
        return self.max_turns * max_new_tokens + feeds


def resolve_harness(spec: str) -> Play:
    """The function `harness:module:function` names; a one-line error when it is missing or
    openai's client (what it is given) is not installed."""
    module_name, _, name = spec.removeprefix(PREFIX).partition(":")
    try:
        importlib.import_module("openai")
        play = getattr(importlib.import_module(module_name), name, None)
    except ImportError as error:
        raise UserError(f"rollout.env {spec}: {error} (pip install 'oncurve[harness]')") from None
    if not callable(play):
        raise UserError(f"rollout.env {spec}: {module_name} has no function {name!r}")
    return play


def play_harness(
    sampler: Sampler,
    rows: list[dict[str, Any]],
    group_size: int,
    params: SamplingParams,
    settings: HarnessSettings,
) -> tuple[RolloutBatch, dict[str, list]]:
    """G episodes of each of `rows` (a row's G contiguous): the rollout, and per episode its
    reward (`episode_reward`, NaN: unscored), policy turns (`turns`), fault (`episode_fault`:
    None, "error" or "timeout"), what ended it (`episode_end`: its fault, else "length" when any
    of its turns was cut at the token limit, else what its harness said, "done" unless it
    returned another) and the numbers its harness returned beside the reward
    (`episode_metrics`)."""
    import openai

    n = len(rows) * group_size
    timeout_s = settings.faults.timeout_s
    endpoint = Endpoint(
        sampler, params, seed=params.seed or 0, chat_template_kwargs=settings.chat_template_kwargs
    )
    with endpoint:

        async def played(episodes: range) -> list[Outcome]:
            clients = [
                openai.AsyncOpenAI(
                    base_url=endpoint.episode_url(k), api_key="oncurve", max_retries=0
                )
                for k in episodes
            ]
            row = rows[episodes.start // group_size]
            players = clients if settings.groups else clients[0]
            started = time.monotonic()

            def own_seconds() -> float:
                return time.monotonic() - started - endpoint.seconds_in_calls(episodes)

            try:
                returned = await _within(
                    settings.play(players, endpoint.model_name, row), timeout_s, own_seconds
                )
                if timeout_s is not None and own_seconds() > timeout_s:
                    # it blocked its loop, where no timer could interrupt it
                    why = (
                        f"the harness took over {timeout_s:g} s outside its endpoint calls and "
                        "blocked its event loop"
                    )
                    return [(None, TIMEOUT, why, {}, DONE)] * len(episodes)
                if not settings.groups:
                    return [_outcome(returned)]
                if isinstance(returned, list | tuple) and len(returned) == group_size:
                    return [_outcome(value) for value in returned]
                why = f"the harness returned {type(returned).__name__}, not {group_size} outcomes"
                return [(None, ERROR, why, {}, DONE)] * group_size
            except TimeoutError:
                why = f"the harness took over {timeout_s:g} s outside its endpoint calls"
                return [(None, TIMEOUT, why, {}, DONE)] * len(episodes)
            except (Exception, asyncio.CancelledError) as error:  # the harness's own bug
                return [_outcome(error)] * len(episodes)
            finally:
                for client in clients:
                    await client.close()

        def play_alone(episodes: range) -> list[Outcome]:
            return asyncio.run(played(episodes))

        # Each play on a thread and event loop of its own (whatever loop runs in this one): a
        # harness that blocks its loop holds up only its own episodes (up to MAX_PLAY_THREADS
        # at once; a play's clock starts when it does).
        size = group_size if settings.groups else 1
        plays = [range(k, k + size) for k in range(0, n, size)]
        with ThreadPoolExecutor(max(1, min(len(plays), MAX_PLAY_THREADS))) as threads:
            outcomes = [outcome for part in threads.map(play_alone, plays) for outcome in part]
    calls: list[list[Call]] = [[] for _ in range(n)]
    for call in endpoint.calls:
        if call.episode is not None:  # every episode's client has its own URL
            calls[call.episode].append(call)
    budget = settings.budget(params.max_new_tokens)
    rewards, faults, notes, chains, endings = [], [], [], [], []
    for (reward, fault, why, _, said), episode in zip(outcomes, calls, strict=True):
        chain, broken = _chain(episode, budget)
        if fault is not None:  # the reward settings' to score (reward.errors=raise: stop)
            reward = settings.faults.score(fault, why)
        elif broken:  # tokens that cannot train: dropped whatever the settings
            fault, why, reward = ERROR, broken, None
        if fault is not None:
            notes.append(why)
        rewards.append(math.nan if reward is None else float(reward))
        faults.append(fault)
        chains.append(chain if fault is None else None)
        endings.append(fault or (LENGTH if chain.cut else said))
    if notes:
        scored = [r for r, f in zip(rewards, faults, strict=True) if f and not math.isnan(r)]
        said = ", ".join(
            f"{scored.count(r)} scored {r:g}" for r in dict.fromkeys(scored)
        )  # the fault settings' scores (a timeout's timeout_score)
        how = f" ({said} by the fault settings)" if said else ", unscored"
        print(
            f"oncurve: warning: {len(notes)} of {n} harness episodes dropped from the loss"
            f"{how}; the first: {notes[0]}",
            file=sys.stderr,
        )
    return _rollout(sampler, chains, rows, group_size), {
        "episode_reward": rewards,
        "turns": [len(episode) for episode in calls],
        "episode_fault": faults,
        "episode_end": endings,
        "episode_metrics": [metrics for _, _, _, metrics, _ in outcomes],
    }


async def _within(
    play: Awaitable[Any], limit_s: float | None, own_seconds: Callable[[], float]
) -> Any:
    """What `play` returns; TimeoutError (`play` cancelled) once `own_seconds()`, the time it
    has spent, passes `limit_s` (None: no limit)."""
    task = asyncio.ensure_future(play)
    if limit_s is None:
        return await task
    while not task.done():
        left = limit_s - own_seconds()
        if left <= 0:
            task.cancel()
            await asyncio.wait({task})  # its cleanup runs, as asyncio.wait_for's does
            raise TimeoutError
        # while a call is in progress the time left does not shrink: look again after a
        # short while at least, not in a busy loop
        await asyncio.wait({task}, timeout=max(left, MIN_LOOK_S))
    return task.result()


def _outcome(value: Any) -> Outcome:
    """What a harness returned for one episode as its outcome: a number or None, a mapping with
    the reward under "reward", optionally what ended the episode under "episode_end" (one of
    `ENDINGS`; else `done`) and numbers beside them (a mapping without "reward", or with
    another "episode_end", is an error), or the exception that ended it (a TimeoutError: the
    episode timed out)."""
    if isinstance(value, TimeoutError):
        return None, TIMEOUT, f"the harness's episode timed out: {value}", {}, DONE
    if isinstance(value, Exception):
        return None, ERROR, f"the harness raised {type(value).__name__}: {value}", {}, DONE
    metrics: dict[str, float] = {}
    ending = DONE
    if isinstance(value, Mapping):
        if "reward" not in value:
            keys = ", ".join(repr(k) for k in value)
            why = f'the harness returned a mapping without a "reward" key (its keys: {keys})'
            return None, ERROR, why, {}, DONE
        ending = value.get("episode_end", DONE)
        if ending not in ENDINGS:
            named = f"{', '.join(ENDINGS[:-1])} or {ENDINGS[-1]}"
            why = f"the harness returned the episode_end {ending!r} ({named})"
            return None, ERROR, why, {}, DONE
        metrics = {
            str(k): float(v)
            for k, v in value.items()
            if k not in ("reward", "episode_end") and v is not None and _is_number(v)
        }
        value = value.get("reward")
    if not _is_number(value):
        return None, ERROR, f"the harness returned the reward {value!r}", {}, DONE
    return None if value is None else float(value), None, "", metrics, ending


def _is_number(value: Any) -> bool:
    """Whether `value` is None or a finite real number that is not a bool: numpy's scalars
    (a rubric's float32) count as numbers."""
    return value is None or (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= torch.finfo(torch.float32).max  # rewards are float32: larger is inf
    )


@dataclasses.dataclass
class _Chain:
    """An episode's tokens: its first prompt, then every later token with whether the policy
    sampled it and its logprob; how its last turn ended, and whether any turn was cut at the
    token limit."""

    prompt: list[int]
    tokens: list[int]
    sampled: list[bool]
    logprobs: list[float]
    finish_reason: str
    cut: bool = False


def _chain(calls: list[Call], budget: int) -> tuple[_Chain, str]:
    """The episode's calls chained token for token, and why they do not chain ("" when they
    do)."""
    if not calls:
        return _Chain([], [], [], [], "length"), "the harness asked the endpoint nothing"
    first = calls[0]
    chain = _Chain(list(first.prompt_ids), [], [], [], first.finish_reason)
    for k, call in enumerate(calls):
        if call.rewritten:
            return chain, "the harness sent back a turn's text rewritten"
        seen = chain.prompt + chain.tokens
        if call.prompt_ids[: len(seen)] != seen:
            return chain, f"call {k + 1}'s prompt does not continue the episode's tokens"
        fed = call.prompt_ids[len(seen) :]
        chain.tokens += fed + call.completion_ids
        chain.sampled += [False] * len(fed) + [True] * len(call.completion_ids)
        chain.logprobs += [0.0] * len(fed) + list(call.logprobs)
        chain.finish_reason = call.finish_reason
        chain.cut = chain.cut or call.finish_reason == "length"
    if len(chain.tokens) > budget:
        return chain, f"the episode's {len(chain.tokens)} tokens exceed its budget of {budget}"
    return chain, ""


def _rollout(
    sampler: Sampler, chains: list[_Chain | None], rows: list[dict[str, Any]], group_size: int
) -> RolloutBatch:
    """The episodes as a RolloutBatch: each group's prompt is what its kept episodes' first
    prompts share (the row's own prompt when none is kept); the rest of each is fed, with the
    later tokens, in the completion. A dropped episode (None) is the prompt alone."""
    pad = sampler.tokenizer.pad_token_id or 0
    model = getattr(sampler, "model", None)
    device = next(model.parameters()).device if model is not None else torch.device("cpu")
    prompts, completions = [], []
    for g in range(0, len(chains), group_size):
        kept = [c for c in chains[g : g + group_size] if c is not None]
        shared = (
            _common_prefix([c.prompt for c in kept])
            if kept
            else rows[g // group_size]["prompt_ids"]
        )
        if not shared:
            raise UserError(
                "rollout.env harness: the episodes of one row start with no token in common"
            )
        for c in chains[g : g + group_size]:
            c = c or _Chain(shared, [], [], [], "length")
            extra = c.prompt[len(shared) :]
            prompts.append(shared)
            completions.append(
                (
                    extra + c.tokens,
                    [False] * len(extra) + c.sampled,
                    [0.0] * len(extra) + c.logprobs,
                )
            )
    width_p = max(len(p) for p in prompts)
    width_t = max(1, max(len(t) for t, _, _ in completions))

    def right(values: list, fill: float) -> list:
        return values + [fill] * (width_t - len(values))

    def tensor(rows: list[list], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(rows, dtype=dtype, device=device)

    texts = [sampler.tokenizer.decode(t, skip_special_tokens=True) for t, _, _ in completions]
    return RolloutBatch(
        prompt_ids=tensor([[pad] * (width_p - len(p)) + p for p in prompts]),
        prompt_mask=tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in prompts]),
        completion_ids=tensor([right(t, pad) for t, _, _ in completions]),
        completion_mask=tensor([right([1] * len(t), 0) for t, _, _ in completions]),
        logprobs=tensor([right(lps, 0.0) for _, _, lps in completions], torch.float32),
        texts=texts,
        finish_reasons=[c.finish_reason if c is not None else "length" for c in chains],
        group_size=group_size,
        tool_mask=tensor(
            [right([int(not x) for x in sampled], 0) for _, sampled, _ in completions]
        ),
    )


def _common_prefix(lists: list[list[int]]) -> list[int]:
    shortest = min(lists, key=len)
    for i, token in enumerate(shortest):
        if any(other[i] != token for other in lists):
            return shortest[:i]
    return list(shortest)
