import math
import warnings
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from oncurve.data.tasks import get_task
from oncurve.rewards.countdown import check_equation, countdown_reward, evaluate_expression
from oncurve.rewards.registry import resolve_reward
from oncurve.rewards.runner import RewardRunner

NUMBERS = [3, 7, 25, 50]

CHECK_CASES = [
    # (expression, target, expected)
    ("(50 - 25) * 3 + 7", 82, True),
    ("(50-25)*3+7 = 82", 82, True),
    ("50 / 25 * 3 * 7", 42, True),
    ("(3 + 7) / (50 / 25) + 0 * 0", 5, False),  # extra numbers
    ("(50 - 25) * 3 + 7", 81, False),  # wrong value
    ("(50 - 25) * 3 + 7 = 81", 81, False),  # claims the target, value differs
    ("(50 - 25) * 3", 75, False),  # 7 unused
    ("(50 - 25) * 3 + 7 + 7", 89, False),  # 7 used twice
    ("(50 - 25) * 3 + 8", 83, False),  # a number not given
    ("3 * 7 + 25 + 50", 96, True),
    ("(7 - 3) * (50 - 25) * 2", 200, False),  # 3 unused, 2 not given
    ("(50 - 3) * 7 / 25", 13, False),  # 329/25 is not 13 (no rounding)
    ("3 ** 7 + 25 + 50", 2262, False),  # power not allowed
    ("-3 + 7 + 25 + 50", 79, False),  # unary minus not allowed
    ("3.0 * 7 + 25 + 50", 96, False),  # floats not allowed
    ("(50 // 25) * 3 * 7", 42, False),  # floor division not allowed
    ("50 / (25 - 25) + 3 + 7", 10, False),  # division by zero
    ("(50 - 25 * 3 + 7", 82, False),  # malformed
    ("", 82, False),
]


@pytest.mark.parametrize(("expression", "target", "expected"), CHECK_CASES)
def test_check_equation(expression: str, target: int, expected: bool) -> None:
    assert check_equation(expression, NUMBERS, target) is expected


def test_exact_fractions() -> None:
    # 7 / 3 is not rounded: (7/3) * 3 * ... stays exact
    assert evaluate_expression("7 / 3 * 3") == (Fraction(7), [7, 3, 3])
    assert check_equation("(25 - 7 / 7) * 2", [25, 7, 7, 2], 48)


@pytest.mark.parametrize(
    "malicious",
    [
        "__import__('os').system('touch /tmp/oncurve_pwned')",
        "[x for x in ().__class__.__base__.__subclasses__()]",
        "exec('1')",
        "open('/etc/passwd').read()",
        "(" * 5000 + "1" + ")" * 5000,
        "9" * 10000,
    ],
)
def test_malicious_inputs_score_zero_and_run_nothing(malicious: str, tmp_path) -> None:
    completion = f"<answer>{malicious}</answer>"
    scores = countdown_reward(["p"], [completion], numbers=["3,7,25,50"], target=["82"])
    assert scores == [0.0]
    assert evaluate_expression(malicious) is None
    import os

    assert not os.path.exists("/tmp/oncurve_pwned")


def test_countdown_reward_reads_answer_tags_and_columns() -> None:
    completions = [
        "<think>try</think><answer>(50 - 25) * 3 + 7</answer>",
        "\\boxed{(50 - 25) * 3 + 7}",
        "(50 - 25) * 3 + 7",  # no answer tags or box: nothing to check
        "<answer>(50 - 25) * 3 + 7</answer>",
    ]
    scores = countdown_reward(
        ["p"] * 4,
        completions,
        numbers=["3,7,25,50", [3, 7, 25, 50], "3,7,25,50", "[3, 7, 25, 49]"],
        target=["82", 82, "82", "82"],
    )
    assert scores == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="'numbers' and 'target'"):
        countdown_reward(["p"], ["x"], answer=["1"])


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        # the last equation stated is the answer, as `correct` reads a box after the tags
        ("<answer>(50 - 25) * 3 + 7</answer> or rather \\boxed{50 + 25 + 7}", 0.0),
        ("<answer>50 + 25 + 7</answer> or rather \\boxed{(50 - 25) * 3 + 7}", 1.0),
        ("\\boxed{50 + 25 + 7} so <answer>(50 - 25) * 3 + 7</answer>", 1.0),
        ("\\boxed{(50 - 25) * 3 + 7} so <answer>50 + 25 + 7</answer>", 0.0),
    ],
)
def test_the_last_equation_stated_is_the_answer(completion: str, score: float) -> None:
    assert countdown_reward(["p"], [completion], numbers=["3,7,25,50"], target=["82"]) == [score]


