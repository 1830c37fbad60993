"""TextArena's and GEM's games as oncurve environments: a row's seed fixes the game, the
observations are the game's new messages as user turns, the rewards are the game's, and a
missing library, an unknown game or a game for two players is a one-line error."""

from __future__ import annotations

import math
import random
import sys
import threading
import time

import numpy as np
import pytest
from helpers.episodes import chat_ids, load_qwen3_tokenizer, scripted_sampler, settings

from oncurve.envs.libraries import GemEnv, TextArenaGame, episode_seed
from oncurve.errors import UserError
from oncurve.rollout import SamplingParams
from oncurve.rollout.env_calls import ERROR, TIMEOUT, EnvFaults, call_reset, call_steps
from oncurve.rollout.episodes import observation_role, resolve_environment, run_episodes

textarena = pytest.importorskip("textarena", reason="the textarena extra is not installed")
GUESS = "GuessTheNumber-v0"


def binary_search(game: TextArenaGame, row: dict) -> tuple[list[str], list[str | None], float]:
    """Plays `game` on `row` by halving 1..20: the turns, the observations after each, the
    reward at the end."""
    low, high, turns, observations = 1, 20, [], []
    game.reset(row)
    while True:
        guess = (low + high) // 2
        turns.append(f"I guess [{guess}]")
        observation, reward, done = game.step(turns[-1])
        observations.append(observation)
        if done:
            return turns, observations, reward
        low, high = (guess + 1, high) if "higher" in observation else (low, guess - 1)


def test_a_row_s_seed_fixes_the_game_and_a_win_pays_one():
    first = TextArenaGame(GUESS).reset({"seed": 3})
    assert "Guess The Number" in first and "[5]" in first
    turns, observations, reward = binary_search(TextArenaGame(GUESS), {"seed": 3})
    assert reward == 1.0 and observations[-1] is None and len(turns) > 1
    assert all(o in ("The target number is higher.", "The target number is lower.")
               for o in observations[:-1])  # fmt: skip
    assert binary_search(TextArenaGame(GUESS), {"seed": 3})[0] == turns
    targets = {binary_search(TextArenaGame(GUESS), {"seed": s})[0][-1] for s in range(6)}
    assert len(targets) > 1
    assert (
        episode_seed({"prompt": "a"})
        == episode_seed({"prompt": "a", "seed": None})  # a column some rows lack
        == episode_seed({"prompt": "a"})
        != episode_seed({"prompt": "b"})
    )


def test_the_policys_own_action_is_not_fed_back_whoever_the_game_logs_it_from():
    """TowerOfHanoi logs the player's action as the game's own message."""
    game = TextArenaGame("TowerOfHanoi-v0")
    game.reset({"seed": 0})
    observation, reward, done = game.step("[move the disk] zzz-own-action")
    assert "invalid move" in (observation or "") and "zzz-own-action" not in (observation or "")


def test_gem_steps_reward_each_turn_and_end_the_episode():
    pytest.importorskip("gem", reason="the gem extra is not installed")
    env = GemEnv("game:GuessTheNumber-v0-easy")
    assert "Guess The Number" in env.reset({"seed": 3})
    total, done, guess = 0.0, False, 0
    while not done:
        guess += 1
        observation, reward, done = env.step(f"\\boxed{{{guess}}}")
        total += reward
        assert done or observation.endswith("Enter your next guess.")
    assert observation is None and total == 1.0 and 1 <= guess <= 10


def test_a_gem_games_first_message_shows_its_board():
    """GEM's own observation wrapper adds `info["suffix"]` (the board, the instruction) on
    reset as on every step: a Sudoku starts with its grid."""
    gem = pytest.importorskip("gem", reason="the gem extra is not installed")
    _, info = gem.make("game:Sudoku-v0-easy").reset(seed=3)
    first = GemEnv("game:Sudoku-v0-easy").reset({"seed": 3})
    assert info["suffix"].strip() and info["suffix"].strip() in first


