"""OpenEnv servers as oncurve environments: a guess-the-number game served in-process by
openenv-core's own server factory plays through `OpenEnvSession` (its messages as
observations, its rewards, its end), a row's seed reaches the server, episodes played at once
keep to their own sessions and close them when they end, a missing extra, an unreachable
server or a server's error is one line naming it, and `oncurve train` trains on it."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from helpers.configs import make_config
from helpers.runs import metric_rows
from pydantic import Field

from oncurve.envs import OpenEnvSession
from oncurve.errors import UserError
from oncurve.loop.trainer import train
from oncurve.rollout.env_calls import ERROR, EnvFaults, call_steps
from oncurve.rollout.episodes import observation_role, resolve_environment

# looked up, not imported: `_server_parts` imports openenv.core without its web UI
if importlib.util.find_spec("openenv") is None:
    pytest.skip("the openenv extra is not installed", allow_module_level=True)
uvicorn = pytest.importorskip("uvicorn", reason="openenv-core's server needs uvicorn")


def _server_parts():
    """openenv-core's server classes. Importing them imports its web UI (gradio) when it is
    installed, seconds of CPU that this game does not need: openenv-core goes without it when
    it is missing, so it is hidden while openenv-core is imported (unless something imported
    it already)."""
    hidden = [name for name in ("gradio",) if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))
    try:
        from openenv.core.env_server.http_server import create_fastapi_app
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, Observation, State
    finally:
        for name in hidden:
            del sys.modules[name]
    return create_fastapi_app, Environment, Action, Observation, State


create_fastapi_app, Environment, Action, Observation, State = _server_parts()


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    messages: list[dict[str, str]] = Field(default_factory=list)
    hint: str = ""
    transcript: str = ""


class GuessTheNumber(Environment):
    """Guess a number from 1 to 20 (`1 + seed % 20`) as `[n]`: each wrong guess is told
    "higher" or "lower", the right one ends the game with a reward of 1; `transcript` is the
    whole game so far, as TextArena's observation wrapper writes it. `SEEDS` records the seeds of
    the resets, `OPEN` the games whose session is open; "boom" raises, "slow" takes 2 s."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    SEEDS: list[int | None] = []
    OPEN: set[int] = set()

    def __init__(self) -> None:
        super().__init__()
        self.target, self.steps, self.messages, self.transcript = 0, 0, [], ""

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.SEEDS.append(seed)
        self.OPEN.add(id(self))
        self.target = 1 + (seed or 0) % 20
        self.messages = [{"role": "game", "content": "Guess my number (1 to 20) as [n]."}]
        self.transcript = "\n[GAME] Guess my number (1 to 20) as [n]."
        return GuessObservation(messages=self.messages, hint="start", transcript=self.transcript)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        if action.message == "boom":
            raise ValueError("the game broke")
        if action.message == "slow":
            time.sleep(2)
        self.steps += 1
        found = re.search(r"\[(\d+)\]", action.message)
        guess = int(found.group(1)) if found else None
        if guess == self.target:
            return GuessObservation(messages=self.messages, done=True, reward=1.0)
        news = "Write [n]." if guess is None else "higher" if guess < self.target else "lower"
        self.messages = [*self.messages, {"role": "game", "content": news}]
        self.transcript += f"\n[Player 0] {action.message}\n[GAME] {news}"
        return GuessObservation(
            messages=self.messages, hint=f"not {guess}", transcript=self.transcript, reward=0.0
        )

    @property
    def state(self) -> State:
        return State(step_count=self.steps)

    def close(self) -> None:
        self.OPEN.discard(id(self))


def bound_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1, not listening."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The game's server (4 sessions at once), on a free port of 127.0.0.1."""
    app = create_fastapi_app(GuessTheNumber, GuessAction, GuessObservation, max_concurrent_envs=4)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    sock = bound_socket()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the test server did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)


