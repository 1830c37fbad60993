"""Held-out evaluation decodes as training does: its stop strings end the completions it scores,
and batches of one evaluation draw apart."""

from __future__ import annotations

import dataclasses

import pytest

from oncurve.config import load_config
from oncurve.data.prompts import PromptData, correctness_fn
from oncurve.data.tasks import get_task
from oncurve.loop.collect import sampling_params
from oncurve.loop.evaluate import evaluate
from oncurve.model.sources import load_model, load_tokenizer, resolve_model_path
from oncurve.rollout import build_sampler


@pytest.fixture(scope="module")
def setting():
    config = load_config(None, ["run.device=cpu"])
    task = get_task(config.data.task, config.data.task_options)
    path = resolve_model_path("default")
    tokenizer = load_tokenizer(path)
    sampler = build_sampler("cpu_llama", load_model(path), tokenizer)
    rows = PromptData(task.examples("test", 8, 0), tokenizer, config.data, seed=0).rows
    return config, sampler, rows, correctness_fn(config, task)


def test_stop_strings_end_the_completions_evaluation_scores(setting):
    config, sampler, rows, correct = setting
    params = sampling_params(config, seed=0)
    records: list[dict] = []
    whole = evaluate(sampler, rows, correct, params, records=records)
    assert whole["accuracy"] > 0 and all("</answer>" in r["greedy"] for r in records)
    stopped = dataclasses.replace(params, stop=("<answer>",))
    records = []
    assert evaluate(sampler, rows, correct, stopped, records=records) == {"accuracy": 0.0}
    assert all(r["greedy"].endswith("<answer>") for r in records)


def test_batches_of_one_evaluation_draw_apart(setting):
    config, sampler, rows, correct = setting
    same = [rows[0]] * 4
    records: list[dict] = []
    params = sampling_params(config, seed=0)
    evaluate(sampler, same, correct, params, samples=4, batch_size=8, records=records)
    samples = [tuple(r["samples"]) for r in records]
    # two calls of two rows each: the second call's rows are not the first's again
    assert samples[2:] != samples[:2]
