"""The `cuda_graph` backend's static decode: on the CPU its step runs eagerly, so its
arithmetic, compaction, determinism and weight sharing are checked here; graph capture and
replay are checked by the `gpu` tests at the end."""

from __future__ import annotations

import weakref

import pytest
import torch
from helpers.graph_sampler import trained_logprobs
from helpers.models import EOS, PROMPTS, TOKENIZER, make_model, model_of

from oncurve.loop.preflight import Tolerances
from oncurve.rollout import SamplingParams, build_sampler, cuda_graph
from oncurve.rollout.cuda_graph import GraphSampler, bucket_for, buckets


def test_buckets_halve_down_to_the_smallest():
    assert buckets(64) == [64, 32, 16, 8]
    assert buckets(48) == [48, 32, 16, 8]
    assert buckets(8) == [8] and buckets(5) == [5]
    assert [bucket_for(n, buckets(64)) for n in (64, 33, 32, 9, 1)] == [64, 64, 32, 16, 8]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_logprobs_of_its_samples_equal_the_training_forward(kind):
    model = model_of(kind)
    sampler = GraphSampler(model, TOKENIZER)
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, seed=1)
    batch = sampler.generate(PROMPTS, 3, params)
    assert batch.num_rows == 9 and batch.completion_mask.sum() > 9
    expected = trained_logprobs(model, batch, 0.7, params.truncation)
    torch.testing.assert_close(batch.logprobs, expected, atol=2e-5, rtol=0)


def test_bfloat16_logprobs_stay_within_the_preflight_tolerance():
    """In bf16 the static step and the training forward round differently; the gap is what
    `algo.is_correction` corrects, and must stay within what the preflight accepts."""
    model = make_model("qwen2").to(torch.bfloat16)
    batch = GraphSampler(model, TOKENIZER).generate(
        PROMPTS, 4, SamplingParams(max_new_tokens=12, seed=0)
    )
    gap = (batch.logprobs - trained_logprobs(model, batch, 1.0)).abs()
    mask = batch.completion_mask.bool()
    assert float(gap[mask].mean()) < Tolerances.of(torch.bfloat16).logprob
    assert float(gap[mask].max()) < 0.25


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_equals_generate_token_for_token(kind):
    model = model_of(kind)
    batch = GraphSampler(model, TOKENIZER).generate(
        PROMPTS, 1, SamplingParams(max_new_tokens=10, temperature=0.0)
    )
    for i, prompt in enumerate(PROMPTS):
        ids = TOKENIZER([prompt], return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=EOS)
        want = out[0, ids.shape[1] :].tolist()
        got = batch.completion_ids[i, : int(batch.completion_mask[i].sum())].tolist()
        assert got == want[: len(got)] and (len(got) == len(want) or got[-1] == EOS)


def test_same_seed_same_tokens_other_seed_other_tokens():
    model = make_model("qwen2")
    sampler = GraphSampler(model, TOKENIZER)

    def draw(seed: int) -> torch.Tensor:
        return sampler.generate(PROMPTS, 4, SamplingParams(max_new_tokens=12, seed=seed))

    a, b, c = draw(3), draw(3), draw(4)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_compacting_finished_rows_changes_no_sample(monkeypatch):
    """An EOS bias ends rows at scattered steps; moving to smaller buckets must sample exactly
    what decoding every row to the end samples."""
    model = make_model("qwen2", eos_bias=2.0)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)
    prompts = PROMPTS * 6  # 18 prompts x 2 = 36 rows: buckets 36, 32, 16, 8
    compacted_to = []
    real_compact = GraphSampler._compact

    def compact(self, ws, rows, smaller):
        compacted_to.append(smaller)
        return real_compact(self, ws, rows, smaller)

    monkeypatch.setattr(GraphSampler, "_compact", compact)
    compacted = GraphSampler(model, TOKENIZER).generate(prompts, 2, params)
    assert compacted_to and compacted_to == sorted(compacted_to, reverse=True)
    monkeypatch.setattr(cuda_graph.sampler, "buckets", lambda rows: [rows])
    whole = GraphSampler(model, TOKENIZER).generate(prompts, 2, params)
    assert {"eos", "length"} <= set(whole.finish_reasons)
    assert whole.finish_reasons == compacted.finish_reasons
    assert torch.equal(whole.completion_ids, compacted.completion_ids)
    torch.testing.assert_close(whole.logprobs, compacted.logprobs, atol=1e-6, rtol=0)