def all_closed() -> bool:
    """Whether the server closed every game's session (waiting up to 5 s for it)."""
    deadline = time.monotonic() + 5
    while GuessTheNumber.OPEN and time.monotonic() < deadline:
        time.sleep(0.01)
    return not GuessTheNumber.OPEN


def test_an_episode_is_the_game_s_messages_rewards_and_end(url):
    env = resolve_environment(f"openenv:{url}")()
    assert (
        isinstance(env, OpenEnvSession)
        and observation_role(resolve_environment(f"openenv:{url}")) == "user"
    )
    assert env.reset({"prompt": "any", "seed": 6}) == "Guess my number (1 to 20) as [n]."
    assert GuessTheNumber.SEEDS[-1] == 6 and len(GuessTheNumber.OPEN) == 1
    assert env.step("I say [10]") == ("lower", 0.0, False)
    assert env.step("then [3]") == ("higher", 0.0, False)
    assert env.step("[7]") == (None, 1.0, True)
    assert all_closed()
    # without a seed column, the seed is the prompt's (so a row's G episodes play one game)
    other = OpenEnvSession(url, text_field="hint")
    assert other.reset({"prompt": "3+3="}) == "start"
    assert GuessTheNumber.SEEDS[-1] == zlib.crc32(b"3+3=")
    assert other.step("no number") == ("not None", 0.0, False)
    assert other.step("no number") == ("not None", 0.0, False)  # a repeat is sent whole
    del other  # an episode that ends without the game's end closes its session when dropped
    assert all_closed()


def test_an_observation_that_repeats_the_last_one_sends_only_what_is_new(url):
    """A server that answers with the whole game so far (OpenEnv's TextArena environment) has
    each observation sent from where the previous one ended: the newest feedback, not a history
    that grows until the observation's token budget cuts it."""
    env = OpenEnvSession(url, text_field="transcript")
    assert env.reset({"seed": 6}) == "\n[GAME] Guess my number (1 to 20) as [n]."
    assert env.step("I say [10]") == ("[Player 0] I say [10]\n[GAME] lower", 0.0, False)
    assert env.step("[3]") == ("[Player 0] [3]\n[GAME] higher", 0.0, False)
    assert env.step("[7]") == (None, 1.0, True)
    again = OpenEnvSession(url, text_field="transcript")  # a new episode starts from nothing
    assert again.reset({"seed": 6}) == "\n[GAME] Guess my number (1 to 20) as [n]."
    assert again.step("[7]") == (None, 1.0, True)
    assert all_closed()


def test_episodes_played_at_once_keep_their_own_games(url):
    low, high = OpenEnvSession(url), OpenEnvSession(url)
    low.reset({"seed": 2})  # the number 3
    high.reset({"seed": 16})  # the number 17
    results = call_steps([low, high], ["[10]", "[10]"], [None, None])
    assert [(r.observation, r.reward, r.done) for r in results] == [
        ("lower", 0.0, False),
        ("higher", 0.0, False),
    ]
    results = call_steps([low, high], ["[3]", "[3]"], [None, None])
    assert [(r.observation, r.reward, r.done) for r in results] == [
        (None, 1.0, True),
        ("higher", 0.0, False),
    ]
    assert high.step("[17]") == (None, 1.0, True)
    assert all_closed()
    loops = [t for t in threading.enumerate() if t.name == "oncurve-openenv"]
    assert len(loops) == 1  # one event loop for all sessions, not a thread each