def test_task_is_seeded_solvable_and_splits_disjoint() -> None:
    task = get_task("countdown")
    train = task.examples("train", 300, seed=1)
    test = task.examples("test", 100, seed=1)
    assert train == task.examples("train", 300, seed=1)
    assert train != task.examples("train", 300, seed=2)
    key = lambda r: (tuple(sorted(r["numbers"].split(","))), r["target"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    rows = train + test
    # the stored solution of every generated problem passes the checker
    solutions = [f"<answer>{r['answer']}</answer>" for r in rows]
    scores = task.reward_fns()["correct"](
        [r["prompt"] for r in rows],
        solutions,
        numbers=[r["numbers"] for r in rows],
        target=[r["target"] for r in rows],
    )
    assert scores == [1.0] * len(rows)
    assert {len(r["numbers"].split(",")) for r in rows} == {3, 4}
    assert all(r["target"] in r["prompt"] for r in rows)


# 3 * 7 + 25 = 46 with the numbers 3, 7, 25: the right answer of every row below.
RIGHT = "<answer>3 * 7 + 25</answer>"
GOOD_NUMBERS = "3,7,25"
GOOD_TARGET = "46"

# (column, value) read as the integers 3, 7, 25 / 46: the row scores 1.0 without a warning.
READABLE_COLUMNS = [
    ("target", "46.0"),
    ("target", 46.0),
    ("target", " 46 "),
    ("target", np.int64(46)),
    ("target", np.float64(46.0)),
    ("numbers", "[3.0, 7.0, 25.0]"),
    ("numbers", "[3, 7, 25]"),
    ("numbers", "(3, 7, 25)"),
    ("numbers", "3.0, 7.0, 25.0"),
    ("numbers", "3 7 25"),
    ("numbers", [3.0, 7.0, 25.0]),
    ("numbers", ("3", "7", "25")),
    ("numbers", np.array([3, 7, 25])),
]

# (column, value) that cannot be read as an integer / a list of integers: the row is unscored.
BAD_COLUMNS = [
    ("target", 46.5),
    ("target", "46.5"),
    ("target", math.nan),
    ("target", "nan"),
    ("target", math.inf),
    ("target", None),
    ("target", True),
    ("target", ""),
    ("target", "forty-six"),
    ("target", "4_6"),
    ("target", [46]),
    ("numbers", None),
    ("numbers", []),
    ("numbers", "[]"),
    ("numbers", ""),
    ("numbers", "[3, 7, 25.5]"),
    ("numbers", "3, 7, 25.5"),
    ("numbers", [3, 7, 25.5]),
    ("numbers", [3, 7, None]),
    ("numbers", [3, True, 25]),
    ("numbers", [3, 7, math.nan]),
    ("numbers", "[3, 7"),
    ("numbers", "[3, [7], 25]"),
    ("numbers", "three, seven"),
    ("numbers", 46),
    ("numbers", {3, 7, 25}),
]


def _countdown(rows: list[tuple[Any, Any]]) -> tuple[list[float | None], list[str]]:
    """The scores of RIGHT on each (numbers, target) row, scored by the runner as in training,
    and the RuntimeWarnings countdown said (not the runner's of rows no reward scored)."""
    countdown = resolve_reward("countdown")[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with RewardRunner([("countdown", countdown, 1.0)], timeout_s=None) as runner:
            result = runner.score(
                ["p"] * len(rows),
                [RIGHT] * len(rows),
                {
                    "numbers": [numbers for numbers, _ in rows],
                    "target": [target for _, target in rows],
                },
            )
    scores = [None if math.isnan(v) else v for v in result.per_fn[:, 0].tolist()]
    return scores, _countdown_warnings(caught)


def _countdown_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    found = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return [message for message in found if message.startswith("reward 'countdown'")]


def _row(column: str, value: Any) -> tuple[Any, Any]:
    return (value, GOOD_TARGET) if column == "numbers" else (GOOD_NUMBERS, value)


def _ids(table: list[tuple[str, Any]]) -> list[str]:
    return [f"{column}={value!r}" for column, value in table]


@pytest.mark.parametrize(("column", "value"), READABLE_COLUMNS, ids=_ids(READABLE_COLUMNS))
def test_integers_written_as_floats_or_lists_in_text_are_read_as_integers(
    column: str, value: Any
) -> None:
    scores, warned = _countdown([_row(column, value), (GOOD_NUMBERS, GOOD_TARGET)])
    assert scores == [1.0, 1.0]
    assert warned == []


@pytest.mark.parametrize(("column", "value"), BAD_COLUMNS, ids=_ids(BAD_COLUMNS))
def test_a_malformed_column_leaves_its_row_unscored_with_one_warning(
    column: str, value: Any
) -> None:
    # the bad row is row 1; the right row beside it still scores 1.0
    scores, warned = _countdown([(GOOD_NUMBERS, GOOD_TARGET), _row(column, value)])
    assert scores == [1.0, None]
    assert len(warned) == 1
    prefix = f"reward 'countdown' on row 1 of 2: a row left unscored, its {column} column "
    assert warned[0].startswith(prefix + "unreadable: ")
    assert "row 0" not in warned[0]


def test_the_list_in_text_is_not_read_digit_by_digit() -> None:
    # "[3.0, 7.0, 25.0]" is 3, 7, 25, not 3, 0, 7, 0, 25, 0: an answer using the zeros is wrong
    with_zeros = "<answer>3 * 7 + 25 + 0 + 0 + 0</answer>"
    scores = countdown_reward(
        ["p"] * 2, [with_zeros, RIGHT], numbers=["[3.0, 7.0, 25.0]"] * 2, target=[46, 46]
    )
    assert scores == [0.0, 1.0]


def test_each_bad_row_warns_naming_its_row_in_the_batch() -> None:
    rows = [(None, 46), (GOOD_NUMBERS, 46), (GOOD_NUMBERS, 46.5), ("[3, 7, 25]", "46.0")]
    scores, warned = _countdown(rows)
    assert scores == [None, 1.0, None, 1.0]
    assert warned == [
        "reward 'countdown' on row 0 of 4: a row left unscored, its numbers column unreadable: "
        "None (NoneType) is not a list of integers",
        "reward 'countdown' on row 2 of 4: a row left unscored, its target column unreadable: "
        "46.5 is not an integer",
    ]


def test_called_on_several_rows_it_warns_once_per_bad_row_naming_column_and_value() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = countdown_reward(
            ["p"] * 3, [RIGHT] * 3, numbers=[None, GOOD_NUMBERS, "[3, 7"], target=[46, 46, 46]
        )
    assert scores == [None, 1.0, None]
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            RuntimeWarning,
            "a row left unscored, its numbers column unreadable: None (NoneType) is not a list "
            "of integers",
        ),
        (
            RuntimeWarning,
            "a row left unscored, its numbers column unreadable: '[3, 7' is not a list of integers",
        ),
    ]


@pytest.mark.parametrize(
    ("answer", "numbers"),
    [
        ("3 \\times 7 + 25", [3, 7, 25]),
        ("3\\times7+25", [3, 7, 25]),
        ("3 \\cdot 7 + 25", [3, 7, 25]),
        ("3 × 7 + 25", [3, 7, 25]),
        ("3 · 7 + 25", [3, 7, 25]),
        ("\\left(3 \\times 7\\right) + 25", [3, 7, 25]),
        ("3\\,\\times\\,7 + 25", [3, 7, 25]),
        ("3 \\times 7 + 25 = 46", [3, 7, 25]),
        ("(3 \\times 7 \\div 7) \\times 7 + 25", [3, 7, 7, 7, 25]),
        ("(3 × 7 ÷ 7) × 7 + 25", [3, 7, 7, 7, 25]),
        ("\\left( 21 \\div 7 \\right) \\cdot 7 + 25", [21, 7, 7, 25]),
    ],
)
def test_latex_and_unicode_multiplication_and_division_signs_are_read(
    answer: str, numbers: list[int]
) -> None:
    assert check_equation(answer, numbers, 46) is True
    boxed = f"\\boxed{{{answer}}}"
    assert countdown_reward(["p"], [boxed], numbers=[numbers], target=[46]) == [1.0]
    tagged = f"<answer>{answer}</answer>"
    assert countdown_reward(["p"], [tagged], numbers=[numbers], target=[46]) == [1.0]


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("7 \\div 2 \\times 2", Fraction(7)),
        ("7 ÷ 2", Fraction(7, 2)),
        ("\\left(1 + 2\\right) \\cdot 3", Fraction(9)),
    ],
)
def test_signs_are_operators_of_the_same_exact_arithmetic(answer: str, value: Fraction) -> None:
    result = evaluate_expression(answer)
    assert result is not None and result[0] == value


