"""The curriculum samplers (pass rate, difficulty levels), the tasks' difficulty
levels and options, and the KL warmup: hand-computed numbers, then the trainer's use of them."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from oncurve.algo import warmup_beta
from oncurve.config import load_config
from oncurve.data.curriculum import (
    WINDOW,
    DifficultyCurriculum,
    PassRateCurriculum,
    curriculum_notes,
    draw_rows,
    gather_pass_rates,
    group_pass_rates,
    informative_chance,
    pass_rate_weights,
    rolling_accuracy,
    running_rates,
    steps_up,
)
from oncurve.data.tasks import get_task
from oncurve.data.tasks.arith import ArithTask
from oncurve.data.tasks.base import leveled_examples
from oncurve.data.tasks.countdown import CountdownTask
from oncurve.errors import UserError
from oncurve.loop import trainer
from oncurve.loop import training_step as loop_step
from oncurve.loop.trainer import setup
from oncurve.loop.training_step import training_step

NAN = math.nan


def same(got: torch.Tensor, want: list[float]) -> None:
    """Equal values, NaN where `want` has NaN."""
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), equal_nan=True)


# --- pure functions -------------------------------------------------------------------------


def test_group_pass_rates_average_finite_scores_and_clip_to_the_unit_interval():
    scores = torch.tensor([1, 0, 1, 1, NAN, NAN, NAN, NAN, 1, NAN, 0, 0, 2, 1, 1, 1.0])
    same(group_pass_rates(scores, 4), [0.75, NAN, 1 / 3, 1.0])


def test_running_rates_start_at_the_first_visit_then_move_halfway_in_visit_order():
    rates = torch.tensor([NAN, 0.5, 1.0], dtype=torch.float64)
    got = running_rates(rates, torch.tensor([0, 1, 0]), torch.tensor([0.25, 1.0, 0.75]))
    # row 0: 0.25, then 0.25 + (0.75 - 0.25) / 2; row 1: 0.5 + (1 - 0.5) / 2; row 2 untouched
    same(got, [0.5, 0.75, 1.0])
    same(rates, [NAN, 0.5, 1.0])  # the input is left as it was


def test_pass_rate_weights_are_the_chance_of_a_mixed_group_with_a_floor():
    rates = torch.tensor([NAN, 0.0, 1.0, 0.5, 0.25], dtype=torch.float64)
    # G = 2: 1 - p^2 - (1 - p)^2 = 2 p (1 - p): 0.5 at p = 1/2, 0.375 at p = 1/4
    same(pass_rate_weights(rates, 2, floor=0.1), [1.0, 0.1, 0.1, 0.5, 0.375])
    # G = 8 at p = 1/2: all right or all wrong 2 / 256 of the time
    assert float(informative_chance(torch.tensor([0.5]), 8)) == 1 - 2 / 256


def test_draw_rows_follows_the_weights_and_never_draws_a_zero_weight():
    generator = torch.Generator().manual_seed(0)
    picks = draw_rows(torch.tensor([1.0, 0.0, 3.0]), 4000, generator)  # with replacement
    assert 1 not in picks
    assert picks.count(2) / 4000 == pytest.approx(0.75, abs=0.03)
    distinct = draw_rows(torch.tensor([1.0, 0.0, 3.0, 1.0]), 3, generator)
    assert sorted(distinct) == [0, 2, 3]  # without replacement while enough rows have weight


def test_draw_rows_draws_every_weighted_row_before_any_twice():
    """More draws than rows with weight (a step's dynamic-sampling rounds): the first ones
    are distinct, so a round never holds a prompt twice while others are left."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.tensor([1.0, 2.0, 0.0, 1.0, 4.0])
    for _ in range(50):
        picks = draw_rows(weights, 10, generator)
        assert sorted(picks[:4]) == [0, 1, 3, 4] and 2 not in picks


def test_the_difficulty_level_steps_up_after_a_full_window_at_the_threshold():
    window = [(6.0, 8)] * WINDOW  # 0.75 pooled
    assert rolling_accuracy([(6.0, 8), (2.0, 8)]) == 0.5
    assert math.isnan(rolling_accuracy([(0.0, 0)]))
    assert steps_up(0, 3, window, threshold=0.75)
    assert not steps_up(0, 3, window[1:], threshold=0.75)  # the window is not full
    assert not steps_up(0, 3, window, threshold=0.8)
    assert not steps_up(2, 3, window, threshold=0.75)  # already at the hardest level


def test_kl_warmup_ramps_beta_linearly_then_holds_it():
    assert [warmup_beta(step, 0.04, 4) for step in (1, 2, 4, 9)] == [0.01, 0.02, 0.04, 0.04]
    assert warmup_beta(1, 0.04, 0) == 0.04  # 0: today's constant beta


def test_gather_pass_rates_places_this_ranks_groups_in_the_steps_table():
    visits = [(0, torch.tensor([0.5, NAN])), (2, torch.tensor([1.0, 0.25]))]
    table = gather_pass_rates(visits, rounds=3, mine=slice(2, 4), size=4)
    same(table, [[NAN, NAN, 0.5, NAN], [NAN] * 4, [NAN, NAN, 1.0, 0.25]])


def _gather_rank(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    mine = slice(2 * rank, 2 * rank + 2)
    # rank 0 sampled both rounds, rank 1 only the first (it was full after it)
    visits = [(0, torch.tensor([0.5, 1.0])), (1, torch.tensor([0.0, NAN]))]
    if rank == 1:
        visits = [(0, torch.tensor([0.25, 0.75]))]
    curriculum = PassRateCurriculum(8, seed=0, group_size=2, floor=0.1)
    table = gather_pass_rates(visits, rounds=2, mine=mine, size=4)
    curriculum.record(1, 2, table)
    return {"table": table, "rates": curriculum.rates}


def test_every_rank_records_every_ranks_groups_and_holds_the_same_state(two_ranks):
    ranks = two_ranks.run(_gather_rank)
    want = [[0.5, 1.0, 0.25, 0.75], [0.0, NAN, NAN, NAN]]
    one_process = PassRateCurriculum(8, seed=0, group_size=2, floor=0.1)
    one_process.record(1, 2, torch.tensor(want, dtype=torch.float64))
    for saved in ranks:
        same(saved["table"], want)
        assert torch.equal(saved["rates"].isnan(), one_process.rates.isnan())
        same(saved["rates"], one_process.rates.tolist())


# --- the samplers ---------------------------------------------------------------------------


def test_pass_rate_draws_are_seeded_by_step_and_fresh_across_sampling_rounds():
    curriculum = PassRateCurriculum(50, seed=3, group_size=4, floor=0.1)
    assert curriculum.draw(5, 8) == PassRateCurriculum(50, 3, 4, 0.1).draw(5, 8)
    assert curriculum.draw(5, 8) != curriculum.draw(6, 8)
    assert curriculum.draw(5, 8) != PassRateCurriculum(50, 4, 4, 0.1).draw(5, 8)
    rounds = [curriculum.draw(5, 8, r, 3) for r in range(3)]
    assert len({row for picks in rounds for row in picks}) == 24  # no prompt twice in a step


def test_prompts_solved_by_all_or_none_are_drawn_at_the_floor():
    curriculum = PassRateCurriculum(10, seed=0, group_size=2, floor=0.1)
    curriculum.update(torch.arange(10), torch.tensor([0.0] * 3 + [0.5] + [1.0] * 6))
    draws = [row for step in range(1, 401) for row in curriculum.draw(step, 1)]
    # row 3 has weight 2 * 0.5 * 0.5 = 0.5 against 0.1 for each of the nine others
    assert draws.count(3) / len(draws) == pytest.approx(0.5 / 1.4, abs=0.05)


def test_pass_rate_metrics_count_what_was_set_aside():
    curriculum = PassRateCurriculum(5, seed=0, group_size=2, floor=0.1)
    curriculum.update(torch.tensor([0, 1, 3]), torch.tensor([1.0, 0.0, 0.5]))
    metrics = curriculum.update(torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 0.5, 0.5]))
    # drawn: row 0 solved, row 1 unsolved, row 2 untried, row 3 mixed; after: rows 0 and 1
    assert metrics == {
        "curriculum/solved_frac": 0.25,
        "curriculum/unsolved_frac": 0.25,
        "curriculum/skipped": 2.0,
    }
    same(curriculum.rates, [1.0, 0.0, 0.5, 0.5, NAN])


