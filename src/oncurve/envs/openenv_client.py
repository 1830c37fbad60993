"""OpenEnv's environments, served over HTTP, as oncurve environments: `rollout.env:
openenv:<base_url>` (e.g. `openenv:http://127.0.0.1:8000`).

Each episode is one session of the server's: a WebSocket of its own to `<base_url>/ws`, which
the server gives an environment instance of its own, opened at `reset` and closed when the
episode ends. The messages are OpenEnv's (its `GenericEnvClient`): `reset` sends the row's seed
(`episode_seed`; a server whose `reset` takes no seed leaves it out), `step` sends the action
`{action_field: turn}`, and each answer is `{"observation": {...}, "reward": number or null,
"done": flag}`. The observation's text is its `text_field`, else the newest of its `messages`'
`content` (OpenEnv's TextArena environment's shape); the reward is the step's (null: 0; a
reward that is not a number, `true` included, or a `done` that is not true or false is the
step's fault). An observation that starts with the previous one and adds to it (a server that
answers with the whole game so far, as OpenEnv's TextArena environment does) is sent from where
the previous one ended, its leading newlines dropped: the chat holds the rest already.

All of a process's sessions run on one event loop, on a daemon thread of its own, so that the
episodes of a step overlap their waits on the server without a thread per session.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import threading
import weakref
from collections.abc import Coroutine
from typing import Any

from oncurve.background_loop import BackgroundLoop
from oncurve.envs.libraries import episode_seed
from oncurve.errors import UserError

URL_SCHEMES = ("http://", "https://", "ws://", "wss://")


class _SessionLoop:
    """The event loop the sessions run on, and the closes it has not finished yet."""

    def __init__(self) -> None:
        self.background = BackgroundLoop("oncurve-openenv")
        self.lock = threading.Lock()
        self.closing: set[concurrent.futures.Future] = set()

    def submit(self, coroutine: Coroutine) -> concurrent.futures.Future:
        return self.background.submit(coroutine, on_new_loop=self._forget_closing)

    def _forget_closing(self) -> None:
        """A new loop (a forked child's): no session of the old one is closing on it."""
        with self.lock:
            self.closing.clear()

    def close_soon(self, client: Any) -> None:
        """Closes `client`'s session without waiting for the server."""
        future = self.submit(client.close())
        with self.lock:
            self.closing.add(future)
        future.add_done_callback(self._closed)

    def wait_for_closes(self, timeout_s: float) -> None:
        """Waits (at most `timeout_s`) for the sessions being closed, so that a server sized
        for one step's episodes has their places free for the next step's."""
        with self.lock:
            closing = list(self.closing)
        concurrent.futures.wait(closing, timeout=timeout_s)

    def _closed(self, future: concurrent.futures.Future) -> None:
        with self.lock:
            self.closing.discard(future)


_SESSIONS = _SessionLoop()


class OpenEnvSession:
    """One episode played against an OpenEnv server; see the module docstring.

    Args:
        base_url: the server's address, http(s):// or ws(s)://.
        text_field: the observation's field that holds its text (None: the newest of its
            `messages`' `content`).
        action_field: the action's field that holds the policy's turn.
        connect_timeout_s: how long opening the session may take.
        message_timeout_s: how long the server may take to answer a reset or a step.
    """

    observation_role = "user"

    def __init__(
        self,
        base_url: str,
        text_field: str | None = None,
        action_field: str = "message",
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        try:
            client_module = importlib.import_module("openenv.core.generic_client")
        except ImportError:
            raise UserError(
                f"rollout.env openenv:{base_url}: needs openenv-core: "
                "pip install 'oncurve[openenv]'"
            ) from None
        if not base_url.startswith(URL_SCHEMES):
            raise UserError(
                f"rollout.env openenv:{base_url}: the server's URL must start with "
                f"{', '.join(URL_SCHEMES)}"
            )
        self.base_url, self.text_field, self.action_field = base_url, text_field, action_field
        self.connect_timeout_s = connect_timeout_s
        # a call is given up when the client's own timeouts failed to end it
        self.message_timeout_s = message_timeout_s
        self.call_timeout_s = connect_timeout_s + message_timeout_s + 5.0
        self.client = client_module.GenericEnvClient(
            base_url=base_url,
            connect_timeout_s=connect_timeout_s,
            message_timeout_s=message_timeout_s,
        )
        self.closer: weakref.finalize | None = None  # set when the session opens
        self.previous = ""  # the last observation's whole text

    def reset(self, row: dict[str, Any]) -> str:
        _SESSIONS.wait_for_closes(self.connect_timeout_s)
        # an episode that ends without `done` (out of turns) closes when it is dropped
        self.closer = weakref.finalize(self, _SESSIONS.close_soon, self.client)
        self.closer.atexit = False  # at exit the sockets close with the process
        try:
            result = self._call(self.client.reset(seed=episode_seed(row)), "reset")
            self.previous = self._text(result.observation, "reset")
            return self.previous
        except RuntimeError as error:
            why = str(error)
        self.close()
        raise UserError(f"rollout.env {why}")

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        result = self._call(self.client.step({self.action_field: turn}), "step")
        reward = result.reward
        if reward is None:
            reward = 0.0
        elif isinstance(reward, bool) or not isinstance(reward, int | float):  # JSON's true
            raise RuntimeError(
                f"openenv:{self.base_url}: the step's reward is {reward!r}, not a number"
            )
        # a flag, not anything truthy: "false" would end the episode
        if not isinstance(result.done, bool):
            raise RuntimeError(
                f"openenv:{self.base_url}: the step's done is {result.done!r}, not true or false"
            )
        if result.done:
            self.close()
            return None, float(reward), True
        return self._news(self._text(result.observation, "step")), float(reward), False

    def close(self) -> None:
        """Ends the session (the server closes its environment); without waiting for it."""
        if self.closer is not None:
            self.closer()

    def _call(self, coroutine: Coroutine, what: str) -> Any:
        """The result of a reset or a step sent to the server; RuntimeError naming the URL when
        it cannot be reached, answers with an error or does not answer."""
        future = _SESSIONS.submit(coroutine)
        try:
            return future.result(timeout=self.call_timeout_s)
        except concurrent.futures.TimeoutError:
            # one the client raised (its message timeout) is the future's own result
            if future.done():
                why = (
                    f"no answer in {self.message_timeout_s:g} s "
                    "(rollout.env_args.message_timeout_s)"
                )
            else:
                future.cancel()
                why = f"no answer in {self.call_timeout_s:g} s"
        except Exception as error:  # the client's ConnectionError, RuntimeError, OSError, ...
            why = f"{type(error).__name__}: {error}"
            if what == "reset" and type(error).__name__.startswith("ConnectionClosed"):
                # a server at capacity sends its refusal and closes at once: the client, still
                # sending the reset, never reads it
                why += " (the server closed the session: are its max_concurrent_envs all taken?)"
        finally:
            # the future's exception holds this frame: a cycle that would keep the session
            # (this frame's `self`) open until the next garbage collection
            del future
        if what == "step":
            what = f"step (the action's field {self.action_field!r})"
        raise RuntimeError(" ".join(f"openenv:{self.base_url}: {what} failed: {why}".split()))

    def _news(self, text: str) -> str:
        """`text` from where the previous observation ended, when it starts with it and adds to
        it; whole otherwise (a repeated message is news too)."""
        previous, self.previous = self.previous, text
        if previous and len(text) > len(previous) and text.startswith(previous):
            return text[len(previous) :].lstrip("\n")
        return text

    def _text(self, observation: Any, what: str) -> str:
        """The observation's text (its `text_field`, else its newest message's `content`)."""
        if not isinstance(observation, dict):
            raise RuntimeError(
                f"openenv:{self.base_url}: the {what}'s observation is "
                f"{type(observation).__name__}, not an object"
            )
        if self.text_field is not None:
            text = observation.get(self.text_field)
            if isinstance(text, str):
                return text
            raise RuntimeError(
                f"openenv:{self.base_url}: the {what}'s observation has no text in its field "
                f"{self.text_field!r} (rollout.env_args.text_field; its fields: "
                f"{', '.join(observation) or 'none'})"
            )
        messages = observation.get("messages")
        if messages and isinstance(messages, list) and isinstance(messages[-1], dict):
            text = messages[-1].get("content")
            if isinstance(text, str):
                return text
        raise RuntimeError(
            f"openenv:{self.base_url}: the {what}'s observation has no `messages` with a "
            f"`content`: name the field that holds its text in rollout.env_args.text_field "
            f"(its fields: {', '.join(observation) or 'none'})"
        )
