"""A faulty environment costs its episode, never the run: a step that raises, returns a malformed
result or hangs past the episode's time ends the episode, scored as the reward settings say,
with a counted warning; with reward.errors=raise an error stops the run in one line."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy
import pytest
from helpers.episodes import load_qwen3_tokenizer, scripted_sampler, settings

from oncurve.errors import UserError
from oncurve.rollout import SamplingParams
from oncurve.rollout.env_calls import (
    ERROR,
    TIMEOUT,
    EnvFaults,
    StepResult,
    add_reward,
    call_steps,
)
from oncurve.rollout.episodes import run_episodes


class Scripted:
    """An environment whose `step` returns (or raises) `result`, after `delay` seconds;
    `abandoned` counts the calls of its `abandon`."""

    def __init__(self, result: object = ("next", 0.5, False), delay: float = 0.0) -> None:
        self.result, self.delay = result, delay
        self.released = threading.Event()
        self.abandoned = 0

    def abandon(self) -> None:
        self.abandoned += 1

    def reset(self, row: dict) -> str:
        return "Say something."

    def step(self, turn: str):
        if self.delay:
            self.released.wait(self.delay)
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


MALFORMED = [
    (("x", "1.0", False), "the reward '1.0', not a finite number or NaN"),
    (("x", math.inf, False), "the reward inf, not a finite number or NaN"),
    (("x", 1e39, False), "the reward 1e+39, not a finite number or NaN"),
    (("x", True, False), "the reward True, not a finite number or NaN"),
    ((3, 1.0, False), "an observation of type int, not text"),
    (("x", 1.0, "no"), "done='no', not True or False"),  # truthy: it would end the episode
    (("x", 1.0, None), "done=None, not True or False"),
    (("x", 1.0, 1), "done=1, not True or False"),
    (("x", 1.0), "returned tuple, not (observation, reward, done)"),
    (None, "returned NoneType, not (observation, reward, done)"),
    (ValueError("bad\nmove"), "step raised ValueError: bad move"),
    (SystemExit(3), "step raised SystemExit: 3"),  # a library's sys.exit
]


@pytest.mark.parametrize(("result", "why"), MALFORMED, ids=[w for _, w in MALFORMED])
@pytest.mark.parametrize("seconds", [None, 30.0], ids=["no limit", "a limit"])
def test_an_exception_or_a_malformed_result_is_an_error(result, why, seconds):
    (outcome,) = call_steps([Scripted(result)], ["turn"], [seconds])
    assert (outcome.fault, outcome.observation) == (ERROR, None)
    assert why in outcome.why


def test_a_nan_reward_is_an_unscored_episode_not_a_fault():
    (outcome,) = call_steps([Scripted(("x", math.nan, True))], ["turn"], [None])
    assert outcome.fault is None and math.isnan(outcome.reward) and outcome.done


def test_done_is_a_python_or_numpy_bool():
    envs = [Scripted(("x", 0.5, numpy.bool_(True))), Scripted(("x", 0.5, numpy.bool_(False)))]
    outcomes = call_steps(envs, ["a", "b"], [None, None])
    assert [(o.fault, o.done, type(o.done)) for o in outcomes] == [
        (None, True, bool),
        (None, False, bool),
    ]


class Ends(Scripted):
    """A Scripted environment that says what ended its episode (`episode_end`)."""

    def __init__(self, result: object, episode_end: object) -> None:
        super().__init__(result)
        self.episode_end = episode_end


# (step's result, the environment's `episode_end`, the step's ending, its fault)
ENDS = [
    (("x", 0.5, True), "max_turns", "max_turns", None),  # the environment's own turn limit
    ((None, 0.5, False), "length", "length", None),
    (("x", 0.5, True), "done", "done", None),
    (("x", 0.5, False), "max_turns", "done", None),  # read only once the episode ends
    (("x", 0.5, True), "timeout", "done", ERROR),  # a fault is no environment's to say
    (("x", 0.5, True), "truncated", "done", ERROR),
    (("x", 0.5, True), None, "done", None),  # nothing said
]


@pytest.mark.parametrize(("result", "said", "ending", "fault"), ENDS)
def test_an_environment_may_say_what_ended_its_episode(result, said, ending, fault):
    (outcome,) = call_steps([Ends(result, said)], ["turn"], [None])
    assert (outcome.ending, outcome.fault) == (ending, fault)
    if fault is not None:
        assert outcome.why == (
            f"step ended the episode with episode_end={said!r}, not done, length or max_turns"
        )


def test_an_environment_s_ending_is_its_episode_s():
    """Two episodes of one row end at their first step: one says its own turn limit ended it,
    the other says nothing (done); the first is counted as ended by the turn limit."""
    tok = load_qwen3_tokenizer()
    turn = tok("Hello.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    made = iter([Ends(("", 1.0, True), "max_turns"), Scripted(("", 1.0, True))])
    sampler, _ = scripted_sampler(tok, [turn, turn])
    played = run_episodes(
        sampler,
        [{"prompt": "p"}],
        group_size=2,
        params=SamplingParams(max_new_tokens=8, temperature=1.0, seed=0),
        settings=settings(tok, lambda: next(made), max_turns=3),
    )
    assert played.endings == ["max_turns", "done"] and played.rewards.tolist() == [1.0, 1.0]


class Plain:
    """An environment with no `abandon`, whose `step` waits until it is released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def reset(self, row: dict) -> str:
        return "Say something."

    def step(self, turn: str):
        self.released.wait(30.0)
        return "late", 0.0, False


