"""Held-out accuracy: greedy accuracy, and mean@K / pass@K over K samples per prompt."""

from __future__ import annotations

import math

import torch

from oncurve.inputs import group_columns
from oncurve.rewards.registry import RewardFn
from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.rollout.episodes import EpisodeSettings, draw


def evaluate(
    sampler: Sampler,
    rows: list[dict],
    correct: RewardFn,
    *,
    max_new_tokens: int,
    samples: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 256,
    records: list[dict] | None = None,
    episodes: EpisodeSettings | None = None,
) -> dict[str, float]:
    """Score `rows` ({"prompt", "prompt_ids", "answer", ...}) with the `correct` reward; with
    `episodes`, multi-turn episodes are played and `correct` reads their columns.

    With `records` (a list), one dict per row is appended to it: the greedy completion and its
    score, and with samples > 1 the sampled completions and their scores.

    Returns:
        {"accuracy": greedy fraction correct} and, when samples > 1, {"mean@K": mean correct
        over K samples at `temperature`, "pass@K": fraction of prompts with one correct}.
    """
    greedy_params = SamplingParams(max_new_tokens, temperature=0.0)
    greedy, greedy_texts = _scores(sampler, episodes, rows, correct, 1, greedy_params, batch_size)
    result = {"accuracy": float(greedy.mean())}
    sampled_texts: list[str] = []
    if samples > 1:
        params = SamplingParams(max_new_tokens, temperature=temperature, seed=seed)
        sampled, sampled_texts = _scores(
            sampler, episodes, rows, correct, samples, params, batch_size
        )
        result[f"mean@{samples}"] = float(sampled.mean())
        result[f"pass@{samples}"] = float((sampled > 0).any(1).float().mean())
    if records is not None:
        for i in range(len(rows)):
            record = {"greedy": greedy_texts[i], "greedy_correct": float(greedy[i, 0])}
            if samples > 1:
                record["samples"] = sampled_texts[i * samples : (i + 1) * samples]
                record["samples_correct"] = sampled[i].tolist()
            records.append(record)
    return result


def _scores(
    sampler: Sampler,
    episodes: EpisodeSettings | None,
    rows: list[dict],
    correct: RewardFn,
    group_size: int,
    params: SamplingParams,
    batch_size: int,
) -> tuple[torch.Tensor, list[str]]:
    """`[len(rows), group_size]` 1.0 where a completion is correct, and the completions (a
    row's `group_size` consecutive)."""
    per_call = max(1, batch_size // group_size)
    # chunks of equal size (within one prompt): the cuda_graph sampler decodes them all in one
    # workspace, and none of them mostly empty
    per_call = math.ceil(len(rows) / math.ceil(len(rows) / per_call))
    scores, texts = [], []
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        rollout, outcomes = draw(sampler, episodes, chunk, group_size, params)
        prompts, columns = group_columns(chunk, group_size)
        values = correct(prompts, rollout.texts, **columns, **outcomes)
        scores.append(torch.tensor([1.0 if (v or 0) > 0.5 else 0.0 for v in values]))
        texts.extend(rollout.texts)
    return torch.cat(scores).view(len(rows), group_size), texts
