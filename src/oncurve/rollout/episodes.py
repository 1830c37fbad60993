"""Multi-turn rollouts: the policy's turns alternate with an environment's observations.

An episode starts from the first message of `Environment.reset(row)`, formatted like any prompt
(chat template, system prompt). The policy samples a turn; the turn ends at EOS, a stop string
or `max_new_tokens`; `Environment.step(turn)` answers with an observation, a reward and whether
the episode is over. A turn cut at `max_new_tokens` is no finished action: it ends the episode
without a `step` (the environment never sees it). An observation becomes tokens
(`ObservationFormat`: with a chat template, exactly what the template puts between the end of an
assistant turn and the start of the next one) that are fed into the KV cache one decode step
at a time, batched with the other rows' sampled tokens: the prompt and every earlier turn stay
cached. After `max_turns` model turns the episode ends whatever the environment says. Each
episode records what ended it (`oncurve.rollout.env_calls.ENDINGS`, or its fault).

The result is an ordinary `RolloutBatch` whose completion is the whole transcript after the
prompt (turns and observations), with `tool_mask` marking the observation tokens: the trainer's
forward reads them, the loss skips them, and their sampler logprobs are 0. An episode's reward
is the sum of its steps' rewards; the trainer's group advantage is computed on it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from oncurve.errors import UserError, error_line
from oncurve.rollout.base import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    MAX_CHARS_PER_TOKEN,
    Sampler,
    SamplingParams,
    seeded_generator,
    spelled_out,
)
from oncurve.rollout.env_calls import (
    LENGTH,
    MAX_TURNS,
    EnvFaults,
    add_reward,
    call_reset,
    call_steps,
)
from oncurve.rollout.harness import HarnessSettings, play_harness
from oncurve.rollout.torch_sampler import COMPACT_FRACTION, TorchSampler, sample_tokens
from oncurve.types import RolloutBatch


class Environment(Protocol):
    """One episode's environment; a fresh instance per episode (`rollout.env` names the class).

    `reset(row)` gets the dataset row ({"prompt", "answer", ...}) and returns the first user
    message. `step(turn)` gets the text of the policy's latest turn (special tokens skipped, cut
    after a stop string; a turn cut at `max_new_tokens` is given to none: the episode ends) and
    returns (observation or None, reward, done); the episode ends when done is true or the
    observation is None. `step` may be called from a worker thread.
    An environment may also have `abandon()`: called when a `reset` or `step` of it ran past the
    episode's time and is left running (the episode is over), to free what that call holds;
    and `episode_end`, read after the `step` that ended the episode: what ended it, one of
    `env_calls.ENDINGS` (`max_turns`: its own turn limit; None or none at all: `done`).
    """

    def reset(self, row: dict[str, Any]) -> str: ...

    def step(self, turn: str) -> tuple[str | None, float, bool]: ...


EnvFactory = Callable[[], Environment]


def resolve_environment(spec: str, args: dict[str, Any] | None = None) -> EnvFactory:
    """A factory of fresh environments for `rollout.env`: a built-in name (`python_tool`), a
    library's game or server (`textarena:<id>`, `gem:<id>`, `openenv:<url>`: `LIBRARIES`) or
    a `package.module:Class` path, called with `args` (`rollout.env_args`). One environment is
    created here, so that a module that does not import, arguments its signature does not take
    or a constructor that raises stop the run in one line (UserError) before it starts."""
    from oncurve.envs import ENVIRONMENTS, LIBRARIES

    library, _, game = spec.partition(":")
    if spec in ENVIRONMENTS:
        cls = ENVIRONMENTS[spec]
    elif library in LIBRARIES and game:
        cls = functools.partial(LIBRARIES[library], game)
    elif ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr, None)
        # the user's module fails to import in any way (a missing package, a syntax error, an
        # error in its top-level code): theirs to fix, said in one line
        except Exception as e:
            raise UserError(
                f"rollout.env {spec!r}: cannot import {module_name!r} ({error_line(e)})"
            ) from None
        if cls is None:
            raise UserError(f"rollout.env {spec!r}: module {module_name!r} has no {attr!r}")
        if not callable(cls):
            raise UserError(f"rollout.env {spec!r}: {attr!r} is not a class")
    else:
        raise UserError(
            f"rollout.env {spec!r}: not a built-in ({', '.join(ENVIRONMENTS)}), not "
            f"{' or '.join(f'{name}:<id>' for name in LIBRARIES)} and not a `module:Class` path"
        )
    kwargs = dict(args or {})
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check the arguments against
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as e:
            raise UserError(f"rollout.env_args do not fit rollout.env {spec!r}: {e}") from None
    try:
        cls(**kwargs)
    except UserError:  # an adapter's own one line
        raise
    # the environment's own constructor fails: the run cannot play it
    except Exception as e:
        raise UserError(
            f"rollout.env {spec!r}: creating the environment raised {error_line(e)}"
        ) from None
    return functools.partial(cls, **kwargs)


def observation_role(make_env: EnvFactory) -> str | None:
    """The chat role of an environment's observations: its class's `observation_role`, else
    None (a tool's output)."""
    while isinstance(make_env, functools.partial):
        make_env = make_env.func
    return getattr(make_env, "observation_role", None)


class ObservationFormat:
    """An observation's text -> the token ids fed after a policy turn.

    With a chat template: the template's rendering of a `role` message (a "tool" message where
    the template renders one, else "user") that follows an assistant turn, up to and including
    the next assistant header, less the end-of-turn text when the turn already ended with the
    EOS token; `role` names the role instead (a game's messages are the user's). Without one:
    the observation between newlines. The template is rendered with `template_kwargs`
    (`data.chat_template_kwargs`). The observation's own text is cut to its last
    `max_tokens` tokens first (its newest text), so that the episode's length is bounded, and
    is tokenized as text: an added token's name it prints (`<|im_end|>`, or Qwen's
    `</tool_response>`, `<tool_call>`, which are not special) is not that token, so no output
    can end the turn or forge another, a tool's response or a call.
    """

    _MARK = "\u2063oncurve-turn\u2063"
    _CONTENT = "\u2063oncurve-content\u2063"

    def __init__(
        self,
        tokenizer: Any,
        chat_template: bool,
        max_tokens: int,
        role: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs or {}
        # added tokens that are not special (Qwen's `<tool_call>`, `<tool_response>`, `<think>`):
        # `split_special_tokens` leaves them tokens, so their names are spelled out here
        added = getattr(tokenizer, "added_tokens_decoder", {})
        names = sorted((t.content for t in added.values() if not t.special), key=len, reverse=True)
        self._added_names = re.compile("|".join(map(re.escape, names))) if names else None
        self._spelled: dict[str, list[int]] = {}  # each name's ids, spelled once a run
        self.chat_template = chat_template
        self.max_tokens = max_tokens
        self.role = role or ("tool" if chat_template and self._renders("tool") else "user")
        # the tokens around an empty observation: with max_tokens, the longest possible feed
        self.overhead = len(self(" ", ended_with_eos=False))

    def __call__(self, observation: str, ended_with_eos: bool) -> list[int]:
        """Token ids of `observation` after a turn that ended with EOS or not."""
        encode = functools.partial(self.tokenizer, add_special_tokens=False)
        # the end is kept: what is newest (a game's latest feedback, a traceback's error) comes
        # last. No token holds more characters: a megabyte of output is not tokenized for a few
        # tokens
        text = observation[-self.max_tokens * MAX_CHARS_PER_TOKEN :]
        ids = self._text_ids(text)[-self.max_tokens :]
        if not self.chat_template:
            before, after = "\n", "\n"
        else:
            before, _, after = self._between_turns(self._CONTENT, self.role).partition(
                self._CONTENT
            )
            end = self.tokenizer.eos_token or ""
            if ended_with_eos and end and before.startswith(end):
                before = before[len(end) :]
        return encode(before)["input_ids"] + ids + encode(after)["input_ids"]

    def _text_ids(self, text: str) -> list[int]:
        """`text`'s token ids with every added token's name in it as that name's text."""
        encode = functools.partial(
            self.tokenizer, add_special_tokens=False, split_special_tokens=True
        )
        if self._added_names is None or not self._added_names.search(text):
            return encode(text)["input_ids"]
        ids, at = [], 0
        for name in self._added_names.finditer(text):
            if name[0] not in self._spelled:
                self._spelled[name[0]] = spelled_out(self.tokenizer, name[0])
            ids += encode(text[at : name.start()])["input_ids"] + self._spelled[name[0]]
            at = name.end()
        return ids + encode(text[at:])["input_ids"]

    def _between_turns(self, content: str, role: str) -> str:
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": self._MARK},
            {"role": role, "content": content},
        ]
        full = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )
        at = full.rfind(self._MARK)
        if at < 0:
            raise UserError("the chat template drops assistant turns: no multi-turn rollouts")
        return full[at + len(self._MARK) :]

    def _renders(self, role: str) -> bool:
        probe = "\u2063probe\u2063"
        try:
            return probe in self._between_turns(probe, role)
        except Exception:  # a template that rejects the role (e.g. raise_exception)
            return False