@pytest.mark.parametrize(
    ("library", "game", "move"),
    [("gem", "game:Game2048-v0-easy", "\\boxed{left}"), ("textarena", "2048-v0", "[left]")],
)
def test_a_rows_episodes_play_the_same_game_whatever_order_they_step_in(library, game, move):
    """The games draw new tiles from the process-wide generators: each episode keeps its own,
    so the same moves give the same boards however the G episodes' steps interleave."""
    pytest.importorskip(library, reason=f"the {library} extra is not installed")
    make = GemEnv if library == "gem" else TextArenaGame
    envs = [make(game) for _ in range(4)]
    assert len({env.reset({"seed": 7}) for env in envs}) == 1
    before = random.getstate()
    boards = [[], [], [], []]
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        for i in order:
            boards[i].append(envs[i].step(move)[0])
    assert boards[0] == boards[1] == boards[2] == boards[3]
    assert random.getstate() == before  # the caller's generator is as it was


def test_a_game_that_hangs_past_its_time_holds_up_no_other_game():
    """The games' calls take turns with the process-wide generators: a step that hangs is left
    at its episode's time, and the other episodes' games, of this step and later, play on; when
    the hung step returns at last, it leaves the generators as they are."""
    games = [TextArenaGame(GUESS) for _ in range(3)]
    first = {game.reset({"seed": 7}) for game in games}
    hanging, released, hung_threads = threading.Event(), threading.Event(), []
    inner, healthy = games[1].env.step, games[0].step

    def hung(action: str):
        hung_threads.append(threading.current_thread())
        hanging.set()
        released.wait(30.0)
        return inner(action)

    def after_the_hung_one(turn: str):
        hanging.wait(5.0)
        return healthy(turn)

    games[1].env.step, games[0].step = hung, after_the_hung_one
    start = time.perf_counter()
    # the healthy games have more time left than the hung one, the first of them waited on
    # first: each is waited on until its own time, whichever order they come in
    results = call_steps(games, ["[10]"] * 3, [20.0, 0.5, 20.0])
    assert time.perf_counter() - start < 10.0
    assert results[1].fault == TIMEOUT
    answers = [(r.fault, r.done, r.observation) for r in results[::2]]
    assert answers[0] == answers[1] and answers[0][:2] == (None, False)
    assert answers[0][2].startswith("The target number is ")
    fresh = TextArenaGame(GUESS)
    assert {call_reset(fresh, {"seed": 7}, 2.0)} == first  # seeded as before
    assert call_steps([fresh], ["[10]"], [2.0])[0].observation == answers[0][2]
    random.random()
    before = random.getstate()
    released.set()
    hung_threads[0].join(10.0)
    assert not hung_threads[0].is_alive() and random.getstate() == before


def test_library_games_resolve_and_bad_ones_fail_in_one_line(monkeypatch):
    make = resolve_environment(f"textarena:{GUESS}")
    assert isinstance(make(), TextArenaGame) and observation_role(make) == "user"
    assert observation_role(resolve_environment("python_tool")) is None
    with pytest.raises(UserError, match="not found in registry"):
        resolve_environment("textarena:NoSuchGame-v0")
    with pytest.raises(UserError, match=r"has to be 2, received 1 \(one player only\)$"):
        TextArenaGame("TicTacToe-v0").reset({"seed": 0})
    monkeypatch.setitem(sys.modules, "gem", None)  # as if not installed
    with pytest.raises(UserError, match=r"needs gem: pip install 'oncurve\[gem\]'$"):
        resolve_environment("gem:game:GuessTheNumber-v0-easy")


@pytest.mark.parametrize(
    "game",
    ["QuantumTicTacToe-v0", "SpiteAndMalice-v0", "PublicGoodsGame-v0", "MarketEntryGame-v0"],
)
def test_a_game_for_several_players_is_refused_whatever_it_does_with_one(game):
    """These games accept `num_players=1` and set up a game for two (or a game for several
    that never ends with one): the policy would play every side and be paid for whichever
    moved last. Its reset is a one-line error; a one-player game still starts."""
    with pytest.raises(UserError) as refused:
        TextArenaGame(game).reset({"seed": 0})
    assert str(refused.value) == (
        f"rollout.env textarena:{game}: not a single-player game (one player only)"
    )
    assert "Guess The Number" in TextArenaGame(GUESS).reset({"seed": 0})


