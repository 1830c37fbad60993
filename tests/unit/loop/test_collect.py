"""Group sampling and dynamic sampling (`groups.sample_groups`) on one process and on 2 gloo
ranks, with a scripted sampler and scripted prompts, so that which groups are informative in
which round is known in advance; the verifier that decides both the filter and unscored rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.configs import make_config
from helpers.rank_pool import on_ranks
from helpers.scripted import scripted_session

from oncurve import distributed
from oncurve.config import Config
from oncurve.errors import UserError
from oncurve.loop import training_step as loop_step
from oncurve.loop.collect import function_means, reward_metrics
from oncurve.loop.trainer import MAXED, SUMMED
from oncurve.loop.training_step import training_step
from oncurve.rewards.jobs import RewardError
from oncurve.rewards.runner import RewardRunner
from oncurve.rewards.trl_contract import TrlReward
from oncurve.run.metrics import read_jsonl
from oncurve.run.rewards import build_rewards


def where(prompt: str) -> tuple[int, int, int]:
    """(step, round, prompt index) of a `scripted_rows` prompt."""
    step, round_, index = map(int, prompt.split("."))
    return step, round_, index


# Which prompts have informative groups, by (step, round). With B = 8 on 2 ranks, rank 0 holds
# prompts 0-3 of each round and rank 1 prompts 4-7.
INFORMATIVE = {
    # rank 0 is full after round 0; rank 1 holds 1, 3, then 4 groups after rounds 0, 1, 2
    (1, 0): {0, 1, 2, 3, 4},
    (1, 1): {5, 6},
    (1, 2): {4, 5, 6, 7},
    # rank 1 never fills: every rank trains on its one group
    (2, 0): {0, 1, 2, 3, 4},
}


def informative_lengths(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """A completion's length where its prompt is in `INFORMATIVE`, else 0 (a flat group)."""
    return [
        float(len(c)) if where(p)[2] in INFORMATIVE.get(where(p)[:2], set()) else 0.0
        for p, c in zip(prompts, completions, strict=True)
    ]


def scripted_steps(model_dir: Path, data_file: Path, run_dir: Path, *extra: str) -> list[dict]:
    """Two training steps of dynamic sampling on the `INFORMATIVE` script, on this process's
    ranks: per step the prompts this rank trained on, its optimizer steps and some metrics."""
    config = make_config(
        model_dir,
        data_file,
        run_dir,
        "data.prompts_per_step=8",
        "rollout.group_size=2",
        "algo.dynamic_sampling=true",
        "algo.max_resample=2",
        "algo.minibatches=2",
        "algo.beta=0.0",
        # ranks out of step fail the test in seconds instead of hanging it
        "dist.timeout_s=20",
        *extra,
    )
    s = scripted_session(config, reward=informative_lengths)
    optimizer_steps = []
    s.optimizer.register_step_pre_hook(lambda *_: optimizer_steps.append(1))
    trained: list[list[str]] = []
    # `log_samples` is handed every row trained on (the log keeps `log.samples_per_step`)
    real = loop_step.log_samples
    loop_step.log_samples = lambda logger, step, rollout, rewards, rows, *_: trained.append(
        [row["prompt"] for row in rows]
    )
    try:
        steps = []
        for step in (1, 2):
            before = len(optimizer_steps)
            metrics = training_step(s, step)
            steps.append(
                {
                    "prompts": trained[-1],
                    "optimizer_steps": len(optimizer_steps) - before,
                    **{k: metrics.get(k) for k in ("kept/groups", "groups/sampling_rounds")},
                }
            )
        return steps
    finally:
        loop_step.log_samples = real


def test_dynamic_sampling_on_one_process_fills_the_batch_or_trains_on_what_it_kept(
    tiny_model_dir, data_file, tmp_path
):
    step1, step2 = scripted_steps(tiny_model_dir, data_file, tmp_path / "run")
    assert step1["prompts"] == [f"1.0.{i}" for i in range(5)] + ["1.1.5", "1.1.6", "1.2.4"]
    assert step1["groups/sampling_rounds"] == 3 and step1["kept/groups"] == 8
    assert step1["optimizer_steps"] == 2
    # short after every round: the 5 groups it has, in 2 minibatches
    assert step2["prompts"] == [f"2.0.{i}" for i in range(5)]
    assert step2["groups/sampling_rounds"] == 3 and step2["optimizer_steps"] == 2


def test_dynamic_sampling_on_two_ranks_collects_each_ranks_share_and_steps_in_lockstep(
    tiny_model_dir, data_file, tmp_path, two_ranks
):
    run_dir = tmp_path / "run"
    # one thread a rank: two ranks of two threads each on two cores spin against each other
    ranks = on_ranks(two_ranks, scripted_steps, tiny_model_dir, data_file, run_dir, "run.threads=1")
    (r0s1, r0s2), (r1s1, r1s2) = ranks
    # B / W = 4 groups each, not B: rank 0 sampled once, rank 1 in three rounds
    assert r0s1["prompts"] == ["1.0.0", "1.0.1", "1.0.2", "1.0.3"]
    assert r1s1["prompts"] == ["1.0.4", "1.1.5", "1.1.6", "1.2.4"]
    for step in (r0s1, r1s1):
        assert step["groups/sampling_rounds"] == 3 and step["kept/groups"] == 8
        assert step["optimizer_steps"] == 2
    # rank 1 ends with one group: rank 0 trains on one too, so both take one step
    assert r0s2["prompts"] == ["2.0.0"] and r1s2["prompts"] == ["2.0.4"]
    for step in (r0s2, r1s2):
        assert step["kept/groups"] == 2 and step["optimizer_steps"] == 1


