"""The `cuda_graph` sampler's compiled decode step (`rollout.compile`), on the CPU: inductor
compiles the same regions there (C++ kernels instead of Triton ones), so what compiling must
keep is checked here: the samples of the eager step, weights read in place with no recompile,
LoRA, and the fallback to the eager step when compiling fails.

Compiling is slow on a small CPU (tens of seconds a bucket, cold), so each test compiles one
bucket of a 2-layer model; the other architectures are `slow` (`pytest -m slow` runs them)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import pytest
import torch
import yaml
from helpers.configs import make_config
from helpers.graph_sampler import (
    FakePools,
    assert_fell_back_once,
    assert_same_samples,
    trained_logprobs,
)
from helpers.models import PROMPTS, TOKENIZER, lora_model, make_model, model_of
from helpers.runs import metric_rows

from oncurve.loop.trainer import train
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.rollout import SamplingParams
from oncurve.rollout.cuda_graph import GraphSampler

# 3 prompts x 2 = 6 rows: a single bucket, so a single compilation of each region
PARAMS = SamplingParams(max_new_tokens=6, temperature=0.7, top_k=20, seed=1)


def perturb_in_place(model: torch.nn.Module, lora: bool) -> None:
    """What an optimizer step does: the same tensors, new values (a LoRA run trains only its
    adapters)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not lora or "lora_" in name:
                param.add_(torch.randn_like(param) * 0.3)


@pytest.mark.parametrize(
    "kind",
    [
        "qwen3",
        "lora",
        pytest.param("llama", marks=pytest.mark.slow),
        pytest.param("qwen2", marks=pytest.mark.slow),
        pytest.param("mistral", marks=pytest.mark.slow),
    ],
)
def test_the_compiled_step_samples_as_the_eager_one_and_reads_weights_in_place(kind):
    model = lora_model() if kind == "lora" else model_of(kind)
    if kind == "lora":  # adapters that change the samples (peft starts lora_B at zero)
        perturb_in_place(model, lora=True)
    compiled = GraphSampler(model, TOKENIZER, compile_step=True)
    got = compiled.generate(PROMPTS, 2, PARAMS)
    assert compiled.compile_error is None, compiled.compile_error
    assert compiled.compile_seconds > 0
    eager = GraphSampler(model, TOKENIZER, compile_step=False).generate(PROMPTS, 2, PARAMS)
    assert_same_samples(got, eager, atol=1e-5)

    perturb_in_place(model, lora=kind == "lora")
    with torch.compiler.set_stance("fail_on_recompile"):  # the new values, no recompiling
        moved = compiled.generate(PROMPTS, 2, PARAMS)
    assert compiled.compile_error is None, compiled.compile_error
    assert not torch.equal(moved.logprobs, got.logprobs)
    eager = GraphSampler(model, TOKENIZER, compile_step=False).generate(PROMPTS, 2, PARAMS)
    assert_same_samples(moved, eager, atol=1e-5)
    torch.testing.assert_close(
        moved.logprobs,
        trained_logprobs(model, moved, PARAMS.temperature, PARAMS.truncation),
        atol=2e-5,
        rtol=0,
    )


@pytest.mark.parametrize(
    "dynamic", [pytest.param(False, marks=pytest.mark.slow), True], ids=["per-bucket", "dynamic"]
)
def test_compiled_buckets_sample_as_the_eager_step_through_compaction(dynamic):
    """Rows that end early move the decode to smaller buckets, each compiled on its own, or
    all served by one compilation with symbolic sizes (`dynamic_compile`)."""
    model = make_model("qwen2", eos_bias=2.0)
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=5)
    prompts = PROMPTS * 6  # 36 rows: buckets 36, 32, 16, 8
    compiled = GraphSampler(model, TOKENIZER, compile_step=True, dynamic_compile=dynamic)
    got = compiled.generate(prompts, 2, params)
    eager = GraphSampler(model, TOKENIZER, compile_step=False).generate(prompts, 2, params)
    assert compiled.compile_error is None, compiled.compile_error
    assert {"eos", "length"} <= set(got.finish_reasons)
    regions = compiled._compiled
    assert len(regions) > 1  # more than one bucket ran compiled
    assert len({id(r) for r in regions.values()}) == (1 if dynamic else len(regions))
    assert_same_samples(got, eager, atol=1e-5)


