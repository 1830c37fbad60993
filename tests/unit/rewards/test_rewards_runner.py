import math
import os
import time
import warnings

import numpy as np
import pytest
import torch

from oncurve.config import load_config
from oncurve.errors import UserError
from oncurve.rewards.jobs import RewardError
from oncurve.rewards.runner import RewardRunner
from oncurve.run.rewards import build_rewards

NAN = math.nan


def ones(prompts, completions, **columns):
    return [1.0] * len(completions)


def by_text(prompts, completions, **columns):
    """len(text) per row; "hang" loops forever, "boom" raises, "none" is None."""
    out = []
    for text in completions:
        if text == "hang":
            while True:
                time.sleep(0.01)
        if text == "boom":
            raise KeyError("bad row")
        out.append(None if text == "none" else float(len(text)))
    return out


def _score(runner, completions, **columns):
    return runner.score(["p"] * len(completions), completions, columns)


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), equal_nan=True, rtol=0, atol=1e-6)


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_weighted_sum_nones_and_metrics(timeout_s):
    def half(prompts, completions, answer):
        return [0.5 if a == "y" else None for a in answer]

    runner = RewardRunner([("ones", ones, 2.0), ("half", half, 4.0)], timeout_s=timeout_s)
    result = _score(runner, ["a", "b", "c"], answer=["y", "n", "y"])
    _close(result.per_fn, [[1.0, 0.5], [1.0, NAN], [1.0, 0.5]])
    # a None among several functions counts 0 in the sum
    _close(result.total, [4.0, 2.0, 4.0])
    assert 0.0 < result.metrics.pop("reward/slowest_row_s") < 5.0
    assert result.metrics == {
        "reward/ones": 1.0,
        "reward/half": 0.5,
        "reward/timeouts": 0.0,
        "reward/errors": 0.0,
    }


def test_all_none_row_is_nan_and_nan_inf_are_none():
    def odd(prompts, completions, **columns):
        return [None, math.nan, math.inf, 2]

    result = _score(RewardRunner([("odd", odd, 1.0)], timeout_s=None), ["a", "b", "c", "d"])
    _close(result.total, [NAN, NAN, NAN, 2.0])
    assert result.metrics["reward/odd"] == 2.0


def test_closures_work_in_the_forked_child():
    offset = 3.0
    runner = RewardRunner([("shift", lambda p, c, **k: [offset + len(t) for t in c], 1.0)])
    _close(_score(runner, ["ab", "abcd"]).total, [5.0, 7.0])


def test_hung_row_is_stopped_scored_and_counted():
    runner = RewardRunner([("by_text", by_text, 1.0)], timeout_s=0.5, timeout_score=-1.0)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning) as said:
        result = _score(runner, ["ab", "hang", "abc"])
    # each said once a run: the batch that failed, then the row that took too long
    messages = [str(w.message) for w in said]
    assert len(messages) == 2
    assert messages[0].startswith("reward 'by_text' failed on a whole batch (timeout): its rows")
    assert messages[1].startswith("reward 'by_text' took longer than reward.timeout (0.5 s)")
    assert "which is scored -1.0 (reward.timeout_score)" in messages[1]
    # the batch call and the hung row each wait one timeout; the other rows are still scored
    assert time.perf_counter() - start < 5.0
    _close(result.per_fn[:, 0], [2.0, -1.0, 3.0])
    assert result.metrics["reward/timeouts"] == 1.0


def test_timeout_score_none_leaves_row_out():
    runner = RewardRunner([("ones", ones, 1.0), ("by_text", by_text, 1.0)], timeout_s=0.5)
    result = _score(runner, ["hang", "abc"])
    _close(result.per_fn, [[1.0, NAN], [1.0, 3.0]])
    assert result.metrics["reward/by_text"] == 3.0
    assert result.metrics["reward/timeouts"] == 1.0


def test_the_config_sets_the_timeout_and_the_score_of_a_hung_row():
    overrides = ["data.path=d.jsonl", "reward.functions=[test_rewards_runner:by_text]"]
    overrides += ["reward.timeout=0.5", "reward.timeout_score=-1"]
    runner = build_rewards(load_config(None, overrides), task=None)
    result = _score(runner, ["ab", "hang"])
    _close(result.per_fn[:, 0], [2.0, -1.0])
    assert result.metrics["reward/timeouts"] == 1.0


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_exception_stops_naming_function_and_sample(timeout_s):
    runner = RewardRunner([("by_text", by_text, 1.0)], timeout_s=timeout_s)
    with pytest.raises(RewardError, match=r"reward 'by_text' failed on sample 2: KeyError"):
        _score(runner, ["a", "b", "boom", "c"])


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_exception_scored_none_and_counted(timeout_s):
    runner = RewardRunner([("by_text", by_text, 1.0)], timeout_s=timeout_s, on_error="none")
    result = _score(runner, ["a", "boom", "abc", "boom"])
    _close(result.total, [1.0, NAN, 3.0, NAN])
    assert result.metrics["reward/errors"] == 2.0


