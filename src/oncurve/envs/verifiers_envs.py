"""`verifiers` environments (Prime Intellect's environment hub) trained as they are.

`rollout.env: verifiers:NAME` loads environment NAME as `verifiers.load_environment` does (its
installed package, or a module NAME on the path with a `load_environment`), with
`rollout.env_args` as that function's arguments. The environment's dataset is the run's prompts
(its eval dataset, when it has one, the held-out ones), each row kept whole for its rollout
(`INPUT`); its rollouts (single- or multi-turn, tools included: the endpoint shows the model
its tools and reads its calls in its template's format, `oncurve.rollout.tool_calls`) play against
oncurve's OpenAI-compatible endpoint, a row's G episodes at once, each with a client of its own
(`oncurve.rollout.harness`, which records every turn token for token); its rubric scores the G
together (group-wise reward functions see the group), the total trains and every part is logged
as `env/<name>`. An episode that verifiers ended on the environment's error (a tool that
failed, its infrastructure) gets the reward error policy; one it ended on the policy's (an empty
or malformed answer) keeps the rubric's score. A turn cut at the token limit ends its rollout
before the environment answers it, as it ends an in-process episode, and each episode's
`episode_end` is what verifiers says ended it: `length` (truncated), `max_turns` or `done`.

The classic verifiers API (`verifiers.Environment`; in verifiers 0.3, `verifiers.legacy`,
answering at the package's top level) is what is called: `load_environment`, `get_dataset`,
`rollout` and the rubric's `score_group`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import sys
from collections.abc import Mapping
from typing import Any

from oncurve.errors import UserError, error_line, first_line
from oncurve.rollout.env_calls import DONE, LENGTH, MAX_TURNS

PREFIX = "verifiers:"
# The column that keeps a row as the environment gave it: what its rollout starts from.
INPUT = "verifiers_input"

_loaded: dict[str, Any] = {}


def _verifiers(spec: str) -> Any:
    try:
        import verifiers
    except ImportError:
        raise UserError(
            f"rollout.env {spec}: needs verifiers: pip install 'oncurve[verifiers]'"
        ) from None
    return verifiers


def load_environment(spec: str, env_args: dict[str, Any]) -> Any:
    """The environment `verifiers:NAME` names, loaded with `env_args` once per process (the
    prompts and the rollouts share it); a one-line error when it cannot be loaded."""
    key = json.dumps([spec, env_args], sort_keys=True, default=str)
    if key not in _loaded:
        vf = _verifiers(spec)
        try:
            _loaded[key] = vf.load_environment(spec.removeprefix(PREFIX), **env_args)
        # the environment's own code fails in any way; it is the user's to fix, not a crash
        except Exception as error:
            raise UserError(_load_failure(spec, env_args, error)) from None
    return _loaded[key]


def _load_failure(spec: str, env_args: dict[str, Any], error: Exception) -> str:
    """The one line that says why `verifiers:NAME` did not load: `rollout.env_args` that its
    `load_environment` does not take, or what the loading raised."""
    # verifiers wraps what the environment's `load_environment` raised in a RuntimeError
    cause = error.__cause__ if isinstance(error, RuntimeError) and error.__cause__ else error
    if isinstance(cause, TypeError) and not _binds(spec, env_args):
        return f"rollout.env_args do not fit rollout.env {spec}: {first_line(cause)}"
    if cause is error:  # verifiers' own message (an environment it cannot import, say)
        return f"rollout.env {spec}: {first_line(error)}"
    return f"rollout.env {spec}: its load_environment raised {error_line(cause)}"


def _binds(spec: str, env_args: dict[str, Any]) -> bool:
    """Whether the loaded module's `load_environment` takes `env_args` (True when there is no
    such function to ask, as when its module did not import)."""
    # the module verifiers imports for NAME (`org/my-env` -> `my_env`)
    name = spec.removeprefix(PREFIX).replace("-", "_").split("/")[-1]
    loader = getattr(sys.modules.get(name), "load_environment", None)
    if not callable(loader):
        return True
    try:
        signature = inspect.signature(loader)
    except (TypeError, ValueError):  # no signature to read
        return True
    try:
        signature.bind(**env_args)
    except TypeError:
        return False
    return True


def environment_rows(spec: str, env_args: dict[str, Any], split: str) -> list[dict[str, Any]]:
    """The environment's rows of `split` ("train": its dataset; "eval": its eval dataset, none
    when it has none) as prompt rows: the prompt's messages (`prompt_messages`, rendered with the
    chat template), a tool environment's tools as the endpoint is sent them (`prompt_tools`, in
    OpenAI's form: the chat template shows them, so the prompt's tokens count them), its last
    user message as `prompt`, the `answer`, and the row as given."""
    env = load_environment(spec, env_args)
    if split == "train":
        dataset = env.get_dataset()
    else:
        env.build_eval_dataset()
        dataset = [] if env.eval_dataset is None else env.get_eval_dataset()
    tools = [_openai_tool(tool) for tool in getattr(env, "tool_defs", None) or []]
    rows = []
    for index, record in enumerate(dataset):
        where = f"rollout.env {spec} {split} row {index}"
        prompt = record.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise UserError(f"{where}: its prompt is not a list of messages (a chat environment)")
        messages = [_message(m, where) for m in prompt]
        user = [m["content"] for m in messages if m["role"] == "user"]
        rows.append({
            "prompt": user[-1] if user else messages[-1]["content"],
            "prompt_messages": messages,
            **({"prompt_tools": tools} if tools else {}),
            "answer": record.get("answer"),
            INPUT: dict(record),
        })  # fmt: skip
    return rows


def _openai_tool(tool: Any) -> dict[str, Any]:
    """A verifiers `Tool` as its OpenAI client sends it (`{"type": "function", "function":
    {...}}`)."""
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if getattr(tool, "strict", None) is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _message(message: Any, where: str) -> dict[str, str]:
    """A prompt message as {"role", "content"}; a one-line error naming the row when it is not
    a mapping with a role and text content."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise UserError(f"{where}: a message of its prompt has no role")
    return {"role": message["role"], "content": _text(message.get("content"), where)}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise UserError(f"{where}: a message's content is not text")


