from fractions import Fraction

import pytest

from oncurve.rewards.countdown import check_equation, countdown_reward, evaluate_expression
from oncurve.tasks import get_task

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
