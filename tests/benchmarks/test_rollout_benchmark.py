"""`benchmarks/rollout.py` and `harness.sampling` on the CPU with a tiny model: the CPU
scenario's figures, the GPU scenario's timing, EOS head and logprob gap (the same code a GPU
runs, on the CPU), `--cuda-shapes`, and results/rollout.md rendered from its record."""

from __future__ import annotations

import argparse
import json

import pytest
import rollout
from harness import records, sampling, tables
from harness.checkout import RESULTS
from harness.models import end_at_eos
from helpers.models import TOKENIZER, make_model

from oncurve.rollout import SamplingParams, build_sampler


def test_cuda_shapes_parse_and_bad_ones_are_refused():
    assert sampling.cuda_shape("64x256") == (64, 256, None)
    assert sampling.cuda_shape("64X1024~256") == (64, 1024, 256)
    for bad in ("63x256", "0x256", "64x256~1", "64x256~257", "64-256", "64x"):
        with pytest.raises(argparse.ArgumentTypeError):
            sampling.cuda_shape(bad)
    assert [shape[0] for shape in map(sampling.cuda_shape, rollout.CUDA_SHAPES.split(","))] == [
        64, 256, 64, 64
    ]  # fmt: skip


def test_a_cpu_scenario_gives_every_figure_of_its_section():
    model = make_model("qwen2")
    prompts = sampling.make_prompts(4)
    params = SamplingParams(max_new_tokens=6, min_new_tokens=6)
    calls = {
        "hf": sampling.sampler_call(build_sampler("hf", model, TOKENIZER), prompts, 2, params),
        "model.generate": sampling.generate_call(model, TOKENIZER, prompts, 2, params),
    }
    figures = sampling.measure_cpu(calls, 2, model, 8, lambda label: 1.5)
    hf, generate = figures["samplers"]
    assert hf["tokens"] == generate["tokens"] == 4 * 2 * 6  # forced to full length
    assert generate["vs_generate"] == generate["same_repeat"] == 1.0
    assert hf["x_floor"] == pytest.approx(hf["median_s"] / hf["floor_ms"] * 1e3)
    row = {"scenario": "tiny", "prompts": 4, "group": 2, "new_tokens": 6, "forced": True,
           "repeats": 2, "date": "2026-11-28", **figures}  # fmt: skip
    text = sampling.section(row)
    assert text.startswith("### tiny: 0.03M params, 4 prompts x G=2, 6 new tokens (forced")
    assert "| model.generate | 48 |" in text and "| 1.00x | 1.00x |" in text


def test_the_gpu_scenario_code_times_eos_and_gaps_on_the_cpu(tmp_path):
    model = make_model("qwen2")
    end_at_eos(model, TOKENIZER.eos_token_id, mean_length=4)
    prompts = sampling.make_prompts(8)
    params = SamplingParams(max_new_tokens=32, seed=0)
    sampler = build_sampler("hf", model, TOKENIZER)
    lengths = sampler.generate(prompts, 8, params).completion_mask.sum(1).float()
    assert 3 < float(lengths.mean()) < 5  # geometric with mean 4, cut at 32
    calls = {
        "model.generate (static cache)": (
            sampling.generate_call(model, TOKENIZER, prompts, 8, params, "static"),
            None,
        ),
        "hf": (sampling.sampler_call(sampler, prompts, 8, params), sampler),
    }
    earlier = [{"scenario": "64x32"}]
    records = sampling.time_on_gpu("64x32~4", calls, 2, 64, str(tmp_path / "r.json"), earlier)
    assert json.loads((tmp_path / "r.json").read_text()) == earlier + records
    assert len(records) == 2 and records[0]["vs_static"] == 1.0
    assert records[1]["compile_s"] is None and 1 < records[1]["mean_length"] < 32
    mean, largest = sampling.logprob_gap(model, sampler, prompts, 8, params)
    assert 0 <= mean <= largest < 1e-3
    row = {"scenario": "64x32~4", "rows": 64, "group": 8, "new_tokens": 32, "mean_length": 4,
           "repeats": 2, "gpu": "no GPU (CPU)", "samplers": records, "date": "2026-11-28",
           "logprob_gaps": {"hf": (mean, largest)}}  # fmt: skip
    text = sampling.section(row)
    assert (
        "8 prompts x G=8, lengths roughly geometric with mean 4 (EOS logit raised), cut at 32"
        in text
    )
    assert "| 1.00x |" in text and "- `hf`: its logprobs against the training forward's" in text


def test_the_committed_page_is_the_one_its_record_renders(monkeypatch, tmp_path):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    tables.render_page("rollout")
    assert (tmp_path / "rollout.md").read_text() == (RESULTS / "rollout.md").read_text()


def test_a_scenario_on_another_gpu_is_a_section_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    sampler = {"scenario": "64x256", "sampler": "cuda_graph", "tokens": 16384, "mean_length": 256.0,
               "best_s": 0.5, "tokens_per_s": 32768.0, "first_call_s": 12.0, "capture_s": 0.1,
               "compile_s": 11.0, "vs_static": 2.5}  # fmt: skip
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200"):
        row = {"scenario": "64x256", "rows": 64, "group": 8, "new_tokens": 256,
               "mean_length": None, "repeats": 1, "gpu": gpu, "samplers": [sampler],
               "logprob_gaps": {}}  # fmt: skip
        rollout.record(row)
    page = (tmp_path / "rollout.md").read_text()
    assert page.count("### cuda-64x256") == 2  # the second H200 run replaced the first
    assert "NVIDIA H100 80GB HBM3;" in page and "NVIDIA H200;" in page
    # the README's figure: an area per card; varying lengths are no headline
    assert sampling.headline(row) == {
        "area": "the sampler, 1 x H200",
        "figure": "2.50x static-cache `generate` (64 x 256)",
        "command": "benchmarks/rollout.py --device cuda",
    }
    assert sampling.headline(row | {"scenario": "64x1024~256", "mean_length": 256}) is None