def test_pass_rate_state_survives_json_exactly():
    curriculum = PassRateCurriculum(6, seed=0, group_size=4, floor=0.1)
    curriculum.update(torch.tensor([4, 1, 4]), torch.tensor([1 / 3, 0.7, 0.1]))
    restored = PassRateCurriculum(6, seed=0, group_size=4, floor=0.1)
    restored.load_state_dict(json.loads(json.dumps(curriculum.state_dict())))
    assert restored.state_dict() == curriculum.state_dict()
    assert restored.draw(7, 3) == curriculum.draw(7, 3)


def test_the_difficulty_curriculum_draws_its_level_and_moves_up_after_a_window():
    curriculum = DifficultyCurriculum([0, 0, 1, 1, 2], seed=0, threshold=0.5)
    assert curriculum.weights().tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    for _ in range(WINDOW - 1):
        metrics = curriculum.update(torch.tensor([0, 1]), torch.tensor([0.25, 1.0]))
    assert metrics == {"curriculum/level": 0.0, "curriculum/accuracy": 0.625}
    assert curriculum.level == 0  # a window not yet full
    restored = DifficultyCurriculum([0, 0, 1, 1, 2], seed=0, threshold=0.5)
    restored.load_state_dict(json.loads(json.dumps(curriculum.state_dict())))
    for sampler in (curriculum, restored):
        metrics = sampler.update(torch.tensor([0, 1]), torch.tensor([0.0, 0.5]))
        assert metrics["curriculum/level"] == 0.0  # the level this step drew from
        assert metrics["curriculum/accuracy"] == (7 * 1.25 + 0.5) / 16
        assert sampler.level == 1 and sampler.window == []
        assert set(sampler.draw(1, 2)) == {2, 3}


