"""Reward functions written for TRL are called as TRL calls them: keywords, conversational
prompts and completions as messages, `completion_ids`, `trainer_state`, `log_extra` and
`log_metric` (their values come back with the scores), `async def` functions awaited, the
batch calls of several together."""

from __future__ import annotations

import asyncio
import functools
import math
import warnings

import pytest
from helpers.rewards_for_tests import FIRST_LOOP

from oncurve.rewards.jobs import RewardError
from oncurve.rewards.registry import give_rewards, resolve_reward
from oncurve.rewards.runner import RewardRunner, logged_metrics
from oncurve.rewards.trl_contract import RewardLog, TrainerState, TrlReward, call_context

MESSAGES = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "3+3?"}],
]
COLUMNS = {
    "prompt_messages": MESSAGES,
    "solution": ["4", "6"],
    "completion_ids": [[5, 6, 7], [8]],
}


def runner(*names: str, timeout_s: float | None) -> RewardRunner:
    fns = [resolve_reward(f"helpers.rewards_for_tests:{name}") for name in names]
    return RewardRunner([(name, fn, 1.0) for name, fn in fns], timeout_s=timeout_s)


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_trl_rewards_read_messages_and_log_beside_their_scores(timeout_s):
    names = ("think_format_reward", "accuracy_reward", "logging_reward", "async_length_reward")
    with runner(*names, timeout_s=timeout_s) as scorer:
        result = scorer.score(
            ["2+2?", "3+3?"], ["<a>4</a>", "5"], COLUMNS, TrainerState(7, max_steps=20)
        )
    assert result.per_fn.tolist() == [[1.0, 1.0, 3.0, 8.0], [0.0, 0.0, 1.0, 1.0]]
    assert result.extra == {"step_seen": [7, 7], "of_steps": [20, 20], "asked": ["2+2?", "3+3?"]}
    assert result.logged == {"logging_reward/tokens": [2.0]}
    assert logged_metrics(result, taken=result.metrics) == {"logging_reward/tokens": 2.0}
    assert result.extra_by == dict.fromkeys(("step_seen", "of_steps", "asked"), "logging_reward")


def test_a_text_dataset_passes_text_and_built_ins_keep_taking_text():
    seen = {}

    def keep(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, keys=sorted(kwargs))
        return [0.0] * len(completions)

    RewardRunner([("keep", TrlReward(keep), 1.0)], timeout_s=None).score(
        ["p"], ["c"], {"answer": ["1"]}
    )
    assert seen == {
        "prompts": ["p"],
        "completions": ["c"],
        "keys": ["answer", "log_extra", "log_metric", "trainer_state"],
    }
    name, correct = resolve_reward("correct")
    assert not isinstance(correct, TrlReward)


def test_a_positional_oncurve_reward_is_still_called_positionally():
    """A function whose parameters are not named `completions` gets (prompts, completions)."""

    def digits(p, c, **columns):
        return [float(text.isdigit()) for text in c]

    result = RewardRunner([("d", TrlReward(digits), 1.0)], timeout_s=None).score(
        ["x", "y"], ["12", "ab"], {}
    )
    assert result.per_fn[:, 0].tolist() == [1.0, 0.0]


class KeywordScorer:
    """A callable object taking keywords only, as TRL passes them."""

    def __call__(self, **kwargs):
        return [float(len(text)) for text in kwargs["completions"]]


def without_wraps(fn):
    def wrapper(*args, **kwargs):  # a decorator that does not keep fn's signature
        return fn(*args, **kwargs)

    return wrapper


@without_wraps
def wrapped_length(prompts, completions, **kwargs):
    return [float(len(text)) for text in completions]


def keywords_only(**kwargs):
    return [float(len(text)) for text in kwargs["completions"]]


