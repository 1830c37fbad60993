"""Held-out evaluation decodes as training does: its stop strings end the completions it scores,
and batches of one evaluation draw apart; a program is correct when it passes all its tests."""

from __future__ import annotations

import dataclasses
import re

import pytest
from helpers.episodes import load_qwen3_tokenizer, scripted_sampler

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


@pytest.mark.parametrize(("body", "accuracy"), [("max(x, k)", 1.0), ("x", 0.0), ("k", 0.0)])
def test_a_program_counts_correct_only_when_it_passes_every_test(body, accuracy):
    """Held-out accuracy on code is pass@1: `return x` passes two of the three tests of "the
    larger of x and k" (k and an input above it), and is wrong."""
    tok = load_qwen3_tokenizer()
    config = load_config(None, ["data.task=code", "run.device=cpu"])
    task = get_task("code", {})
    problem = next(r for r in task.examples("test", 25, 0) if "larger of x and" in r["prompt"])
    k = re.search(r"max\(x, (\d+)\)", problem["answer"])[1]
    program = f"```python\ndef f(x):\n    return {body.replace('k', k)}\n```"
    sampler, _ = scripted_sampler(tok, [tok.encode(program) + [tok.eos_token_id]])
    rows = PromptData([problem], tok, config.data, seed=0).rows
    params = dataclasses.replace(sampling_params(config, seed=0), max_new_tokens=64)
    assert evaluate(sampler, rows, correctness_fn(config, task), params) == {"accuracy": accuracy}