def test_sampled_and_kept_metrics_are_logged_apart(tiny_model_dir, data_file, tmp_path):
    """reward/* and groups/all_equal_frac over every round; kept/* over the trained batch."""
    config = make_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "data.prompts_per_step=8",
        "rollout.group_size=2",
        "algo.dynamic_sampling=true",
        "algo.max_resample=2",
        "algo.beta=0.0",
    )
    s = scripted_session(config, reward=informative_lengths)
    metrics = training_step(s, 1)
    # 3 rounds of 8 prompts; informative groups' completions ("1a", "11a") score 2 and 3
    informative = sum(len(INFORMATIVE[(1, r)]) for r in range(3))
    sampled = torch.tensor([2.0, 3.0] * informative + [0.0, 0.0] * (24 - informative))
    assert metrics["reward/mean"] == pytest.approx(float(sampled.mean()))
    assert metrics["reward/std"] == pytest.approx(float(sampled.std(unbiased=False)))
    assert metrics["reward/scripted"] == pytest.approx(float(sampled.mean()))
    assert metrics["groups/all_equal_frac"] == pytest.approx(1 - informative / 24)
    assert metrics["kept/reward_mean"] == pytest.approx(2.5)
    assert metrics["kept/reward_std"] == pytest.approx(0.5)
    assert metrics["kept/groups"] == 8 and metrics["groups/dropped"] == 24 - informative


def logging(logged: str, name: str):
    """A TRL reward that scores 1 and logs `name` with `logged` (`log_metric` or `log_extra`)."""

    def logs(completions, log_metric, log_extra, **kwargs):
        if logged == "log_metric":
            log_metric(name, 7.0)
        else:
            log_extra(name, ["mine"] * len(completions))
        return [1.0] * len(completions)

    return TrlReward(logs)


@pytest.mark.parametrize(
    ("logged", "name", "whose"),
    [
        ("log_metric", "lr", "a metric the trainer logs in the step's row"),
        ("log_metric", "reward/mean", "a metric the trainer logs in the step's row"),
        ("log_metric", "reward/scripted", "a metric the trainer logs in the step's row"),
        ("log_metric", "reward/timeouts", "a metric the trainer logs in the step's row"),
        ("log_metric", "kl", "a metric the trainer logs in the step's row"),
        ("log_metric", "eval/accuracy", "a metric of the trainer's evaluation rows"),
        ("log_extra", "prompt", "a column samples.jsonl writes itself"),
        ("log_extra", "completion", "a column samples.jsonl writes itself"),
        ("log_extra", "reward", "a column samples.jsonl writes itself"),
        ("log_extra", "answer", "a column samples.jsonl writes itself"),
        ("log_extra", "prompt_as_seen", "a column samples.jsonl writes itself"),
    ],
)
def test_a_log_named_as_the_trainers_own_is_one_line_naming_the_reward(
    tiny_model_dir, data_file, tmp_path, logged, name, whose
):
    """A reward's logged metric or column of a name the trainer writes itself would lose to the
    trainer's, or replace it: the first step that logs it stops the run in one line."""
    config = make_config(tiny_model_dir, data_file, tmp_path / "run", "algo.beta=0.01")
    s = scripted_session(config, reward=logging(logged, name))
    with pytest.raises(
        RewardError,
        match=rf"^reward 'scripted' logged {name!r} with {logged}, {whose}; choose another name",
    ):
        training_step(s, 1)


def test_a_rewards_own_names_land_beside_the_trainers(tiny_model_dir, data_file, tmp_path):
    metric = scripted_session(
        make_config(tiny_model_dir, data_file, tmp_path / "a"),
        reward=logging("log_metric", "accuracy"),
    )
    assert training_step(metric, 1)["accuracy"] == 7.0
    column = scripted_session(
        make_config(tiny_model_dir, data_file, tmp_path / "b"),
        reward=logging("log_extra", "golden"),
    )
    training_step(column, 1)
    samples = read_jsonl(tmp_path / "b" / "samples.jsonl")
    assert [row["golden"] for row in samples] == ["mine"] * 4


def nines(prompt_ids: list[int], member: int) -> str:
    """Member k: 5 + k nines, the right answer "99999" only for member 0 (and only where the
    answer is 99999); long enough for the overlong penalty to differ within the group."""
    return "9" * (5 + member)