@pytest.mark.parametrize("fn", [KeywordScorer(), wrapped_length, keywords_only])
def test_a_function_taking_keywords_is_called_with_keywords_as_trl_calls_it(fn):
    result = RewardRunner([("k", TrlReward(fn), 1.0)], timeout_s=None).score(
        ["x", "y"], ["12", "abc"], {}
    )
    assert result.per_fn[:, 0].tolist() == [2.0, 3.0]


class AsyncJudge:
    """An object whose `__call__` is `async def`, as TRL takes an async reward."""

    def __init__(self, reward):
        self.reward = reward

    async def __call__(self, completions, **kwargs):
        return await self.reward(completions, **kwargs)


@pytest.mark.parametrize(
    "form",
    [lambda f: f, AsyncJudge, lambda f: functools.partial(AsyncJudge(f))],
    ids=["async-def", "async-call-object", "partial-of-one"],
)
def test_async_rewards_are_awaited_together(form):
    """Two async rewards, each awaiting twice: both start before either finishes."""
    order: list[str] = []

    def make(tag: str):
        async def reward(completions, **kwargs):
            order.append(f"start {tag}")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            order.append(f"end {tag}")
            return [1.0] * len(completions)

        return TrlReward(form(reward))

    fns = [("a", make("a"), 1.0), ("b", make("b"), 1.0)]
    result = RewardRunner(fns, timeout_s=None).score(["p"], ["c"], {})
    assert result.total.tolist() == [2.0]
    assert order == ["start a", "start b", "end a", "end b"]


def test_log_extra_with_the_wrong_number_of_values_is_one_line():
    def short(completions, log_extra, **kwargs):
        log_extra("x", [1])
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"reward 's' logged 1 values of 'x'; log_extra takes"):
        RewardRunner([("s", TrlReward(short), 1.0)], timeout_s=None).score(
            ["p", "q"], ["c", "d"], {}
        )


def test_a_function_listing_trls_keywords_one_by_one_takes_no_others():
    """The trainer passes columns TRL does not (`answer` read off `solution`,
    `completion_lengths`): a function without `**kwargs` gets only those it names."""

    def exact(prompts, completions, completion_ids, solution, trainer_state, log_extra, log_metric):
        return [float(c[0]["content"] == s) for c, s in zip(completions, solution, strict=True)]

    columns = {**COLUMNS, "answer": ["4", "6"], "completion_lengths": [3, 1]}
    result = RewardRunner([("exact", TrlReward(exact), 1.0)], timeout_s=None).score(
        ["x", "y"], ["4", "5"], columns
    )
    assert result.total.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_async_rewards_run_on_one_event_loop_for_the_run(timeout_s):
    """A client or semaphore an async reward makes on its first call is bound to that call's
    event loop: every later batch, and a row-wise retry, runs on the same loop."""
    FIRST_LOOP.clear()  # a loop another test's calls made in this process is not this run's
    scorer = runner("same_loop_reward", timeout_s=timeout_s)
    for _ in range(3):
        assert scorer.score(["p", "q"], ["a", "b"], {}).total.tolist() == [1.0, 1.0]
    fn = TrlReward(resolve_reward("helpers.rewards_for_tests:same_loop_reward")[1].fn)
    state = TrainerState(global_step=0)
    assert fn(["p"], ["a"], **call_context(RewardLog(), state)) == [1.0]

    async def score_in_a_loop():  # a notebook's running loop is no obstacle
        return scorer.score(["p"], ["a"], {}).total.tolist()

    assert asyncio.run(score_in_a_loop()) == [1.0]


def test_rewards_without_async_ones_score_inside_a_running_event_loop():
    """A notebook runs an event loop: scoring there with plain rewards starts no loop of its
    own (asyncio.run would refuse)."""

    def ones(prompts, completions, **columns):
        return [1.0] * len(completions)

    async def score_in_a_loop():
        runner = RewardRunner([("ones", TrlReward(ones), 1.0)], timeout_s=None)
        return runner.score(["p"], ["c"], {}).total.tolist()

    assert asyncio.run(score_in_a_loop()) == [1.0]


