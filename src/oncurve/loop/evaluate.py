"""Held-out accuracy: greedy accuracy, and mean@K / pass@K over K samples per prompt."""

from __future__ import annotations

import dataclasses
import math

import torch

from oncurve.data.prompts import group_columns
from oncurve.rewards.matching import usable_gold
from oncurve.rewards.registry import ANSWER_MATCH_REWARDS, RewardFn
from oncurve.rewards.runner import RewardRunner
from oncurve.rewards.trl_contract import TrainerState
from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.rollout.episodes import EpisodeSettings, draw
from oncurve.rollout.harness import HarnessSettings


def evaluate(
    sampler: Sampler,
    rows: list[dict],
    correct: RewardFn,
    params: SamplingParams,
    *,
    samples: int = 1,
    batch_size: int = 256,
    records: list[dict] | None = None,
    episodes: EpisodeSettings | HarnessSettings | None = None,
    timeout_s: float | None = 10.0,
    timeout_score: float | None = 0.0,
    on_error: str = "raise",
    state: TrainerState | None = None,
    name: str = "correct",
) -> dict[str, float]:
    """Score `rows` ({"prompt", "prompt_ids", "answer", ...}) with the `correct` reward; with
    `episodes`, multi-turn episodes are played and `correct` reads their columns. A completion
    is correct when its score is above 0.5, or at least the reward's `correct_at` where it has
    one (`code_tests`: 1.0, every test passed).

    Completions decode as training's do (`params`: length, stop strings, truncation, seed); the
    greedy pass with temperature 0. Batches of `batch_size` rows draw apart (`first_row`: on
    `cuda_graph`, exactly what one call of all the rows would draw for them).

    `correct` runs under the policy training scores with (`reward.timeout`, `timeout_score`,
    `errors`; `RewardRunner`): a row past the timeout scores `timeout_score`, a row whose score
    is None (or NaN) counts as wrong, so that no completion can hang or crash an evaluation.
    Rows whose reference answer is malformed (`usable_gold`: empty, NaN, `None`, `0/0`) are
    not scored by `correct`: they are counted apart ("unscored") and left out of every rate.

    `state` is the trainer's (at evaluation, the step trained so far), for the rewards that
    take it (TRL's `trainer_state`). `name` is the reward's in the line that says it failed.

    With `records` (a list), one dict per row is appended to it: the greedy completion and its
    score, and with samples > 1 the sampled completions and their scores.

    Returns:
        {"accuracy": greedy fraction correct} and, when samples > 1, {"mean@K": mean correct
        over K samples drawn with `params`, "pass@K": fraction of prompts with one correct}; with
        rows of malformed references, {"unscored": their number}.
    """
    greedy_params = dataclasses.replace(params, temperature=0.0)
    runner = RewardRunner(
        [(name, correct, 1.0)],
        timeout_s=timeout_s,
        timeout_score=timeout_score,
        on_error=on_error,
        say_unscored=False,  # the rows of malformed references are counted apart
    )
    with runner:
        greedy, greedy_texts = _scores(
            sampler, episodes, rows, runner, 1, greedy_params, batch_size, state
        )
        scored = torch.tensor(
            [
                correct not in ANSWER_MATCH_REWARDS or usable_gold(r.get("answer")) is not None
                for r in rows
            ],
            device=greedy.device,
        )
        # in float64: a fraction of rows, not its float32 rounding (0.7, not 0.699999988)
        result = {"accuracy": float(greedy[scored].cpu().double().mean())}
        sampled_texts: list[str] = []
        if samples > 1:
            sampled, sampled_texts = _scores(
                sampler, episodes, rows, runner, samples, params, batch_size, state
            )
            result[f"mean@{samples}"] = float(sampled[scored].cpu().double().mean())
            result[f"pass@{samples}"] = float((sampled[scored] > 0).any(1).cpu().double().mean())
        if not scored.all():
            result["unscored"] = float((~scored).sum())
    if records is not None:
        for i in range(len(rows)):
            correct_value = float(greedy[i, 0]) if scored[i] else None
            record = {"greedy": greedy_texts[i], "greedy_correct": correct_value}
            if samples > 1:
                record["samples"] = sampled_texts[i * samples : (i + 1) * samples]
                record["samples_correct"] = sampled[i].tolist() if scored[i] else None
            records.append(record)
    return result


def _scores(
    sampler: Sampler,
    episodes: EpisodeSettings | HarnessSettings | None,
    rows: list[dict],
    runner: RewardRunner,
    group_size: int,
    params: SamplingParams,
    batch_size: int,
    state: TrainerState | None,
) -> tuple[torch.Tensor, list[str]]:
    """`[len(rows), group_size]` 1.0 where a completion is correct, and the completions (a
    row's `group_size` consecutive)."""
    correct_at = getattr(runner.fns[0][1], "correct_at", None)
    per_call = max(1, batch_size // group_size)
    # chunks of equal size (within one prompt): the cuda_graph sampler decodes them all in one
    # workspace, and none of them mostly empty
    per_call = math.ceil(len(rows) / math.ceil(len(rows) / per_call))
    scores, texts = [], []
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        chunk_params = dataclasses.replace(params, first_row=start * group_size)
        rollout, outcomes = draw(sampler, episodes, chunk, group_size, chunk_params)
        prompts, columns = group_columns(chunk, group_size)
        columns |= {
            "completion_lengths": rollout.completion_lengths.tolist(),
            "completion_ids": rollout.completion_token_lists(),
            **outcomes,
        }
        values = runner.score(prompts, rollout.texts, columns, state).per_fn[:, 0]
        # NaN compares False: unscored is wrong
        right = values >= correct_at if correct_at is not None else values > 0.5
        scores.append(right.float())
        texts.extend(rollout.texts)
    return torch.cat(scores).view(len(rows), group_size), texts