def dapo_config(model_dir: Path, data_file: Path, run_dir: Path, *extra: str) -> Config:
    """The DAPO preset, rewarded by the built-in `correct` and the overlong penalty (4 tokens
    before max_new_tokens=8)."""
    return make_config(
        model_dir,
        data_file,
        run_dir,
        "algo.preset=dapo",
        "reward.overlong_buffer=4",
        "algo.max_resample=0",
        "rollout.group_size=2",
        "reward.functions=[correct]",
        *extra,
    )


def test_dynamic_sampling_filters_on_the_correctness_reward_not_the_penalty(
    tiny_model_dir, data_file, tmp_path, capsys, monkeypatch
):
    """Odd prompts' groups are all wrong; their lengths (so their overlong penalties) differ.
    DAPO filters on accuracy: they are dropped, and the run says which reward filters."""
    s = scripted_session(dapo_config(tiny_model_dir, data_file, tmp_path / "run"), nines)
    trained: list[str] = []
    monkeypatch.setattr(
        loop_step, "log_samples", lambda *args: trained.extend(row["prompt"] for row in args[4])
    )
    metrics = training_step(s, 1)
    assert trained == ["1.0.0", "1.0.2"]
    assert metrics["groups/dropped"] == 2
    assert "keeps the groups whose 'correct' rewards differ" in capsys.readouterr().err


def test_a_row_the_verifier_leaves_unscored_has_no_total_whatever_the_penalty(data_file, tmp_path):
    """`correct` returns None for a row without an answer; the overlong penalty still scores
    it, but the row must stay out of the group statistics (NaN), not count as wrong."""
    config = dapo_config(Path("unused"), data_file, tmp_path / "run")
    runner = build_rewards(config, None)
    assert runner.verifier == "correct"
    completions = ["9" * 5, "9" * 7, "9" * 7]
    result = runner.score(
        ["p"] * 3, completions, {"answer": ["99999", "", "0"], "completion_lengths": [6, 8, 8]}
    )
    assert result.per_fn[1, 1] == -1.0  # the penalty scored the unverified row
    assert math.isnan(result.total[1])
    assert result.total[0] == pytest.approx(0.5) and result.total[2] == -1.0
    # without a verifier, a function's None counts as 0 in the sum
    plain = RewardRunner(runner.fns, timeout_s=None)
    total = plain.score(["p"], ["x"], {"answer": [""], "completion_lengths": [9]}).total
    assert total.tolist() == [-1.0]


def test_a_verifier_must_be_one_of_the_rewards():
    with pytest.raises(UserError, match="reward verifier 'correct' is not one of the rewards"):
        RewardRunner([("format", lambda p, c, **_: [0.0] * len(c), 1.0)], verifier="correct")


def _logged_on_rank(rank: int, world_size: int) -> dict[str, float]:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    metrics = reward_metrics(torch.full((4,), float(rank)), 2)
    metrics |= {"reward/timeouts": float(rank + 1), "reward/slowest_row_s": float(rank + 3)}
    return distributed.across_ranks(metrics, SUMMED, MAXED)


def test_two_ranks_log_the_whole_batchs_statistics(two_ranks):
    """Rewards [0, 0, 0, 0] on one rank and [1, 1, 1, 1] on the other: the population std of
    the batch is 0.5 (not the ranks' mean std, 0), counts add up, the slowest row is the
    slowest of either."""
    logged, _ = two_ranks.run(_logged_on_rank)
    whole = reward_metrics(torch.tensor([0.0] * 4 + [1.0] * 4), 2)
    assert (logged["reward/mean"], whole["reward/mean"]) == (0.5, 0.5)
    assert logged["reward/std"] == pytest.approx(whole["reward/std"]) and whole["reward/std"] == 0.5
    assert (logged["reward/timeouts"], logged["reward/slowest_row_s"]) == (3.0, 4.0)


def _uneven_on_rank(rank: int, world_size: int) -> dict[str, float]:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0]) if rank == 0 else torch.tensor([0.0, 0.0])
    per_fn = rewards.clone()[:, None]
    per_fn[0, 0] = math.nan if rank == 0 else 0.0  # a row the function left unscored
    metrics = reward_metrics(rewards, 2) | function_means(per_fn, ["f"])
    return distributed.across_ranks(metrics, SUMMED, MAXED)


def test_ranks_holding_different_numbers_of_rows_log_every_row_alike(two_ranks):
    """Dynamic sampling can leave one rank with 2 groups and another with 1: rewards
    [0, 1, 1, 1] and [0, 0] are the batch [0, 1, 1, 1, 0, 0] (mean 0.5, std 0.5, 2 of 3 groups
    all equal), not the mean of the ranks' figures (0.375); the function's 3 + 2 scored rows
    mean 0.6."""
    logged, other = two_ranks.run(_uneven_on_rank)
    assert logged["reward/mean"] == pytest.approx(0.5, abs=1e-12)
    assert logged["reward/std"] == pytest.approx(0.5, abs=1e-12)
    assert logged["groups/all_equal_frac"] == pytest.approx(2 / 3, abs=1e-12)
    assert logged["reward/f"] == pytest.approx(0.6, abs=1e-12)
    assert other == logged