@pytest.mark.parametrize(
    "answer",
    [
        "3 \\times\\times 7 + 25",  # becomes 3 ** 7: power is still refused
        "3 \\timesfoo 7 + 25",  # not the \times command
        "3 \\cdots 7 + 25",  # an ellipsis, not a product
        "3 \\times 7 + \\sqrt{25}",  # other commands still score 0
        "3 x 7 + 25",
    ],
)
def test_other_latex_still_scores_zero(answer: str) -> None:
    assert check_equation(answer, [3, 7, 25], 46) is False


@pytest.mark.filterwarnings("ignore:reward 'countdown' on row:RuntimeWarning")
@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_under_the_runner_a_malformed_row_is_unscored_not_an_error(timeout_s: float | None) -> None:
    # on_error="raise": a raise on data would stop training; the bad rows are left out instead
    countdown = resolve_reward("countdown")[1]
    with RewardRunner([("countdown", countdown, 1.0)], timeout_s=timeout_s) as runner:
        result = runner.score(
            ["p"] * 4,
            [RIGHT] * 4,
            {
                "numbers": ["[3.0, 7.0, 25.0]", None, GOOD_NUMBERS, GOOD_NUMBERS],
                "target": [46.0, 46, "46.5", math.nan],
            },
        )
    assert result.per_fn[:, 0].tolist()[0] == 1.0
    assert all(math.isnan(v) for v in result.per_fn[1:, 0].tolist())
    assert result.metrics["reward/errors"] == 0.0
    assert result.metrics["reward/countdown"] == 1.0


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_under_the_runner_each_warning_names_the_row_in_the_batch_and_its_column_and_value(
    timeout_s: float | None,
) -> None:
    """The runner calls countdown one row at a time: its warnings name the row's column and
    value, and the runner names the row's place in the batch."""
    countdown = resolve_reward("countdown")[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with RewardRunner([("countdown", countdown, 1.0)], timeout_s=timeout_s) as runner:
            result = runner.score(
                ["p"] * 4,
                [RIGHT] * 4,
                {
                    "numbers": [GOOD_NUMBERS, GOOD_NUMBERS, None, GOOD_NUMBERS],
                    "target": [GOOD_TARGET, "46.5", GOOD_TARGET, GOOD_TARGET],
                },
            )
    warned = _countdown_warnings(caught)
    assert warned == [
        "reward 'countdown' on row 1 of 4: a row left unscored, its target column unreadable: "
        "'46.5' is not an integer",
        "reward 'countdown' on row 2 of 4: a row left unscored, its numbers column unreadable: "
        "None (NoneType) is not a list of integers",
    ]
    scores = result.per_fn[:, 0].tolist()
    assert scores[0] == scores[3] == 1.0 and math.isnan(scores[1]) and math.isnan(scores[2])


def test_the_test_split_holds_each_problem_once() -> None:
    rows = get_task("countdown").examples("test", 500, seed=0)
    problems = {(tuple(sorted(row["numbers"].split(","))), row["target"]) for row in rows}
    assert len(problems) == 500  # the same numbers in another order are the same problem


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"counts": []}, "counts must be a list of whole numbers in [2, 6], got []"),
        ({"counts": [1]}, "counts must be a list of whole numbers in [2, 6], got [1]"),
        ({"counts": [3.5]}, "counts must be a list of whole numbers in [2, 6], got [3.5]"),
        ({"max_number": 0}, "max_number must be a whole number in [2, 1000], got 0"),
        ({"max_number": 1, "counts": [3]}, "max_number must be a whole number in [2, 1000], got 1"),
    ],
)
def test_task_options_that_make_no_problems_are_one_line(options: dict, why: str) -> None:
    """Options that would crash the draw (an empty list, no numbers to pick from) or make
    trivial problems (one number: its target is itself) name the option."""
    from oncurve.errors import UserError

    with pytest.raises(UserError) as refused:
        get_task("countdown", options)
    assert str(refused.value) == f"data.task_options {options} do not fit task countdown: {why}"