def test_a_missing_extra_a_bad_url_or_a_server_error_is_one_line(url, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "openenv.core.generic_client", None)  # as if not installed
        with pytest.raises(
            UserError, match=r"needs openenv-core: pip install 'oncurve\[openenv\]'$"
        ):
            resolve_environment(f"openenv:{url}")
    with pytest.raises(UserError, match="the server's URL must start with http://"):
        resolve_environment("openenv:127.0.0.1:8000")
    nobody = bound_socket()  # nothing answers there
    address = f"http://127.0.0.1:{nobody.getsockname()[1]}"
    with pytest.raises(UserError) as raised:
        OpenEnvSession(address, connect_timeout_s=2).reset({"seed": 0})
    message = str(raised.value)
    assert message.startswith(f"rollout.env openenv:{address}: reset failed: ConnectionError")
    assert "\n" not in message
    nobody.close()
    with pytest.raises(
        UserError,
        match=r"has no text in its field 'text' \(.*its fields: messages, hint, transcript\)$",
    ):
        OpenEnvSession(url, text_field="text").reset({"seed": 0})
    env = OpenEnvSession(url)
    env.reset({"seed": 0})
    (result,) = call_steps([env], ["boom"], [None])
    assert (
        result.fault == ERROR
        and f"openenv:{url}: step (the action's field 'message')" in result.why
    )
    assert "Server error: the game broke" in result.why
    with pytest.raises(UserError, match=r"^rollout.env: step raised RuntimeError: openenv:http"):
        EnvFaults().score(result.fault, result.why)  # reward.errors=raise, the default
    full = [OpenEnvSession(url) for _ in range(3)]  # and `env`'s: the server's 4
    for session in full:
        session.reset({"seed": 0})
    refused = r"reset failed: .*(Server at capacity: 4/4|are its max_concurrent_envs all taken)"
    with pytest.raises(UserError, match=refused):
        OpenEnvSession(url).reset({"seed": 0})
    for session in [env, *full]:
        session.close()
    assert all_closed()


def test_a_server_slower_than_the_message_timeout_is_named_by_that_timeout(url):
    env = OpenEnvSession(url, message_timeout_s=0.5)
    env.reset({"seed": 0})
    (result,) = call_steps([env], ["slow"], [None])
    assert result.fault == ERROR
    assert "no answer in 0.5 s (rollout.env_args.message_timeout_s)" in result.why
    env.close()
    assert all_closed()  # the server's sessions are free again for the tests after


def test_a_run_trains_on_an_openenv_server(url, chat_model_dir, data_file, tmp_path):
    seen = len(GuessTheNumber.SEEDS)
    config = make_config(
        chat_model_dir, data_file, tmp_path / "run", f"rollout.env=openenv:{url}",
        "rollout.max_turns=2", "rollout.max_observation_tokens=16", "data.chat_template=true",
        "reward.functions=[env]", "run.steps=1", "eval.at_start_end=false",
        "data.prompts_per_step=2", "rollout.group_size=2", "run.preflight=false", "run.threads=1",
    )  # fmt: skip
    train(config, quiet=True)
    (row,) = metric_rows(tmp_path / "run")
    assert 1.0 <= row["episode/turns_mean"] <= 2.0 and row["episode/errors"] == 0.0
    assert 0.0 <= row["reward/env"] <= 1.0
    seeds = GuessTheNumber.SEEDS[seen:]
    assert len(seeds) == 4 and len(set(seeds)) == 2  # a row's 2 episodes play one game
    assert all_closed()


@pytest.mark.parametrize(
    ("reward", "done", "why"),
    [
        (True, False, "the step's reward is True, not a number"),
        ("1", True, "the step's reward is '1', not a number"),
        (0.5, "false", "the step's done is 'false', not true or false"),
        (0.5, 1, "the step's done is 1, not true or false"),
    ],
)
def test_a_step_answer_whose_reward_or_done_is_not_its_type_is_refused(reward, done, why):
    """A server's `true` is not a reward of 1, nor its `"false"` (truthy) an end that pays."""

    class Answering:
        async def step(self, action):
            observation = {"messages": [{"content": "go on"}]}
            return type("Answer", (), {"observation": observation, "reward": reward, "done": done})

    env = OpenEnvSession("http://127.0.0.1:9")
    env.client = Answering()
    with pytest.raises(RuntimeError) as refused:
        env.step("[1]")
    assert str(refused.value) == f"openenv:http://127.0.0.1:9: {why}"