class NoNumber:
    """A value whose conversion to float raises something else than TypeError or ValueError."""

    def __float__(self) -> float:
        raise RuntimeError("boom")


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_a_value_that_is_no_number_is_one_line_naming_the_reward(timeout_s):
    def odd(completions, **kwargs):
        return [NoNumber() for _ in completions]

    with (
        RewardRunner([("odd", TrlReward(odd), 1.0)], timeout_s=timeout_s) as scorer,
        pytest.raises(RewardError, match=r"reward 'odd' returned .*NoNumber.* for sample 0;"),
    ):
        scorer.score(["p"], ["c"], {})


def test_a_keyword_no_column_holds_is_one_line_not_the_completions_in_its_place():
    """A function written with TRL's names that takes a column the data lacks fails naming
    it (called positionally, it took the completions for `ground_truth`, the prompts for
    `completions`, and scored garbage without a word)."""

    def by_truth(completions, ground_truth, **kwargs):
        return [float(c == g) for c, g in zip(completions, ground_truth, strict=True)]

    runner = RewardRunner([("t", TrlReward(by_truth), 1.0)], timeout_s=None)
    assert runner.score(["x"], ["2"], {"ground_truth": ["2"]}).per_fn[:, 0].tolist() == [1.0]
    with pytest.raises(
        RewardError, match=r"reward 't': its argument 'ground_truth' is no column of"
    ):
        runner.score(["x"], ["2"], {})
    # the function's fault, not a row's: no error policy scores it as a row's error
    lenient = RewardRunner([("t", TrlReward(by_truth), 1.0)], timeout_s=5.0, on_error="none")
    with lenient, pytest.raises(RewardError, match=r"'t'.*'ground_truth' is no column of"):
        lenient.score(["x", "y"], ["2", "3"], {})


@pytest.mark.parametrize("logged", ["log_metric", "log_extra"])
def test_a_log_named_step_is_one_line_not_the_trainers_step_replaced(logged):
    """`step` numbers metrics.jsonl's and samples.jsonl's rows: a reward's log of that name
    stops the run in one line (it replaced the step, and the run could not resume)."""

    def logs_step(completions, log_metric, log_extra, **kwargs):
        if logged == "log_metric":
            log_metric("step", 5)
        else:
            log_extra("step", [5] * len(completions))
        return [0.0] * len(completions)

    runner = RewardRunner([("s", TrlReward(logs_step), 1.0)], timeout_s=None)
    with pytest.raises(RewardError, match=rf"reward 's' logged 'step' with {logged}; the trainer"):
        runner.score(["p", "q"], ["c", "d"], {})


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_two_rewards_logging_one_column_is_one_line_not_one_column_lost(timeout_s):
    """samples.jsonl holds one value of a column per completion: a second reward's log of the
    column would replace the first's."""

    def first(completions, log_extra, **kwargs):
        log_extra("parsed", ["a"] * len(completions))
        return [0.0] * len(completions)

    def second(completions, log_extra, **kwargs):
        log_extra("parsed", ["b"] * len(completions))
        return [0.0] * len(completions)

    fns = [("first", TrlReward(first), 1.0), ("second", TrlReward(second), 1.0)]
    with (
        RewardRunner(fns, timeout_s=timeout_s) as scorer,
        pytest.raises(
            RewardError,
            match=r"^reward 'second' logged 'parsed' with log_extra, a column reward 'first' "
            r"logged too; choose another name",
        ),
    ):
        scorer.score(["p", "q"], ["c", "d"], {})


def test_a_log_value_that_cannot_leave_the_worker_is_one_line_naming_the_reward():
    def logs_a_function(completions, log_extra, **kwargs):
        log_extra("f", [len for _ in completions])
        log_extra("g", [lambda: 0 for _ in completions])
        return [0.0] * len(completions)

    with (
        RewardRunner([("l", TrlReward(logs_a_function), 1.0)], timeout_s=5.0) as scorer,
        pytest.raises(RewardError, match=r"reward 'l' failed on sample 0: it logged a value th"),
    ):
        scorer.score(["p"], ["c"], {})