def test_the_next_rollout_samples_weights_changed_in_place():
    model = make_model("llama")
    sampler = GraphSampler(model, TOKENIZER)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = sampler.generate(PROMPTS, 1, params)
    with torch.no_grad():  # as an optimizer step does: same tensors, new values
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    after = sampler.generate(PROMPTS, 1, params)
    assert not torch.equal(before.logprobs, after.logprobs)
    torch.testing.assert_close(
        after.logprobs, trained_logprobs(model, after, 1.0), atol=2e-5, rtol=0
    )


def test_lora_adapters_are_sampled():
    peft = pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    model = make_model("qwen2")
    adapted = peft.get_peft_model(
        model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    base = adapted.get_base_model()
    batch = GraphSampler(base, TOKENIZER).generate(
        PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=2)
    )
    torch.testing.assert_close(
        batch.logprobs, trained_logprobs(base, batch, 1.0), atol=2e-5, rtol=0
    )
    with adapted.disable_adapter():
        plain = trained_logprobs(base, batch, 1.0)
    assert float((plain - batch.logprobs).abs().max()) > 1e-3


def test_stop_strings_and_min_new_tokens():
    model = make_model("qwen2", eos_bias=4.0)
    early = GraphSampler(model, TOKENIZER).generate(
        PROMPTS, 2, SamplingParams(max_new_tokens=10, min_new_tokens=6, seed=0)
    )
    assert int(early.completion_mask.sum(1).min()) >= 6
    plain = make_model("qwen2")
    greedy = GraphSampler(plain, TOKENIZER).generate(
        PROMPTS[:1], 1, SamplingParams(max_new_tokens=16, temperature=0.0)
    )
    text = greedy.texts[0]
    stop = text[3:5]  # a stop string the greedy text reaches after a few tokens
    stopped = GraphSampler(plain, TOKENIZER).generate(
        PROMPTS[:1], 1, SamplingParams(max_new_tokens=16, temperature=0.0, stop=(stop,))
    )
    assert stopped.finish_reasons == ["stop"] and stopped.texts[0].endswith(stop)
    assert text.startswith(stopped.texts[0])


def test_unsupported_models_are_refused():
    assert not cuda_graph.supports(make_model("gpt2"))
    assert cuda_graph.supports(make_model("mistral"))
    with pytest.raises(ValueError, match="use rollout.backend=hf"):
        build_sampler("cuda_graph", make_model("gpt2"), TOKENIZER).generate(
            PROMPTS, 1, SamplingParams(max_new_tokens=4)
        )


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
def test_graph_replay_samples_what_the_eager_step_samples_and_survives_weight_updates():
    model = make_model("qwen2").cuda()
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=7)
    eager = GraphSampler(model, TOKENIZER, use_graphs=False).generate(PROMPTS * 4, 4, params)
    graphed = GraphSampler(model, TOKENIZER)
    replayed = graphed.generate(PROMPTS * 4, 4, params)
    assert graphed.capture_seconds > 0
    assert torch.equal(replayed.completion_ids, eager.completion_ids)
    torch.testing.assert_close(replayed.logprobs, eager.logprobs, atol=1e-5, rtol=0)
    (workspace,) = graphed._workspaces
    (graphs,) = workspace.graphs.values()  # one set of sampling settings, its buckets
    graphs = dict(graphs)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    moved = graphed.generate(PROMPTS * 4, 4, params)
    assert list(workspace.graphs.values()) == [graphs]  # the same graphs, no recapture
    torch.testing.assert_close(
        moved.logprobs, trained_logprobs(model, moved, 1.0), atol=1e-4, rtol=0
    )


def test_a_release_inside_scratch_frees_the_workspaces_it_found():
    """An evaluation that runs out of memory releases the sampler's workspaces to retry
    smaller: the training workspace it found goes too (the scratch holds it weakly), and the
    retry's own is freed at the end."""
    sampler = GraphSampler(make_model("qwen2"), TOKENIZER, compile_step=False)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    sampler.generate(PROMPTS, 2, params)
    found = weakref.ref(sampler._workspaces[0])
    with sampler.scratch():
        sampler.release()
        assert found() is None
        sampler.generate(PROMPTS, 8, params)
        assert len(sampler._workspaces) == 1
    assert sampler._workspaces == []