def test_a_played_game_is_a_chat_of_user_turns_and_the_win_is_the_reward():
    """A scripted model plays the binary search of seed 3: the transcript is the chat template's
    rendering of the game (its messages as user turns), and the episode's reward is the win."""
    tok = load_qwen3_tokenizer()
    row = {"prompt": "any", "seed": 3}
    game = TextArenaGame(GUESS)
    conversation = [{"role": "user", "content": game.reset(row)}]
    turns, observations, _ = binary_search(TextArenaGame(GUESS), row)
    for turn, observation in zip(turns, observations, strict=True):
        conversation.append({"role": "assistant", "content": turn})
        if observation is not None:
            conversation.append({"role": "user", "content": observation})
    prompt = chat_ids(tok, conversation[:1], generation_prompt=True)
    expected = chat_ids(tok, conversation)[len(prompt) :]
    while tok.decode(expected[-1:]).isspace():  # the template's newline after the last turn
        expected.pop()
    sampler, _ = scripted_sampler(tok, [expected])
    played = run_episodes(
        sampler,
        [row],
        group_size=1,
        params=SamplingParams(max_new_tokens=16, temperature=1.0, seed=0),
        settings=settings(tok, lambda: TextArenaGame(GUESS), max_turns=10, role="user"),
    )
    out = played.rollout
    assert out.completion_ids[0, : len(expected)].tolist() == expected
    assert played.rewards.tolist() == [1.0] and played.turns.tolist() == [len(turns)]
    fed = tok.decode(out.completion_ids[0][out.tool_mask[0].bool()])
    assert "<|im_start|>user\nThe target number is" in fed and "tool_response" not in fed


def test_a_textarena_reward_that_is_not_a_number_is_the_games_fault_not_paid():
    """Countdown passes its arguments to `set_invalid_move` swapped, so invalid moves end the
    game (at the second: it allows one) with the reason's text as the reward: a fault naming
    the game and that text. A bool is not paid as 1, a missing reward not as anything; NumPy's
    numbers are numbers."""
    game = TextArenaGame("Countdown-v0")
    game.reset({"seed": 1})
    assert game.step("[")[2] is False
    with pytest.raises(RuntimeError) as swapped:
        game.step("[")
    assert str(swapped.value).startswith(
        "textarena:Countdown-v0: the game ended with the reward 'Invalid action format."
    )
    assert str(swapped.value).endswith("', not a number")
    for rewards, paid in [({0: True}, None), (None, None), ({}, None), ({0: np.float32(0.5)}, 0.5)]:
        game = TextArenaGame(GUESS)
        game.reset({"seed": 3})
        game.env.step = lambda action: (True, {})
        game.env.close = lambda rewards=rewards: (rewards, {})
        if paid is None:
            with pytest.raises(RuntimeError, match=r"^textarena:GuessTheNumber-v0: the game "):
                game.step("[10]")
        else:
            assert game.step("[10]") == (None, paid, True)


def test_a_game_that_raises_on_the_policys_move_is_the_games_fault():
    """GuessTheNumber reads a guess of 5,000 digits with `int`, which refuses it: the episode
    ends on an error fault that `reward.errors` scores (raise: one line; none: unscored), as
    Countdown's swapped reward is; no invalid move's reward is made up for it."""
    game = TextArenaGame(GUESS)
    game.reset({"seed": 3})
    (result,) = call_steps([game], ["[" + "9" * 5000 + "]"], [None])
    assert result.fault == ERROR
    assert result.why.startswith("step raised ValueError: Exceeds the limit (4300 digits)")
    with pytest.raises(UserError) as stopped:
        EnvFaults().score(result.fault, result.why)
    assert "\n" not in str(stopped.value) and "reward.errors=none" in str(stopped.value)
    assert math.isnan(EnvFaults(on_error="none").score(result.fault, result.why))