def test_a_saved_state_that_does_not_fit_the_rows_is_a_one_line_error_naming_the_setting():
    """A resume that forced other data or another curriculum: the saved state is checked
    against the rows it is loaded for, never indexed past them."""
    six = PassRateCurriculum(6, seed=0, group_size=4, floor=0.1)
    six.update(torch.tensor([0, 5]), torch.tensor([0.5, 1.0]))
    saved = json.loads(json.dumps(six.state_dict()))
    three = PassRateCurriculum(3, seed=0, group_size=4, floor=0.1)
    with pytest.raises(UserError, match=r"^data.curriculum=pass_rate: .* of 6 training rows and "):
        three.load_state_dict(saved)
    fewer_tried = PassRateCurriculum(6, seed=0, group_size=4, floor=0.1)
    fewer_tried.update(torch.tensor([0, 1]), torch.tensor([0.5, 1.0]))  # rows that would fit
    with pytest.raises(UserError, match="of 6 training rows and the run has 3"):
        three.load_state_dict(fewer_tried.state_dict())
    # a state without its row count (older checkpoints) is checked by the rows it names
    with pytest.raises(
        UserError, match="pass rates of more than 3 training rows and the run has 3"
    ):
        three.load_state_dict({"rows": [0, 5], "rates": [0.5, 1.0]})
    three.load_state_dict({"rows": [2], "rates": [0.25]})
    same(three.rates, [NAN, NAN, 0.25])
    levels = DifficultyCurriculum([0, 0, 1, 1], seed=0, threshold=0.5)
    with pytest.raises(UserError, match="^data.curriculum=difficulty: .*data.curriculum=pass_rate"):
        levels.load_state_dict(saved)
    with pytest.raises(UserError, match="^data.curriculum=pass_rate: .*data.curriculum=difficulty"):
        three.load_state_dict(levels.state_dict())
    with pytest.raises(
        UserError, match="at level 3 and the run's training rows have levels 0 to 1"
    ):
        levels.load_state_dict({"level": 3, "window": []})