@pytest.mark.parametrize("timeout_s", [None, 5.0])
@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([1.0], r"returned 1 values for 2 completions"),
        ([1.0, "high"], r"returned 'high' \(str\) for sample 1; expected a float or None"),
        ([1.0, [2.0]], r"returned \[2.0\] \(list\) for sample 1"),
        (0.5, r"returned float; expected a list of 2 floats or None"),
        ("11", r"returned str"),
    ],
)
def test_bad_return_values_stop_with_clear_message(timeout_s, returned, message):
    runner = RewardRunner([("bad", lambda p, c, **k: returned, 1.0)], timeout_s=timeout_s)
    with pytest.raises(RewardError, match="reward 'bad' " + message):
        _score(runner, ["a", "b"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_error"):
        RewardRunner([("ones", ones, 1.0)], on_error="skip")
    with pytest.raises(ValueError, match="unique"):
        RewardRunner([("ones", ones, 1.0), ("ones", ones, 1.0)])
    runner = RewardRunner([("ones", ones, 1.0)], timeout_s=None)
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2 completions"):
        _score(runner, ["a", "b"], answer=["1"])


def _counting(calls):
    """A reward whose score is how many batches this process has scored, kept in `calls`."""

    def fn(prompts, completions, **columns):
        calls.append(len(completions))
        return [float(len(calls))] * len(completions)

    return fn


def test_the_worker_keeps_its_state_across_batches_and_is_replaced_after_a_hang():
    calls = []  # grows in the worker only; the parent's list stays empty
    runner = RewardRunner(
        [("calls", _counting(calls), 1.0), ("by_text", by_text, 1.0)], timeout_s=0.5
    )
    with runner:
        _close(_score(runner, ["a"]).per_fn, [[1.0, 1.0]])
        _close(_score(runner, ["ab", "c"]).per_fn, [[2.0, 2.0], [2.0, 1.0]])
        # the hang kills the worker after "calls" scored the batch, and each worker forked
        # for the per-row calls starts from the parent's empty list
        hung = _score(runner, ["hang", "abc"])
        _close(hung.per_fn, [[3.0, NAN], [3.0, 3.0]])
        assert hung.metrics["reward/timeouts"] == 1.0
        _close(_score(runner, ["abcd"]).per_fn, [[1.0, 4.0]])
        _close(_score(runner, ["ab"]).per_fn, [[2.0, 2.0]])
    assert calls == []


def warns_on_bad(prompts, completions, **columns):
    """1.0 per row, and a RuntimeWarning for each row whose text starts with "bad"."""
    for text in completions:
        if text.startswith("bad"):
            warnings.warn(f"cannot read {text!r}", RuntimeWarning, stacklevel=2)
    return [1.0] * len(completions)


warns_on_bad.rowwise = True


def _warned(fn, *batches, timeout_s):
    """The warnings said while a runner of `fn` scores each batch of completions in turn."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with RewardRunner([("warns", fn, 1.0)], timeout_s=timeout_s) as runner:
            for completions in batches:
                _close(_score(runner, completions).total, [1.0] * len(completions))
    return [(w.category, str(w.message)) for w in caught]


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_a_rowwise_reward_warning_is_said_with_its_row_in_the_batch(timeout_s):
    # the reward sees one row per call; the runner says where that row is in the batch
    said = _warned(warns_on_bad, ["a", "b", "bad", "c"], timeout_s=timeout_s)
    assert said == [(RuntimeWarning, "reward 'warns' on row 2 of 4: cannot read 'bad'")]


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_a_rowwise_warning_is_said_once_a_run_naming_every_row_that_said_it(timeout_s):
    batches = [["bad", "a", "bad", "bad-2"], ["bad", "bad-2", "bad-3"]]
    assert _warned(warns_on_bad, *batches, timeout_s=timeout_s) == [
        (RuntimeWarning, "reward 'warns' on rows 0, 2 of 4: cannot read 'bad'"),
        (RuntimeWarning, "reward 'warns' on row 3 of 4: cannot read 'bad-2'"),
        (RuntimeWarning, "reward 'warns' on row 2 of 3: cannot read 'bad-3'"),
    ]


def test_a_rowwise_warning_names_at_most_five_rows():
    said = _warned(warns_on_bad, ["bad"] * 8, timeout_s=None)
    assert said == [
        (RuntimeWarning, "reward 'warns' on rows 0, 1, 2, 3, 4 and 3 more of 8: cannot read 'bad'")
    ]


def test_a_batched_reward_called_row_by_row_after_a_failure_warns_with_its_rows():
    def fails_on_the_batch(prompts, completions, **columns):
        if len(completions) > 1:
            raise ValueError("compares rows")
        return warns_on_bad(prompts, completions, **columns)

    failed, *said = _warned(fails_on_the_batch, ["a", "bad", "b"], timeout_s=None)
    assert failed[1].startswith("reward 'warns' failed on a whole batch (ValueError")
    assert said == [(RuntimeWarning, "reward 'warns' on row 1 of 3: cannot read 'bad'")]


def test_a_batched_reward_warning_is_left_as_the_reward_said_it():
    def batched(prompts, completions, **columns):
        return warns_on_bad(prompts, completions, **columns)

    said = _warned(batched, ["a", "bad"], timeout_s=None)
    assert said == [(RuntimeWarning, "cannot read 'bad'")]


def test_a_batch_stopped_by_an_error_leaves_no_outcomes_for_the_next():
    def bad_on_x(prompts, completions, **columns):
        return ["x"] if completions == ["x"] else [1.0] * len(completions)

    with RewardRunner([("bad", bad_on_x, 1.0), ("by_text", by_text, 1.0)]) as runner:
        with pytest.raises(RewardError, match="reward 'bad' returned 'x'"):
            _score(runner, ["x"])
        _close(_score(runner, ["abc", "de"]).per_fn, [[1.0, 3.0], [1.0, 2.0]])


def _pid_is_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_close_stops_the_worker_and_a_later_score_forks_a_new_one():
    runner = RewardRunner([("pid", lambda p, c, **k: [float(os.getpid())] * len(c), 1.0)])
    with runner:
        first = int(_score(runner, ["a"]).total[0])
        assert first != os.getpid()
        assert int(_score(runner, ["b", "c"]).total[1]) == first
        assert _pid_is_running(first)
    assert not _pid_is_running(first)
    second = int(_score(runner, ["a"]).total[0])
    assert second not in (first, os.getpid())
    runner.close()
    assert not _pid_is_running(second)
    runner.close()  # closing twice is harmless


def exits_on_die(prompts, completions, **columns):
    if "die" in completions:
        os._exit(3)
    return [float(len(text)) for text in completions]


def test_a_dead_worker_fails_its_row_and_is_replaced():
    with RewardRunner([("exits", exits_on_die, 1.0)], on_error="none") as runner:
        result = _score(runner, ["ab", "die", "abc"])
        _close(result.total, [2.0, NAN, 3.0])
        assert result.metrics["reward/errors"] == 1.0
        _close(_score(runner, ["abcd"]).total, [4.0])
    died = r"'exits' failed on sample 1: worker process died \(exit code 3\)"
    with (
        RewardRunner([("exits", exits_on_die, 1.0)]) as runner,
        pytest.raises(RewardError, match=died),
    ):
        _score(runner, ["ab", "die"])


class _InProcessPid:
    """The pid of the process that calls it; marked to run in the trainer's process."""

    runs_in_process = True

    def __call__(self, prompts, completions, **columns):
        return [float(os.getpid())] * len(completions)

    def memory_bytes(self):
        return 1000


def test_a_function_marked_runs_in_process_is_called_here_while_the_others_use_the_worker():
    in_worker = lambda p, c, **k: [float(os.getpid())] * len(c)  # noqa: E731
    fns = [("a", in_worker, 1.0), ("here", _InProcessPid(), 1.0), ("b", in_worker, 1.0)]
    with RewardRunner(fns, timeout_s=5.0) as runner:
        result = _score(runner, ["x", "y"])
        here, worker = float(os.getpid()), float(runner._worker.process.pid)
        _close(result.per_fn, [[worker, here, worker]] * 2)
        assert worker != here
        assert runner.memory_bytes() == 1000  # only the functions that hold memory count
    with RewardRunner([("here", _InProcessPid(), 1.0)], timeout_s=5.0) as runner:
        _close(_score(runner, ["x"]).total, [float(os.getpid())])
        assert runner._worker is None  # nothing to fork for


def uses_cuda_in_the_worker(prompts, completions, **columns):
    # what torch raises in a forked child of a process that initialised CUDA
    raise RuntimeError(
        "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you "
        "must use the 'spawn' start method"
    )


def test_a_reward_that_touches_cuda_in_the_forked_worker_stops_with_one_line_saying_why():
    runner = RewardRunner(
        [("on_gpu", uses_cuda_in_the_worker, 1.0)], timeout_s=5.0, on_error="none"
    )
    with pytest.raises(RewardError) as stopped:
        _score(runner, ["a", "b"])
    message = str(stopped.value)
    assert "\n" not in message and "'on_gpu' uses CUDA" in message
    assert "reward.timeout=null" in message


def too_big(prompts, completions, **columns):
    """10**400 (an int no float holds) for the completion "big", else 1.0."""
    return [10**400 if text == "big" else 1.0 for text in completions]


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_an_int_too_large_for_a_float_is_a_reward_error_under_the_error_policy(timeout_s):
    too_large = (
        r"reward 'too_big' failed on sample 1: reward 'too_big' returned a number of about 401 "
        r"digits \(int\), too large for a float"
    )
    runner = RewardRunner([("too_big", too_big, 1.0)], timeout_s=timeout_s, on_error="raise")
    with runner, pytest.raises(RewardError, match=too_large):
        _score(runner, ["a", "big", "c"])
    # under on_error="none" the row is an error, unscored; the others score
    runner = RewardRunner([("too_big", too_big, 1.0)], timeout_s=timeout_s, on_error="none")
    with runner:
        result = _score(runner, ["a", "big", "c"])
        assert result.per_fn[:, 0].isnan().tolist() == [False, True, False]
        assert result.metrics["reward/errors"] == 1.0
        _close(_score(runner, ["a", "c"]).total, [1.0, 1.0])


@pytest.mark.parametrize("timeout_s", [None, 5.0])
@pytest.mark.parametrize(
    ("returned", "kind"),
    [
        ({1.0, 2.0}, "set"),
        (frozenset({1.0, 2.0}), "frozenset"),
        ({1.0: 0, 2.0: 0}.keys(), "dict_keys"),
        ({0: 1.0, 1: 2.0}.values(), "dict_values"),
        ({1.0: 2.0}.items(), "dict_items"),
        ({0: 1.0, 1: 2.0}, "dict"),
    ],
    ids=["set", "frozenset", "dict_keys", "dict_values", "dict_items", "dict"],
)
def test_an_unordered_container_of_scores_is_a_reward_error(timeout_s, returned, kind):
    runner = RewardRunner([("unordered", lambda p, c, **k: returned, 1.0)], timeout_s=timeout_s)
    with runner, pytest.raises(RewardError, match=rf"reward 'unordered' returned {kind}\b"):
        _score(runner, ["a", "b"])


@pytest.mark.parametrize(
    "returned",
    [
        (1.0, 2.0),
        [1, 2.0],
        np.array([1.0, 2.0]),
        torch.tensor([1.0, 2.0]),
        (x for x in (1.0, 2.0)),
        map(float, (1, 2)),
    ],
    ids=["tuple", "list", "numpy", "tensor", "generator", "map"],
)
def test_ordered_scores_of_any_sequence_array_or_iterator_are_read(returned):
    runner = RewardRunner([("ordered", lambda p, c, **k: returned, 1.0)], timeout_s=None)
    _close(_score(runner, ["a", "b"]).total, [1.0, 2.0])


def test_the_length_penalty_is_taken_against_the_runs_own_limit():
    overrides = ["data.path=d.jsonl", "reward.functions=[length]", "rollout.max_new_tokens=64"]
    runner = build_rewards(load_config(None, overrides), task=None)
    result = _score(runner, ["a", "b"], completion_lengths=[32, 100], max_len=[1, 1])
    _close(result.per_fn[:, 0], [-0.5, -1.0])  # a column of the same name as a setting: ignored


def test_overlong_by_name_points_to_its_settings():
    overrides = ["data.path=d.jsonl", "reward.functions=[correct, overlong]"]
    with pytest.raises(UserError, match="overlong is set by reward.overlong_buffer"):
        build_rewards(load_config(None, overrides), task=None)


@pytest.mark.parametrize("name", ["mean", "std", "timeouts", "errors", "slowest_row_s"])
def test_a_reward_named_as_a_metric_of_the_trainers_is_refused(name):
    """Its mean would be logged under reward/<name>, which the trainer's own value replaces."""
    with pytest.raises(UserError, match=rf"^reward '{name}': its metric would be reward/{name}, "):
        RewardRunner([(name, lambda p, c, **k: [0.5] * len(c), 1.0)], timeout_s=None)