def test_a_step_past_its_episode_s_time_is_a_timeout_and_the_others_come_back():
    """The environment of a step left running is told (`abandon`, where it has one), so that it
    can free what the step holds; one whose step came back is not."""
    hung, quick, plain = Scripted(delay=30.0), Scripted(("next", 0.25, True)), Plain()
    start = time.perf_counter()
    outcomes = call_steps([hung, quick, plain], ["a", "b", "c"], [0.2, 0.2, 0.2])
    assert time.perf_counter() - start < 5.0
    assert (outcomes[0].fault, outcomes[0].seconds) == (TIMEOUT, 0.2)
    assert "longer than the 0.2 s left of its episode" in outcomes[0].why
    assert (outcomes[1].fault, outcomes[1].reward, outcomes[1].done) == (None, 0.25, True)
    assert outcomes[2].fault == TIMEOUT
    assert (hung.abandoned, quick.abandoned) == (1, 0)
    hung.released.set()
    plain.released.set()


class Resets(Scripted):
    """An environment whose `reset` returns `first` after `delay` seconds."""

    def __init__(self, first: object, delay: float = 0.0) -> None:
        super().__init__()
        self.first, self.delay = first, delay

    def reset(self, row: dict) -> str:
        if self.delay:
            self.released.wait(self.delay)
        return self.first


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (Resets({"text": "hi"}), r"^rollout.env: reset returned dict, not the first message's"),
        (Resets("hi", delay=30.0), r"^rollout.env: reset took longer than 0.2 s"),
    ],
)
def test_a_reset_that_hangs_or_gives_no_text_stops_the_run_in_one_line(env, message):
    tok = load_qwen3_tokenizer()
    sampler, _ = scripted_sampler(tok, [[tok.eos_token_id]])
    episode_settings = dataclasses.replace(
        settings(tok, lambda: env, max_turns=2), faults=EnvFaults(timeout_s=0.2)
    )
    start = time.perf_counter()
    with pytest.raises(UserError, match=message):
        run_episodes(
            sampler, [{"prompt": "p"}], 1, SamplingParams(max_new_tokens=4), episode_settings
        )
    assert time.perf_counter() - start < 5.0
    assert env.abandoned == (1 if env.delay else 0)  # a reset left running is abandoned too
    env.released.set()


def test_the_reward_settings_score_a_fault():
    assert EnvFaults().score(TIMEOUT, "") == 0.0
    assert math.isnan(EnvFaults(timeout_score=None).score(TIMEOUT, ""))
    assert math.isnan(EnvFaults(on_error="none").score(ERROR, "step raised X"))
    with pytest.raises(UserError, match=r"^rollout.env: step raised X \(reward.errors=none"):
        EnvFaults().score(ERROR, "step raised X")


@pytest.mark.parametrize("on_error", ["none", "raise"])
def test_rewards_that_sum_past_float32_s_range_are_a_fault(on_error):
    """Each step's 3e38 is in float32's range, the episode's 6e38 after two steps is not (its
    reward would be infinite): the episode ends on an error fault at the second step."""
    tok = load_qwen3_tokenizer()
    turn = tok("Hello.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    episode_settings = dataclasses.replace(
        settings(tok, lambda: Scripted(("obs", 3e38, False)), max_turns=3),
        faults=EnvFaults(on_error=on_error),
    )
    feed = episode_settings.observation("obs", True)
    sampler, _ = scripted_sampler(tok, [turn + feed + turn + feed + turn])

    def play():
        return run_episodes(
            sampler, [{"prompt": "p"}], 1, SamplingParams(max_new_tokens=8), episode_settings
        )

    if on_error == "raise":
        with pytest.raises(UserError, match=r"^rollout.env: the episode's rewards sum to 6e\+38,"):
            play()
        return
    played = play()
    assert math.isnan(played.rewards[0]) and played.faults == [ERROR]
    assert played.turns.tolist() == [2]


def test_a_nan_total_stays_unscored_and_a_fault_adds_nothing():
    total, result = add_reward(math.nan, StepResult(reward=1.0))
    assert math.isnan(total) and result.fault is None
    assert add_reward(1.0, StepResult(reward=2.0)) == (3.0, StepResult(reward=2.0))
    faulty = StepResult(fault=TIMEOUT, why="slow")
    assert add_reward(1.0, faulty) == (1.0, faulty)


def test_an_episode_ended_by_a_fault_is_unscored_and_counted(capsys):
    """Two episodes of one row: the first environment raises at its first step, the second
    plays on; the first ends there, unscored (reward.errors=none), with one warning."""
    tok = load_qwen3_tokenizer()
    turn = tok("Hello.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    made = iter([Scripted(RuntimeError("boom")), Scripted(("", 1.0, True))])
    sampler, _ = scripted_sampler(tok, [turn, turn])
    episode_settings = dataclasses.replace(
        settings(tok, lambda: next(made), max_turns=3), faults=EnvFaults(on_error="none")
    )
    played = run_episodes(
        sampler,
        [{"prompt": "p"}],
        group_size=2,
        params=SamplingParams(max_new_tokens=8, temperature=1.0, seed=0),
        settings=episode_settings,
    )
    assert math.isnan(played.rewards[0]) and played.rewards[1] == 1.0
    assert played.faults == [ERROR, None] and played.turns.tolist() == [1, 1]
    err = capsys.readouterr().err
    assert "1 of 2 episodes ended on their environment's fault" in err
    assert "step raised RuntimeError: boom" in err