def test_a_level_with_fewer_rows_than_a_step_repeats_prompts_and_says_so_at_start():
    """The draw goes on with replacement once a level's rows are drawn, unchanged so that runs
    and resumes stay bit-identical; the start-up report names the levels it happens at."""
    curriculum = DifficultyCurriculum([0, 0, 1, 1, 2, 2, 3, 3], seed=0, threshold=0.8)
    picks = curriculum.draw(1, 4)
    assert sorted(picks[:2]) == [0, 1] and set(picks) == {0, 1}  # both rows first, then again
    config = load_config(None, ["data.curriculum=difficulty", "data.prompts_per_step=4"])
    rows = [{"level": level} for level in (0, 0, 1, 1, 2, 2, 3, 3)]
    assert curriculum_notes(config, rows) == [
        "data.curriculum=difficulty: each of the 4 levels has 2 training rows, fewer than "
        "data.prompts_per_step=4: each step repeats prompts"
    ]
    uneven = [{"level": level} for level in (0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2)]
    assert curriculum_notes(config, uneven) == [
        "data.curriculum=difficulty: 1 of the 3 levels have fewer training rows than "
        "data.prompts_per_step=4 (level 1: 3): a step at one of them repeats prompts"
    ]
    assert curriculum_notes(config, [{"level": level} for level in (0,) * 4 + (1,) * 4]) == []
    # with dynamic sampling one draw covers every sampling round: B x rounds rows a level
    dynamic = load_config(
        None,
        ["data.curriculum=difficulty", "data.prompts_per_step=4", "algo.dynamic_sampling=true",
         "algo.max_resample=2"],
    )  # fmt: skip
    assert curriculum_notes(dynamic, [{"level": level} for level in (0,) * 4 + (1,) * 4]) == [
        "data.curriculum=difficulty: each of the 2 levels has 4 training rows, fewer than "
        "data.prompts_per_step=4 x 3 sampling rounds: each step repeats prompts"
    ]
    pass_rate = load_config(None, ["data.curriculum=pass_rate", "data.prompts_per_step=4"])
    assert curriculum_notes(pass_rate, rows[:2]) == []  # the plain note on all rows says it


# --- tasks: levels and options --------------------------------------------------------------


def digest(task, splits: tuple[str, ...] = ("train", "test")) -> str:
    rows = [task.examples(split, 500, 3) for split in splits]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def test_tasks_draw_the_rows_they_drew_before_they_had_levels():
    # the sha-256 of each task's rows at the commit before levels (0c28465); arith's test
    # split since it holds out no commuted twin of a training problem, its train split as then
    arith = get_task("arith")
    assert digest(arith, ("train",)) == (
        "f15231a1607e64abf042b4a9c2078444f9cd8f93f01716b82709cf819266daf8"
    )
    assert digest(arith, ("test",)) == (
        "29308265e275b82589d2f557c5c9faeb154f413416fba54180396c52ed449979"
    )
    assert digest(get_task("countdown")) == (
        "a0ae0ea7870373b9748d33bf885137b75c3ed2e02049ac2a6e8f6f038607b893"
    )


def operand_digits(row: dict) -> set[int]:
    return {len(str(int(part))) for part in row["prompt"].rstrip("=").split("+")}


def test_arith_levels_are_digit_counts_up_to_the_tasks_own_mix():
    task = ArithTask(max_digits=4, min_digits=4)
    assert task.levels == 4
    for row in task.examples("test", 50, 0):
        assert operand_digits(row) == {4} and len(row["prompt"]) == 10
    # below min_digits a level has operands of exactly k + 1 digits, written 4 wide
    assert all(operand_digits(r) == {2} for r in task.examples("train", 30, 0, level=1))
    digits = [d for r in ArithTask().examples("train", 300, 0, level=2) for d in operand_digits(r)]
    assert set(digits) == {1, 2, 3}
    with pytest.raises(ValueError, match=r"level must be in \[0, 4\)"):
        task.examples("train", 1, 0, level=4)


def test_countdown_levels_add_numbers():
    task = CountdownTask()
    assert task.levels == 2
    counts = [len(r["numbers"].split(",")) for r in task.examples("train", 60, 0, level=0)]
    assert set(counts) == {3}
    counts = [len(r["numbers"].split(",")) for r in task.examples("train", 60, 0, level=1)]
    assert set(counts) == {3, 4}


def test_gym_levels_are_the_reasoning_gym_curriculum():
    task = get_task("gym:basic_arithmetic")
    assert task.levels == 5
    for row in task.examples("train", 20, 0, level=0):  # two terms of one digit
        assert len([t for t in row["gym_entry"]["question"].split() if t.isdigit()]) <= 2
    assert get_task("gym:acre").levels == 0  # no curriculum in reasoning-gym


def test_leveled_examples_take_an_equal_share_of_every_level():
    rows = leveled_examples(ArithTask(), 10, seed=0)
    assert [r["level"] for r in rows] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert all(operand_digits(r) == {1} for r in rows[:3])
    with pytest.raises(UserError, match="sums has none"):
        leveled_examples(get_task("sums"), 10, seed=0)


