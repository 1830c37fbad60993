import pytest

from oncurve.data.tasks import get_task
from oncurve.errors import UserError
from oncurve.rewards.runner import RewardRunner

pytest.importorskip("reasoning_gym", reason="reasoning-gym (extra `gym`) not installed")


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting"])
def test_gym_task_scores_with_dataset_scorer(dataset):
    task = get_task(f"gym:{dataset}")
    train = task.examples("train", 40, seed=0)
    test = task.examples("test", 10, seed=0)
    assert len(train) == 40 and len(test) == 10
    assert train == task.examples("train", 40, seed=0)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all("<answer>" in r["prompt"] for r in train)

    rows = train[:4]
    completions = [
        f"<think>ok</think><answer>{rows[0]['answer']}</answer>",
        f"<answer>{rows[1]['answer']}</answer>",
        f"the answer is {rows[2]['answer']}",  # untagged: scored 0.0, not unscored (None)
        "<answer>not a number</answer>",
    ]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    runner = RewardRunner([(n, fn, 1.0) for n, fn in task.reward_fns().items()], timeout_s=5.0)
    result = runner.score([r["prompt"] for r in rows], completions, columns)
    assert result.total.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_unknown_gym_dataset_names_where_it_was_given_and_lists_choices():
    with pytest.raises(
        ValueError, match=r"^data.task: unknown reasoning-gym dataset 'no_such_set'; .*leg_counting"
    ):
        get_task("gym:no_such_set")
    with pytest.raises(ValueError, match=r"^--task: unknown reasoning-gym dataset 'no_such_set'"):
        get_task("gym:no_such_set", {"size": 3}, given="--task")


def test_settings_reasoning_gym_refuses_are_one_line_naming_the_options(monkeypatch):
    """reasoning-gym checks a dataset's settings with `assert`: its words (or, for a bare
    assert, that its check failed) name data.task_options and the task."""
    with pytest.raises(UserError) as refused:
        get_task("gym:basic_arithmetic", {"min_terms": 0})
    assert str(refused.value) == (
        "data.task_options {'min_terms': 0} do not fit task gym:basic_arithmetic: "
        "min_terms must be positive"
    )

    import reasoning_gym

    def bare_assert(*args, **kwargs):
        raise AssertionError

    monkeypatch.setattr(reasoning_gym, "create_dataset", bare_assert)
    with pytest.raises(UserError) as refused:
        get_task("gym:leg_counting", {"min_animals": 9})
    assert str(refused.value) == (
        "data.task_options {'min_animals': 9} do not fit task gym:leg_counting: "
        "reasoning-gym's check of the dataset's settings failed"
    )


def test_unknown_task_lists_choices():
    with pytest.raises(
        ValueError, match=r"unknown task 'nope'; choices: arith, countdown, sums, code, gym:"
    ):
        get_task("nope")


def test_items_reasoning_gym_cannot_make_are_skipped_with_a_warning(monkeypatch):
    """reasoning-gym's generators fail on rare items (basic_arithmetic: a division by zero,
    about one in 40,000): the task draws past them and says how many it skipped."""
    import reasoning_gym

    made = reasoning_gym.create_dataset

    class Failing:
        def __init__(self, data):
            self.data = data

        def __getitem__(self, index):
            if index in (2, 5):
                raise ZeroDivisionError("integer division or modulo by zero")
            return self.data[index]

    monkeypatch.setattr(reasoning_gym, "create_dataset", lambda *a, **k: Failing(made(*a, **k)))
    task = get_task("gym:basic_arithmetic")
    with pytest.warns(RuntimeWarning, match=r"^gym:basic_arithmetic: reasoning-gym could not make"):
        rows = task.examples("train", 20, seed=0)
    monkeypatch.setattr(reasoning_gym, "create_dataset", made)
    items = made("basic_arithmetic", seed=0, size=10)
    skipped = {items[2]["question"], items[5]["question"]}
    whole = task.examples("train", 40, seed=0)
    kept = [r for r in whole if r["gym_entry"]["question"] not in skipped]
    assert len(kept) < len(whole) and rows == kept[:20]