@pytest.mark.parametrize("reward", ["1", True, None, [1.0]])
def test_a_gem_reward_that_is_not_a_number_is_the_games_fault_not_paid(reward):
    pytest.importorskip("gem", reason="the gem extra is not installed")
    env = GemEnv("game:GuessTheNumber-v0-easy")
    env.reset({"seed": 3})
    env.env.step = lambda action: ("obs", reward, False, False, {})
    with pytest.raises(RuntimeError) as refused:
        env.step("\\boxed{1}")
    assert str(refused.value) == (
        f"gem:game:GuessTheNumber-v0-easy: the step's reward is {reward!r}, not a number"
    )
    env.env.step = lambda action: ("obs", np.float64(0.25), np.True_, False, {})
    assert env.step("\\boxed{1}") == (None, 0.25, True)


def play_to_the_end(env, row: dict, moves: list[str]) -> tuple[int, float, str | None]:
    """Plays `moves` on `env` until its episode ends: the steps played, the summed reward and
    what the environment says ended it (`episode_end`, None: nothing)."""
    env.reset(row)
    total = 0.0
    for played, move in enumerate(moves, start=1):
        _, reward, done = env.step(move)
        total += reward
        if done:
            return played, total, getattr(env, "episode_end", None)
    raise AssertionError(f"{moves} did not end the episode")


# (library, game, moves, steps played, reward, what ended it): a game's own turn limit is
# `max_turns`; a win, a loss by the game's rules and a single-turn answer are `done`
GAME_ENDINGS = [
    # TextArena ends TowerOfHanoi at its turn limit (14 moves) and pays the disks placed
    ("textarena", "TowerOfHanoi-v0", ["[A C]", "[C A]"] * 20, 15, 0.0, "max_turns"),
    ("textarena", GUESS, ["[10]", "[5]", "[7]", "[8]"], 4, 1.0, "done"),  # seed 3's number: 8
    # a second invalid move loses the game: the game's rules end it, with its reward
    ("textarena", GUESS, ["no guess"] * 3, 2, 0.0, "done"),
    # GEM marks its turn limit truncated (and terminated) and pays the last guess's closeness
    (
        "gem",
        "game:GuessTheNumber-v0-easy",
        ["\\boxed{1}"] + ["\\boxed{2}"] * 3,
        4,
        7 / 9,
        "max_turns",
    ),
    # seed 3's number is 4: the fourth guess wins, at the turn limit, and is no turn limit's end
    (
        "gem",
        "game:GuessTheNumber-v0-easy",
        [f"\\boxed{{{n}}}" for n in range(1, 5)],
        4,
        1.0,
        "done",
    ),
]


@pytest.mark.parametrize(("library", "game", "moves", "steps", "reward", "ending"), GAME_ENDINGS)
def test_a_game_says_what_ended_it(library, game, moves, steps, reward, ending):
    pytest.importorskip(library, reason=f"the {library} extra is not installed")
    env = GemEnv(game) if library == "gem" else TextArenaGame(game)
    played, total, said = play_to_the_end(env, {"seed": 3}, moves)
    assert (played, said) == (steps, ending)
    assert total == pytest.approx(reward)


@pytest.mark.parametrize(
    ("first", "later", "ending"),
    [
        ((True, True), None, "done"),  # a single-turn environment marks its answer both
        ((False, False), (True, True), "max_turns"),
        ((False, False), (False, True), "max_turns"),  # truncated, not terminated
        ((False, False), (True, False), "done"),
    ],
)
def test_gem_s_truncated_is_its_turn_limit_after_the_first_turn(first, later, ending):
    """GEM's single-turn environments (math, code, QA) return terminated and truncated on
    their one answer; a multi-turn game returns truncated at its own turn limit."""
    pytest.importorskip("gem", reason="the gem extra is not installed")
    env = GemEnv("game:GuessTheNumber-v0-easy")
    env.reset({"seed": 3})
    results = iter([("obs", 0.0, *first, {}), ("obs", 0.5, *(later or first), {})])
    env.env.step = lambda action: next(results)
    done = env.step("\\boxed{1}")[2]
    if not done:
        assert env.step("\\boxed{2}") == (None, 0.5, True)
    assert env.episode_end == ending