class GroupPlay:
    """A row's G rollouts of the environment, each with its own client (an `openai.AsyncOpenAI`
    on the endpoint) and at most `max_turns` policy turns (`rollout.max_turns`), scored together
    by its rubric: per episode a mapping of the reward, the rubric's parts and what ended it,
    or the error verifiers recorded."""

    def __init__(self, env: Any, max_turns: int) -> None:
        self.env, self.max_turns = env, max_turns

    async def __call__(self, clients: list[Any], model: str, row: dict[str, Any]) -> list[Any]:
        vf = _verifiers(PREFIX)
        episodes = [_episode_client(vf)(client, self.max_turns) for client in clients]
        states = list(
            await asyncio.gather(
                *(self.env.rollout(row[INPUT], episode, model, {}) for episode in episodes)
            )
        )
        await self.env.rubric.score_group(states)
        # The policy's own faults (an empty or malformed answer, a tool call that does not
        # parse) are the rubric's to score: training should learn them away. A bare ModelError
        # is verifiers' wrapping of any failed call (the endpoint down, refused, timed out): no
        # answer the policy gave.
        policy_faults = (vf.errors.InvalidModelResponseError, vf.errors.ToolParseError)
        single_turn = getattr(self.env, "max_turns", 0) == 1
        return [
            _outcome(state, policy_faults, _ending(state, single_turn, episode.at_turn_limit))
            for state, episode in zip(states, episodes, strict=True)
        ]


def _outcome(state: dict[str, Any], policy_faults: tuple[type, ...], ending: str) -> Any:
    """One episode's outcome for the harness: a mapping of its reward, the rubric's parts and
    what ended it (`episode_end`: `ending`), or the exception that says why it has none."""
    error = state.get("error")
    if error and not isinstance(error, policy_faults):
        cause = f" ({type(error.__cause__).__name__}: {error.__cause__})" if error.__cause__ else ""
        return RuntimeError(f"verifiers: {str(error) or type(error).__name__}{cause}")
    if state.get("timed_out"):  # the environment's own rollout time limit
        return TimeoutError("verifiers: the rollout ran past the environment's timeout")
    return {"reward": state["reward"], **(state.get("metrics") or {}), "episode_end": ending}


def _ending(state: dict[str, Any], single_turn: bool, at_turn_limit: bool) -> str:
    """What ended a rollout, in `oncurve.rollout.env_calls.ENDINGS`: `max_turns` when
    `rollout.max_turns` stopped it (`at_turn_limit`) or verifiers' turn limit did (but for a
    single-turn environment, whose one turn is its whole episode), `length` when verifiers
    marked it truncated (a turn cut at the token limit, a prompt past the context), else `done`
    (the environment's own stop conditions)."""
    if at_turn_limit:
        return MAX_TURNS
    if state.get("is_truncated"):
        return LENGTH
    if state.get("stop_condition") == "max_turns_reached" and not single_turn:
        return MAX_TURNS
    return DONE


@functools.cache
def _episode_client(vf: Any) -> type:
    """verifiers' OpenAI client class, made to end a rollout as an in-process episode ends: at a
    turn cut at the token limit, before its environment answers it (the client marks the state
    `prompt_too_long`, verifiers' stop for a rollout with no room left, which it checks before
    the next turn; the cut turn stays in the transcript the rubric scores), and after
    `max_turns` turns, once the environment has answered the last (the next call is refused as
    verifiers' `OverlongPromptError`, which ends the rollout truncated; `at_turn_limit` says so).
    """

    class EpisodeClient(vf.OpenAIChatCompletionsClient):
        def __init__(self, client: Any, max_turns: int) -> None:
            super().__init__(client)
            self.turns_left, self.at_turn_limit = max_turns, False

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            if self.turns_left == 0:
                self.at_turn_limit = True
                raise vf.OverlongPromptError("the episode played rollout.max_turns turns")
            self.turns_left -= 1
            response = await super().get_response(*args, **kwargs)
            state = kwargs.get("state")
            if response.message.is_truncated and state is not None:
                state["prompt_too_long"] = True
            return response

    return EpisodeClient