def lengths_generator(completions, **kwargs):
    return (float(len(text)) for text in completions)


def lengths_map(completions, **kwargs):
    return map(float, map(len, completions))


async def async_lengths_generator(completions, **kwargs):
    return (float(len(text)) for text in completions)


def generator_failing_on_b(completions, **kwargs):
    return (float(len(text)) if text != "b" else 1 / 0 for text in completions)


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
@pytest.mark.parametrize("fn", [lengths_generator, lengths_map, async_lengths_generator])
def test_a_generator_or_map_is_scored_in_the_order_it_yields_as_trl_takes_it(fn, timeout_s):
    """TRL builds its list of scores by iterating what the function returns: a generator or a
    `map` of one score per completion is as good as a list there."""
    with RewardRunner([("g", TrlReward(fn), 1.0)], timeout_s=timeout_s) as scorer:
        result = scorer.score(["p", "q", "r"], ["a", "bbb", "cc"], {})
    assert result.per_fn[:, 0].tolist() == [1.0, 3.0, 2.0]


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_a_generator_that_raises_is_the_rows_error_under_the_error_policy(timeout_s):
    runner = RewardRunner(
        [("g", TrlReward(generator_failing_on_b), 1.0)], timeout_s=timeout_s, on_error="none"
    )
    with runner as scorer, pytest.warns(RuntimeWarning, match="failed on a whole batch"):
        result = scorer.score(["p", "q", "r"], ["a", "b", "cc"], {})
    assert result.per_fn[:, 0].tolist()[::2] == [1.0, 2.0]
    assert math.isnan(result.per_fn[1, 0])
    assert result.metrics["reward/errors"] == 1.0


def none_for_the_second(completions, **kwargs):
    return [None if i == 1 else 1.0 for i in range(len(completions))]


def none_for_the_second_and_third(completions, **kwargs):
    return [None if i in (1, 2) else 0.5 for i in range(len(completions))]


def test_a_row_no_reward_scored_is_left_out_and_said_once_as_trl_warns():
    """TRL sums the functions' scores leaving out None (NaN), gives a row every function
    returned None for no reward (NaN, out of its group's statistics) and warns; so here, once."""
    fns = [
        ("a", TrlReward(none_for_the_second), 1.0),
        ("b", TrlReward(none_for_the_second_and_third), 2.0),
    ]
    runner = RewardRunner(fns, timeout_s=None)
    with pytest.warns(RuntimeWarning, match=r"^no reward function scored row 1 of 3 \(prompt 'q'"):
        result = runner.score(["p", "q", "r"], ["x", "y", "z"], {})
    total = result.total.tolist()
    assert total[0] == 2.0 and math.isnan(total[1]) and total[2] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.score(["p", "q", "r"], ["x", "y", "z"], {})


def scaled_length(completions, scale=1.0, **kwargs):
    return [scale * len(text) for text in completions]


class Penalty:
    """A callable object, as TRL's `get_repetition_penalty_reward` returns one."""

    def __call__(self, completions, **kwargs):
        return [0.0] * len(completions)


class NamedPenalty(Penalty):
    __name__ = "named_penalty"


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (scaled_length, "scaled_length"),
        (functools.partial(scaled_length, scale=2.0), "scaled_length"),
        (functools.partial(functools.partial(scaled_length), scale=2.0), "scaled_length"),
        (Penalty(), "Penalty"),
        (NamedPenalty(), "named_penalty"),
        (functools.partial(NamedPenalty()), "named_penalty"),
    ],
    ids=["function", "partial", "partial-of-partial", "object", "named-object", "partial-of-obj"],
)
def test_a_reward_is_named_as_trl_names_it(fn, name):
    """TRL logs a reward under its `__name__`, a `functools.partial`'s being its function's, and
    an object's without one its class's."""
    assert TrlReward(fn).__name__ == name
    assert give_rewards([fn]) == [f"given:{name}"]