@pytest.mark.parametrize("failing", ["every region", "the last region"])
def test_a_failed_compilation_decodes_with_the_uncompiled_step(monkeypatch, capsys, failing):
    """Compiling fails at the first call, as inductor's errors do: the sampler says so once
    and samples exactly what the uncompiled step samples, also when the regions before the
    last one already ran (they only rewrite what the step writes again)."""

    def compile_(fn, **_):
        if failing == "the last region" and fn.__name__ != "_record":
            return fn

        def broken(*args, **kwargs):
            raise RuntimeError("BackendCompilerFailed: no compiler (test)")

        return broken

    monkeypatch.setattr(torch, "compile", compile_)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=4)
    eager = GraphSampler(model_of("qwen2"), TOKENIZER).generate(PROMPTS, 4, params)
    sampler = GraphSampler(model_of("qwen2"), TOKENIZER, compile_step=True)
    first = sampler.generate(PROMPTS, 4, params)
    again = sampler.generate(PROMPTS, 4, params)
    assert_fell_back_once(capsys, "uncompiled step", sampler.compile_error, [first, again], eager)
    assert not sampler.compile_step


def test_a_run_whose_compilation_fails_trains_on_and_records_it(
    tiny_model_dir, data_file, tmp_path, capsys, monkeypatch
):
    def compile_(fn, **_):
        def broken(*args, **kwargs):
            raise RuntimeError("BackendCompilerFailed: no compiler (test)")

        return broken

    monkeypatch.setattr(torch, "compile", compile_)
    run_dir = tmp_path / "run"
    config = make_config(
        tiny_model_dir,
        data_file,
        run_dir,
        "rollout.backend=cuda_graph",
        "rollout.compile=true",
        "run.steps=2",
    )
    train(config, quiet=True)
    assert capsys.readouterr().err.count("compiling the decode step failed") == 1
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["compile"] is False
    compiled = [
        row["rollout/compiled"] for row in metric_rows(run_dir) if "rollout/compiled" in row
    ]
    assert compiled == [0.0, 0.0]
    # the sampler's compile and capture seconds so far, each step: none captured on the CPU
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    spent = [
        (row["time/sampler_compile_total"], row["time/sampler_capture_total"])
        for row in steps
        if "rollout/compiled" in row
    ]
    assert [capture for _, capture in spent] == [0.0, 0.0]
    assert 0.0 <= spent[0][0] <= spent[1][0]


