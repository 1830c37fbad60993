"""The `code` task: seeded rows, disjoint splits, hidden tests that its reference solutions pass
and wrong programs fail."""

from __future__ import annotations

import pytest

from oncurve.data.tasks import get_task
from oncurve.data.tasks.base import hash_split
from oncurve.data.tasks.code import TEMPLATES, TESTS_PER_PROBLEM, Problem, problems


def test_splits_are_disjoint_seeded_and_the_test_split_is_all_distinct():
    task = get_task("code")
    n_test = len(problems("test"))
    assert n_test + len(problems("train")) == sum(len(t.params) for t in TEMPLATES)
    test = task.examples("test", n_test, seed=0)
    assert len({r["prompt"] for r in test}) == n_test
    assert {r["prompt"] for r in test} == {r["prompt"] for r in task.examples("test", n_test, 5)}
    train = task.examples("train", 500, seed=3)
    assert train == task.examples("train", 500, seed=3)
    assert train != task.examples("train", 500, seed=4)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(hash_split(r["prompt"]) == "train" for r in train)
    with pytest.raises(ValueError, match=f"only {n_test} test problems"):
        task.examples("test", n_test + 1, 0)


def test_a_row_holds_the_prompt_the_reference_and_its_tests():
    problem = Problem(TEMPLATES[0], 7)  # x plus 7
    assert problem.prompt == (
        "Write a Python function `f(x)` that returns x plus 7. "
        "Reply with the code in a ```python block."
    )
    assert problem.solution == "def f(x):\n    return x + 7\n"
    tests = problem.tests()
    assert tests == Problem(TEMPLATES[0], 7).tests()  # the same tests every time
    assert len(set(tests)) == TESTS_PER_PROBLEM
    for test in tests:
        x = int(test.removeprefix("assert f(").split(")")[0])
        assert test == f"assert f({x}) == {x + 7}"


def passed(program: str, tests: list[str]) -> int:
    """How many of `tests` `program` passes, run in this process: both are the task's own code
    or a trivial function of this file, never a completion."""
    count = 0
    for test in tests:
        namespace: dict = {}
        exec(program, namespace)
        try:
            exec(test, namespace)
        except (AssertionError, TypeError):
            continue
        count += 1
    return count


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.spec)
def test_every_reference_passes_and_no_trivial_function_passes_every_test(template):
    for k in template.params:
        problem = Problem(template, k)
        tests = problem.tests()
        assert passed(problem.solution, tests) == TESTS_PER_PROBLEM, problem.prompt
        # the argument back, or a constant: the tests tell them from the spec
        for body in (template.arg, "0", "1", "True", "False", "''", "[]", repr(k)):
            trivial = f"def f({template.arg}):\n    return {body}\n"
            assert passed(trivial, tests) < TESTS_PER_PROBLEM, (problem.prompt, body)


def test_the_tasks_reward_is_code_tests_as_correct():
    task = get_task("code")
    row = task.examples("train", 1, seed=0)[0]
    ((name, fn),) = task.reward_fns().items()
    assert name == "correct"
    answer = f"Sure:\n```python\n{row['answer']}```"
    assert fn([row["prompt"]] * 2, [answer, "no code"], tests=[row["tests"]] * 2) == [1.0, 0.0]
