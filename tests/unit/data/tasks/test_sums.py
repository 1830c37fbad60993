"""The `sums` task of the SmolLM2 recipe: splits, rows and rewards."""

from __future__ import annotations

import pytest

from oncurve.config import load_config
from oncurve.data.prompts import load_prompts
from oncurve.data.tasks import get_task
from oncurve.data.tasks.base import TooFewProblems, hash_split
from oncurve.data.tasks.sums import prompt
from oncurve.rewards.format import boxed_format_reward


def test_splits_are_disjoint_seed_independent_and_the_test_split_is_all_distinct():
    task = get_task("sums")
    test = task.examples("test", 43, seed=0)
    assert len({r["prompt"] for r in test}) == 43
    assert {r["prompt"] for r in test} == {r["prompt"] for r in task.examples("test", 43, 7)}
    train = task.examples("train", 2000, seed=3)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(hash_split(r["prompt"]) == "train" for r in train)
    with pytest.raises(ValueError, match="only 43 test problems"):
        task.examples("test", 44, 0)


def test_rows_hold_the_sum_and_the_rewards_score_a_boxed_right_answer():
    task = get_task("sums")
    row = task.examples("train", 1, seed=0)[0]
    a, b = (int(x) for x in row["prompt"][len("What is ") :].split("?")[0].split(" + "))
    assert row["answer"] == str(a + b)
    fns = task.reward_fns()
    completions = [f"{a} + {b} = \\boxed{{{a + b}}}", f"It is {a + b}.", "\\boxed{}", "\\boxed{-1}"]
    answers = [row["answer"]] * 4
    assert fns["correct"]([row["prompt"]] * 4, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0]
    assert fns["boxed"]([row["prompt"]] * 4, completions) == [1.0, 0.0, 0.0, 1.0]
    assert task.reward_weights == {"correct": 1.0, "boxed": 0.2}


def test_boxed_format_needs_a_filled_box():
    assert boxed_format_reward(["p"] * 3, ["\\boxed{15}", "\\boxed{}", "boxed{3}"]) == [1, 0, 0]


def test_a_task_whose_search_finds_few_test_problems_evaluates_the_ones_it_found():
    """Countdown with numbers up to 6 has fewer distinct test problems than 500: the held-out
    set is the ones the seeded search found, each once."""
    options = "data.task_options={counts: [3, 4], max_number: 6}"
    _, held_out, _ = load_prompts(load_config(None, ["data.task=countdown", options]))
    problems = {(row["numbers"], row["target"]) for row in held_out}
    assert 0 < len(held_out) < 500 and len(problems) == len(held_out)


@pytest.mark.parametrize(("task", "pool"), [("sums", 43), ("code", 25)])
@pytest.mark.parametrize("asked", [[], ["eval.num_prompts=60"]])
def test_a_held_out_set_larger_than_the_test_split_is_the_whole_split(task, pool, asked):
    _, held_out, _ = load_prompts(load_config(None, [f"data.task={task}", *asked]))
    assert len(held_out) == pool
    assert len({row["prompt"] for row in held_out}) == pool


def test_no_held_out_problem_has_its_commuted_twin_in_training():
    """`What is 3 + 4?` and `What is 4 + 3?` are one problem to learn: a held-out sum whose
    operands swapped are a training prompt would measure recall, not addition."""
    task = get_task("sums")
    train = {r["prompt"] for r in task.examples("train", 5000, seed=0)}
    with pytest.raises(TooFewProblems) as whole:
        task.examples("test", 500, seed=0)
    for row in whole.value.rows:
        a, b = (int(x) for x in row["prompt"][len("What is ") :].split("?")[0].split(" + "))
        assert prompt(b, a) not in train