@pytest.mark.parametrize("dynamic", [False, True], ids=["per-bucket", "dynamic"])
def test_each_buckets_regions_compile_once_before_their_capture(monkeypatch, dynamic):
    """With graphs (CUDA's API faked), every region compiles in the warm-up before its
    bucket's capture, never inside one, and exactly once, not again after an in-place weight
    update: one compiled code serves every layer, and each bucket's regions have a cache of
    their own (Dynamo's cache of a code object holds 8 entries, past which a `fullgraph` compile
    fails; here the layer's needs 9), or with `dynamic_compile` one compilation of each region
    serves every bucket of both workspaces and a wider prompt. Dynamo's eager backend stands in
    for inductor, which this test does not need."""
    pools = FakePools()
    pools.install(monkeypatch)
    fake_graph, capturing = torch.cuda.graph, []

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, **kwargs):
        with fake_graph(cuda_graph, pool=pool, **kwargs):
            capturing.append(True)
            yield
            capturing.pop()

    monkeypatch.setattr(torch.cuda, "graph", graph)
    created, compiled_while_capturing = [], []

    def backend(module: torch.fx.GraphModule, example_inputs) -> Callable:
        compiled_while_capturing.append(bool(capturing))
        return module.forward

    real_compile = torch.compile

    def compile_(fn, **options):
        created.append(fn.__name__)
        return real_compile(fn, backend=backend, **options)

    monkeypatch.setattr(torch, "compile", compile_)
    model = make_model("qwen2")
    sampler = GraphSampler(
        model, TOKENIZER, use_graphs=True, compile_step=True, dynamic_compile=dynamic
    )
    # the fake captures run the step: enough columns for the warm-up and five captures
    params = SamplingParams(max_new_tokens=10, seed=0)
    sampler.generate(PROMPTS, 16, params)  # 48 rows: buckets 48, 32, 16, 8
    sampler.generate(PROMPTS * 3, 8, params)  # 72 rows: 72, 64, 32, 16, 8
    if dynamic:
        sampler.generate([PROMPTS[0] * 12], 8, params)  # a wider workspace, 8 rows
    assert sampler.compile_error is None and sampler.graph_error is None
    assert created.count("_layer_step") == (1 if dynamic else 9)
    if dynamic:
        assert len(created) == 4 and len(compiled_while_capturing) == 4
    else:
        assert len(compiled_while_capturing) == len(created)
    assert not any(compiled_while_capturing)
    captures = pools.captures
    perturb_in_place(model, lora=False)  # an optimizer step: no recompile, no recapture
    with torch.compiler.set_stance("fail_on_recompile"):
        sampler.generate(PROMPTS, 16, params)
    assert sampler.compile_error is None, sampler.compile_error
    assert (pools.captures, len(created)) == (captures, len(compiled_while_capturing))


def test_a_scratch_workspace_is_freed_after_its_calls_and_made_again_without_compiling(
    monkeypatch,
):
    """`scratch`, as an evaluation runs: the workspace its call makes (more rows
    than the training call's) is freed with its graphs at its end, and the training call's
    stays; made again by the next evaluation, it captures again but compiles nothing (its
    sizes' regions are kept), and samples the same. CUDA's graph API faked, Dynamo's eager
    backend for inductor."""
    pools = FakePools()
    pools.install(monkeypatch)
    created = []
    real_compile = torch.compile

    def compile_(fn, **options):
        created.append(fn.__name__)
        return real_compile(fn, backend="eager", **options)

    monkeypatch.setattr(torch, "compile", compile_)
    sampler = GraphSampler(make_model("qwen2"), TOKENIZER, use_graphs=True, compile_step=True)
    sampler.generate(PROMPTS, 2, SamplingParams(max_new_tokens=10, seed=0))  # 6 rows
    (training,) = sampler._workspaces
    live = sum(pools.live.values())
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    with sampler.scratch():
        first = sampler.generate(PROMPTS, 8, greedy)  # 24 rows: a workspace of its own
        assert len(sampler._workspaces) == 2
    assert sampler._workspaces == [training] and sum(pools.live.values()) == live
    compiled, captures = len(created), pools.captures
    with torch.compiler.set_stance("fail_on_recompile"), sampler.scratch():
        again = sampler.generate(PROMPTS, 8, greedy)
    assert sampler.compile_error is None, sampler.compile_error
    assert len(created) == compiled and pools.captures > captures
    assert sampler._workspaces == [training] and sum(pools.live.values()) == live
    assert_same_samples(again, first, atol=0)


def test_a_model_with_gradient_checkpointing_compiles_its_step():
    """The trainer's memory plan turns gradient checkpointing on for real models, which hooks
    the input embedding's output with `requires_grad_`: the compiled step must not run that
    hook (a compiled region cannot return such a tensor, and every such run fell back to the
    uncompiled step)."""
    model = model_of("qwen3")
    enable_gradient_checkpointing(model)
    compiled = GraphSampler(model, TOKENIZER, compile_step=True)
    got = compiled.generate(PROMPTS, 2, PARAMS)
    assert compiled.compile_error is None, compiled.compile_error
    eager = GraphSampler(model, TOKENIZER, compile_step=False).generate(PROMPTS, 2, PARAMS)
    assert_same_samples(got, eager, atol=1e-5)
