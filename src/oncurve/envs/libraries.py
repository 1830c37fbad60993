"""Text games of the ecosystem's environment libraries as oncurve environments, in-process:
`rollout.env: textarena:<id>` (TextArena's single-player games) and `rollout.env: gem:<id>`
(GEM's environments, `gem.make(id)`).

Each dataset row is one game: the G episodes of a row play it with the same seed (the row's
`seed` column, else a number taken from its prompt's text), so that the group's advantage
compares the policy's play, not the games' luck. The game's messages are the user's turns (the
chat keeps the history, so each observation is only what is new since the policy's last
turn), the policy's turns are the game's actions as written, and the game's rewards are the
episode's: GEM's at every step, TextArena's when the game ends. An episode that ends says what
ended it (`episode_end`): `max_turns` when the game's own turn limit did (TextArena's
`check_turn_limit` answered that it is reached; GEM's step returned `truncated`, but on the
first turn, which single-turn environments mark truncated too), else `done`.
"""

from __future__ import annotations

import contextlib
import importlib
import numbers
import random
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from oncurve.errors import UserError
from oncurve.rollout.env_calls import DONE, MAX_TURNS

# Python's and NumPy's process-wide generators, which the games draw from (a new 2048 tile, a
# dealt card): one episode's call holds them at a time, so that no other draws in between.
_PROCESS_GENERATORS = threading.Lock()
# Held only while the generators' states are swapped, so that a call that ends and the abandon
# of that call do not both swap them back.
_SWAPS = threading.Lock()


def episode_seed(row: dict[str, Any]) -> int:
    """The seed of the game a dataset row stands for: its `seed` column (where not null), else
    the CRC-32 of its prompt's text (train and test prompts differ, so do their games)."""
    if row.get("seed") is not None:
        return int(row["seed"])
    return zlib.crc32(str(row.get("prompt", "")).encode())


class OwnRandomness:
    """An episode's own state of the process-wide generators, swapped in for each of its calls
    (`with randomness(seed):` at reset seeds it, `with randomness():` continues it), so that
    a row's G episodes play the same game whatever order their steps run in, and the caller's
    generators are as they were after each call.

    `abandon()` lets the other episodes' calls go on while a call of this one is left running
    past its episode's time: the caller's generators are put back, and the call, if it ever
    returns, leaves them alone (until then what it draws is taken from whichever call holds
    them: a game that hangs costs the others their reproducibility, not their time). The
    episode's calls after that do not run."""

    def __init__(self) -> None:
        self.state: tuple[Any, Any] | None = None
        self.abandoned = False
        # while a call of this episode holds the generators: a token of that call's own, and
        # the caller's states it puts back
        self._holding: tuple[object, tuple[Any, Any]] | None = None

    @contextlib.contextmanager
    def __call__(self, seed: int | None = None) -> Iterator[None]:
        import numpy as np

        _PROCESS_GENERATORS.acquire()
        call = object()
        with _SWAPS:
            if self.abandoned:
                _PROCESS_GENERATORS.release()
                raise RuntimeError("the episode was abandoned: its game does not play on")
            self._holding = call, (random.getstate(), np.random.get_state())
            if seed is not None:
                random.seed(seed)
                np.random.seed(seed % 2**32)
            elif self.state is not None:
                random.setstate(self.state[0])
                np.random.set_state(self.state[1])
        try:
            yield
        finally:
            with _SWAPS:
                if self._holding is not None and self._holding[0] is call:
                    self.state = random.getstate(), np.random.get_state()
                    self._hand_back(self._holding[1])

    def abandon(self) -> None:
        """The episode is over with a call of it left running: the generators are the caller's
        again and free for the other episodes' calls."""
        with _SWAPS:
            self.abandoned = True
            if self._holding is not None:
                self._hand_back(self._holding[1])

    def _hand_back(self, outer: tuple[Any, Any]) -> None:
        """Puts the caller's generators (`outer`) back and lets the next call have them (under
        _SWAPS, while a call of this episode holds them)."""
        import numpy as np

        random.setstate(outer[0])
        np.random.set_state(outer[1])
        self._holding = None
        _PROCESS_GENERATORS.release()