def feed_overhead(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> int:
    """The chat template's tokens around one message a harness adds after a turn (the turn's
    end, the message's header, the next assistant header; a tool message's where the template
    renders one, or a user's, whichever is longer), rendered with `template_kwargs`; 0 without
    a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return 0
    return max(
        ObservationFormat(tokenizer, True, 1, role, template_kwargs).overhead
        for role in (None, "user")
    )


@dataclass
class Episodes:
    """What `run_episodes` returns.

    Attributes:
        rollout: N = B*G transcripts after the prompt, `tool_mask` on observation tokens.
        rewards: `[N]` float32 the sum of each episode's step rewards (on the CPU); after a
            fault, what `EnvFaults` scores it (NaN: unscored).
        turns: `[N]` policy turns per episode.
        faults: per episode None, or the fault that ended it ("error", "timeout").
        endings: per episode what ended it: one of `env_calls.ENDINGS`, or its fault.
    """

    rollout: RolloutBatch
    rewards: torch.Tensor
    turns: torch.Tensor
    faults: list[str | None]
    endings: list[str]


@dataclass(frozen=True)
class EpisodeSettings:
    """`rollout.max_turns`, the environment factory and how prompts and observations become
    token ids."""

    make_env: EnvFactory
    max_turns: int
    encode_prompt: Callable[[str], list[int]]
    observation: ObservationFormat
    faults: EnvFaults = EnvFaults()

    def budget(self, max_new_tokens: int) -> int:
        """Completion columns an episode can fill: every turn at full length, every
        observation at its longest."""
        feeds = (self.max_turns - 1) * (self.observation.max_tokens + self.observation.overhead)
        return self.max_turns * max_new_tokens + feeds


def draw(
    sampler: Sampler,
    episodes: EpisodeSettings | HarnessSettings | None,
    rows: list[dict],
    group_size: int,
    params: SamplingParams,
) -> tuple[RolloutBatch, dict[str, list]]:
    """G completions of each of `rows`, or G multi-turn episodes (played here, or by a harness:
    `oncurve.rollout.harness`) with the columns they add for the rewards, one value per episode:
    `episode_reward`, `turns`, `episode_fault`, `episode_end` (`Episodes.endings`) (and a
    harness's `episode_metrics`)."""
    if episodes is None:
        return sampler.generate_ids([r["prompt_ids"] for r in rows], group_size, params), {}
    if isinstance(episodes, HarnessSettings):
        return play_harness(sampler, rows, group_size, params, episodes)
    if not isinstance(sampler, TorchSampler):
        raise UserError(
            f"rollout.env needs a decode-loop sampler backend, not {type(sampler).__name__}"
        )
    played = run_episodes(sampler, rows, group_size, params, episodes)
    return played.rollout, {
        "episode_reward": played.rewards.tolist(),
        "turns": played.turns.tolist(),
        "episode_fault": played.faults,
        "episode_end": played.endings,
    }


@torch.inference_mode()
def run_episodes(
    sampler: TorchSampler,
    rows: list[dict[str, Any]],
    group_size: int,
    params: SamplingParams,
    settings: EpisodeSettings,
) -> Episodes:
    """G episodes from each of `rows`, a row's G contiguous; `params.max_new_tokens` bounds each
    policy turn. The same seed gives the same episodes when the environment is deterministic."""
    envs = [settings.make_env() for _ in range(len(rows) * group_size)]
    first: list[list[int]] = []
    for r, row in enumerate(rows):
        messages = [
            call_reset(envs[r * group_size + g], row, settings.faults.timeout_s)
            for g in range(group_size)
        ]
        if len(set(messages)) != 1:
            raise UserError("rollout.env: reset() gave different first messages for one row")
        first.append(settings.encode_prompt(messages[0]))
    budget = settings.budget(params.max_new_tokens)
    ids, mask = sampler._pad_prompts(
        first, group_size, dataclasses.replace(params, max_new_tokens=budget)
    )
    n = len(envs)
    model = sampler.model
    was_training = model.training
    model.eval()
    try:
        decoder = sampler.make_decoder(model, n, ids.shape[1], budget - 1, params.max_new_tokens)
        logits = decoder.prefill(ids, mask, group_size)
        with decoder.decoding():
            loop = _EpisodeLoop(sampler, envs, params, settings, budget, ids.device)
            loop.run(decoder, logits)
    finally:
        model.train(was_training)
    width = int(loop.ends.max())
    rollout = sampler._rollout(
        ids,
        mask,
        group_size,
        loop.completion[:, :width],
        loop.logprobs[:, :width],
        loop.ends,
        loop.reasons,
        params,
    )
    tool = loop.tool[:, :width] * rollout.completion_mask
    transcripts = [
        sampler.tokenizer.decode(row[:end])
        for row, end in zip(rollout.completion_ids.tolist(), loop.ends.tolist(), strict=True)
    ]
    rollout = dataclasses.replace(
        rollout, texts=transcripts, tool_mask=tool, logprobs=rollout.logprobs * (1 - tool)
    )
    if loop.fault_notes:
        print(
            f"oncurve: warning: {len(loop.fault_notes)} of {n} episodes ended on their "
            f"environment's fault (reward.errors, rollout.env_timeout_s); the first: "
            f"{loop.fault_notes[0]}",
            file=sys.stderr,
        )
    return Episodes(
        rollout,
        torch.tensor(loop.rewards, dtype=torch.float32),
        torch.tensor(loop.turns, dtype=torch.long),
        loop.faults,
        loop.endings,
    )


class _EpisodeLoop:
    """`TorchSampler`'s decode loop with turns: a row whose turn ends is handed to its
    environment and then fed the observation's tokens instead of sampling, until the episode
    ends. Randomness is drawn for every live row at every step, fed or not, so a row's draws
    do not depend on the other rows' episodes."""

    def __init__(
        self,
        sampler: TorchSampler,
        envs: list[Environment],
        params: SamplingParams,
        settings: EpisodeSettings,
        budget: int,
        device: torch.device,
    ) -> None:
        n = len(envs)
        self.sampler, self.envs, self.params, self.settings = sampler, envs, params, settings
        self.budget, self.device = budget, device
        self.eos_id = sampler.tokenizer.eos_token_id  # the chat template's end of a turn
        self.completion = torch.full((n, budget), sampler.pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((n, budget), dtype=torch.float32, device=device)
        self.tool = torch.zeros((n, budget), dtype=torch.long, device=device)
        self.ends = torch.full((n,), budget, dtype=torch.long, device=device)
        self.reasons = torch.full((n,), FINISH_LENGTH, dtype=torch.long, device=device)
        self.rewards = [0.0] * n
        self.env_seconds = [0.0] * n  # each episode's time in `step` so far
        self.faults: list[str | None] = [None] * n
        # a row still playing when the budget runs out was cut mid-turn
        self.endings = [LENGTH] * n
        self.fault_notes: list[str] = []
        self.turns = [1] * n
        self.turn_start = [0] * n
        self.feeding: dict[int, list[int]] = {}  # output row -> observation tokens still to feed

    def run(self, decoder: Any, logits: torch.Tensor) -> None:
        params, sampler, device = self.params, self.sampler, self.device
        generator = seeded_generator(params.decode_seed, device)
        vocab = logits.shape[-1]
        is_eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        is_eos[[e for e in sampler.eos_ids if e < vocab]] = True
        eos_index = is_eos.nonzero().squeeze(1)
        stop_table = sampler._stop_table(params.stop, vocab, device) if params.stop else None
        n = len(self.envs)
        active = torch.arange(n, device=device)  # output row of each decoder row
        rows = list(range(n))  # the same, on the host
        alive = [True] * n  # per decoder row: the episode goes on
        for t in range(self.budget):
            short_turns = [t - self.turn_start[row] < params.min_new_tokens for row in rows]
            held = None if all(short_turns) else torch.tensor(short_turns, device=device)
            suppress = eos_index if any(short_turns) else None
            tokens, token_logprobs = sample_tokens(logits, params, generator, suppress, held)
            fed_at = [i for i, row in enumerate(rows) if row in self.feeding]
            fed = torch.zeros(len(rows), dtype=torch.bool, device=device)
            if fed_at:  # observation tokens replace the draws of the rows being fed
                index = torch.tensor(fed_at, device=device)
                feed = [self._next_fed(rows[i], t) for i in fed_at]
                tokens[index] = torch.tensor(feed, device=device)
                fed[index] = True
                token_logprobs = token_logprobs.masked_fill(fed, 0.0)
            self.completion[active, t] = tokens
            self.logprobs[active, t] = token_logprobs
            self.tool[active, t] = fed.long()
            # One read of the device per step: which rows drew EOS, and which a token that can
            # complete a stop string; the rest (turn lengths, who is fed or alive) is the host's.
            flags = [is_eos[tokens]]
            if stop_table is not None:
                flags.append(stop_table[tokens])
            eos, *could_stop = torch.stack(flags).tolist()
            feeding = set(fed_at)
            ended: list[tuple[int, int]] = []  # (decoder row, reason)
            for i, row in enumerate(rows):
                if not alive[i] or i in feeding:
                    continue
                if eos[i]:
                    ended.append((i, FINISH_EOS))
                elif could_stop and could_stop[0][i] and self._stopped(row, t):
                    ended.append((i, FINISH_STOP))
                elif t + 1 - self.turn_start[row] >= params.max_new_tokens:
                    ended.append((i, FINISH_LENGTH))
            if ended:
                over = self._end_turns([rows[i] for i, _ in ended], [r for _, r in ended], t)
                for (i, _), done in zip(ended, over, strict=True):
                    alive[i] = alive[i] and not done
            if not any(alive) or t == self.budget - 1:
                break
            if alive.count(False) >= COMPACT_FRACTION * len(alive):
                keep = [i for i, live in enumerate(alive) if live]
                index = torch.tensor(keep, device=device)
                decoder.keep(index)
                active, tokens = active[index], tokens[index]
                rows, alive = [rows[i] for i in keep], [True] * len(keep)
            logits = decoder.step(tokens)

    def _next_fed(self, row: int, t: int) -> int:
        queue = self.feeding[row]
        token = queue.pop(0)
        if not queue:
            del self.feeding[row]
            self.turn_start[row] = t + 1
        return token

    def _turn_ids(self, row: int, t: int) -> list[int]:
        return self.completion[row, self.turn_start[row] : t + 1].tolist()

    def _stopped(self, row: int, t: int) -> bool:
        window = 4 * max(len(s) for s in self.params.stop) + 2
        start = max(self.turn_start[row], t + 1 - window)
        tail = self.sampler.tokenizer.decode(
            self.completion[row, start : t + 1].tolist(), skip_special_tokens=True
        )
        return any(s in tail for s in self.params.stop)

    def _end_turns(self, rows: list[int], reasons: list[int], t: int) -> list[bool]:
        """Hand the turns that ended at step `t` to their environments; returns, per row,
        whether the episode is over. A turn cut at `max_new_tokens` is handed to none: its
        episode ends there with the rewards of its finished turns."""
        over: dict[int, bool] = {}
        finished = []  # (row, reason) of the turns handed to their environments
        for row, reason in zip(rows, reasons, strict=True):
            if reason == FINISH_LENGTH:
                self._end(row, t, reason, LENGTH)
                over[row] = True
            else:
                finished.append((row, reason))
        texts, ended_with_eos = [], []
        for row, reason in finished:
            ids = self._turn_ids(row, t)
            # the turn's end is in the feed unless the token sampled was the template's own (a
            # generation config's other EOS, `<|endoftext|>`, is no `<|im_end|>`)
            ended_with_eos.append(reason == FINISH_EOS and ids[-1:] == [self.eos_id])
            text = self.sampler.tokenizer.decode(ids, skip_special_tokens=True)
            if reason == FINISH_STOP:
                cuts = [text.find(s) + len(s) for s in self.params.stop if s in text]
                text = text[: min(cuts)] if cuts else text
            texts.append(text)
        faults = self.settings.faults
        left = [
            None if faults.timeout_s is None else faults.timeout_s - self.env_seconds[row]
            for row, _ in finished
        ]
        results = call_steps([self.envs[row] for row, _ in finished], texts, left)
        for (row, reason), result, ended in zip(finished, results, ended_with_eos, strict=True):
            self.env_seconds[row] += result.seconds
            self.rewards[row], result = add_reward(self.rewards[row], result)
            if result.fault is not None:
                self.rewards[row] = faults.score(result.fault, result.why)
                self.faults[row] = result.fault
                self.fault_notes.append(result.why)
            ending = result.fault
            if ending is None and (result.done or result.observation is None):
                ending = result.ending
            elif ending is None and self.turns[row] >= self.settings.max_turns:
                ending = MAX_TURNS
            over[row] = ending is not None
            if ending is not None:
                self._end(row, t, reason, ending)
                continue
            feed = self.settings.observation(result.observation, ended)
            if feed:
                self.feeding[row] = feed
            else:  # nothing to feed (an empty observation without a template)
                self.turn_start[row] = t + 1
            self.turns[row] += 1
        return [over[row] for row in rows]

    def _end(self, row: int, t: int, reason: int, ending: str) -> None:
        """Ends `row`'s episode after step `t`, its last turn ended by `reason`."""
        self.ends[row] = t + 1
        self.reasons[row] = reason
        self.endings[row] = ending