def test_task_options_build_the_task_and_a_bad_one_names_the_field():
    assert get_task("arith", {"max_digits": 6, "min_digits": 2}).min_digits == 2
    with pytest.raises(UserError, match="data.task_options .* do not fit task arith"):
        get_task("arith", {"digits": 6})
    with pytest.raises(UserError, match="min_digits must be a whole number in"):
        get_task("arith", {"min_digits": 5})


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.curriculum=easy"], "data.curriculum must be one of none, pass_rate, difficulty"),
        (["data.curriculum_threshold=0"], r"data.curriculum_threshold must be in \(0, 1\]"),
        (["data.curriculum_floor=2"], r"data.curriculum_floor must be in \(0, 1\]"),
        (["data.path=x.jsonl", "data.curriculum=difficulty"], "needs a built-in task"),
        (["data.path=x.jsonl", "data.task_options={max_digits: 6}"], "which data.path replaces"),
        (["algo.beta=0", "algo.beta_warmup_steps=5"], "ramps nothing with algo.beta=0"),
        (["algo.preset=ppo", "algo.beta_warmup_steps=5"], "algo.kl_in_reward=true puts"),
    ],
)
def test_bad_curriculum_and_warmup_settings_are_one_line_errors(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config(None, overrides)


# --- the trainer ----------------------------------------------------------------------------


def job(model_dir: Path, run_dir: Path, *extra: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "data.prompts_per_step=4",
            "data.num_train=40",
            "eval.num_prompts=0",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "reward.timeout=null",
            "run.steps=3",
            f"run.dir={run_dir}",
            "run.device=cpu",
            "run.preflight=false",
            *extra,
        ],
    )


def test_the_warmed_up_beta_reaches_the_loss_and_the_reference_is_kept(
    tiny_model_dir, tmp_path, monkeypatch
):
    s = setup(job(tiny_model_dir, tmp_path / "run", "algo.beta_warmup_steps=4"))
    assert s.policy.reference is not None
    used = []
    real = loop_step.optimizer_step

    def optimizer_step(policy, optimizer, batch, fns, *args, **kwargs):
        used.append((fns.beta, batch.ref_logprobs is not None))
        return real(policy, optimizer, batch, fns, *args, **kwargs)

    monkeypatch.setattr(loop_step, "optimizer_step", optimizer_step)
    logged = [training_step(s, step)["kl/beta"] for step in (1, 2)]
    assert used == [(0.01, True), (0.02, True)] and logged == [0.01, 0.02]
    assert s.loss_fns.beta == 0.04  # the session's objective keeps the full weight


def test_the_difficulty_curriculum_trains_on_the_easiest_level_first(tiny_model_dir, tmp_path):
    s = setup(job(tiny_model_dir, tmp_path / "run", "data.curriculum=difficulty"))
    assert [r["level"] for r in s.data.rows] == [lvl for lvl in range(4) for _ in range(10)]
    metrics = training_step(s, 1)
    assert metrics["curriculum/level"] == 0.0
    assert 0.0 <= metrics["curriculum/accuracy"] <= 1.0
    samples = [json.loads(line) for line in (s.run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(operand_digits(r) == {1} for r in samples)


def test_a_resume_keeps_the_curriculum_it_was_saved_with(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    trainer.train(job(tiny_model_dir, run_dir, "run.steps=1"), quiet=True)
    resume = ("data.curriculum=pass_rate", "run.resume=auto")
    with pytest.raises(UserError, match="data.curriculum was 'none' and is now 'pass_rate'"):
        setup(job(tiny_model_dir, run_dir, *resume))
    forced = "run.force_changes=[data.curriculum]"
    with pytest.raises(UserError, match="written without data.curriculum=pass_rate"):
        setup(job(tiny_model_dir, run_dir, *resume, forced))


def test_a_resume_that_forces_fewer_rows_under_a_curriculum_is_a_one_line_error(
    tiny_model_dir, tmp_path
):
    run_dir = tmp_path / "run"
    trainer.train(
        job(tiny_model_dir, run_dir, "run.steps=1", "data.curriculum=pass_rate"), quiet=True
    )
    fewer = ("data.curriculum=pass_rate", "data.num_train=20", "run.resume=auto")
    forced = "run.force_changes=[data.num_train,data.rows]"
    with pytest.raises(UserError, match="pass rates of 40 training rows and the run has 20"):
        setup(job(tiny_model_dir, run_dir, *fewer, forced))