def _library(module: str, extra: str, spec: str) -> Any:
    """`module` imported, or a one-line error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"rollout.env {spec}: needs {module}: pip install 'oncurve[{extra}]'"
        ) from None


class TextArenaGame:
    """A single-player TextArena game (`textarena.make(game)` without its wrappers, so that the
    policy's turn is the action as written and each observation is the game's new messages).
    The reward is the game's at its end (1 for a win; part of it, in many games, for a loss),
    and `episode_end` what ended it: `max_turns` when the game's check of its turn limit
    (`State.check_turn_limit`) answered that it is reached, else `done` (a win, a loss by the
    game's rules, invalid moves past the game's allowance; a game that checks its limit on its
    own, as Sokoban does, ends as `done` too)."""

    observation_role = "user"
    episode_end: str | None = None

    def __init__(self, game: str, **make_args: Any) -> None:
        textarena = _library("textarena", "textarena", f"textarena:{game}")
        try:
            env = textarena.make(env_id=game, **make_args)
        except ValueError as err:  # the registry's "not found"
            raise UserError(f"rollout.env textarena:{game}: {err}") from None
        while isinstance(getattr(env, "env", None), textarena.Env):  # its default wrappers
            env = env.env
        self.env, self.game, self.player = env, game, 0
        self.textarena = textarena
        self.randomness = OwnRandomness()

    def reset(self, row: dict[str, Any]) -> str:
        seed = episode_seed(row)
        try:
            with self.randomness(seed):
                self.env.reset(num_players=1, seed=seed)
        except AssertionError as err:  # TextArena's check of the number of players
            raise UserError(f"rollout.env textarena:{self.game}: {err} (one player only)") from None
        # several games ignore `num_players` (a game for two) or take one player and never end
        # (a game for several): TextArena's single-player games all keep this state
        if not isinstance(self.env.state, self.textarena.SinglePlayerState):
            raise UserError(
                f"rollout.env textarena:{self.game}: not a single-player game (one player only)"
            )
        self.turn_limit_reached = False
        self._watch_turn_limit(self.env.state)
        return self._news()

    def _watch_turn_limit(self, state: Any) -> None:
        """Makes `state.check_turn_limit` (each game's own check, which ends the game when it
        answers True) record in `turn_limit_reached` that it answered True."""
        check = state.check_turn_limit

        def check_turn_limit() -> bool:
            reached = check()
            self.turn_limit_reached = self.turn_limit_reached or bool(reached)
            return reached

        state.check_turn_limit = check_turn_limit

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        with self.randomness():
            done, _ = self.env.step(action=turn)
            if done:
                self.episode_end = MAX_TURNS if self.turn_limit_reached else DONE
                rewards, _ = self.env.close()
                # None: a game that ended without an outcome
                reward = None if rewards is None else rewards.get(self.player)
                where = f"textarena:{self.game}: the game ended with the reward"
                return None, _number(reward, where), True
        return self._news(), 0.0, False

    def abandon(self) -> None:
        """A call of the episode was left running past its time: see `OwnRandomness.abandon`."""
        self.randomness.abandon()

    def _news(self) -> str:
        """The game's messages since the policy's last turn, its own action left out (whoever
        a game logs it as sent by: several log it as the game's)."""
        self.player, messages = self.env.get_observation()
        action = self.textarena.ObservationType.PLAYER_ACTION
        return "\n".join(
            str(text).strip()  # several games log a number as a message's text
            for sender, text, *kind in messages
            if sender != self.player and kind[:1] != [action]
        )


class GemEnv:
    """A GEM environment (`gem.make(env_id)`): its observation is the user's turn, with what GEM
    puts in `info["suffix"]` (the board, the instruction) as GEM's own observation wrapper adds
    it, the policy's turn its action; `terminated` or `truncated` ends the episode, and each
    step's reward adds to the episode's. `episode_end` says what ended it: `max_turns` when
    `truncated` (GEM's mark of its own turn limit) ended a turn after the first, else `done`
    (GEM's single-turn environments, math, code, QA, mark their one answer truncated too)."""

    observation_role = "user"
    episode_end: str | None = None

    def __init__(self, env_id: str, **make_args: Any) -> None:
        gem = _library("gem", "gem", f"gem:{env_id}")
        self.env_id = env_id
        try:
            self.env = gem.make(env_id, **make_args)
        except (KeyError, ValueError) as err:
            raise UserError(f"rollout.env gem:{env_id}: {err}") from None
        self.randomness = OwnRandomness()

    def reset(self, row: dict[str, Any]) -> str:
        seed = episode_seed(row)
        with self.randomness(seed):
            observation, info = self.env.reset(seed=seed)
        self.steps = 0
        return _with_suffix(observation, info)

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        with self.randomness():
            observation, reward, terminated, truncated, info = self.env.step(turn)
        self.steps += 1
        reward = _number(reward, f"gem:{self.env_id}: the step's reward is")
        if terminated or truncated:
            self.episode_end = MAX_TURNS if truncated and self.steps > 1 else DONE
            return None, reward, True
        return _with_suffix(observation, info), reward, False

    def abandon(self) -> None:
        """A call of the episode was left running past its time: see `OwnRandomness.abandon`."""
        self.randomness.abandon()


def _number(reward: Any, where: str) -> float:
    """A game's `reward` as a float when it is a real number (NumPy's included), not a bool;
    RuntimeError "`where` <the reward>, not a number" otherwise (not paid: a bool, None, text
    such as a reason a game passed as its reward)."""
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise RuntimeError(f"{where} {reward!r}, not a number")
    return float(reward)


def _with_suffix(observation: str, info: dict[str, Any] | None) -> str:
    suffix = (info or {}).get("suffix")
    return f"{observation}\n{suffix}" if suffix else observation
