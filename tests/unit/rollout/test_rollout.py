"""The samplers: shapes and masks, finish reasons, stop strings, determinism, logprob equality
with the trainer's forward, the fast Llama-family decode step (`cpu_llama`) against the HF
forward, and the backend registry."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import transformers
from helpers.episodes import load_qwen3_tokenizer
from helpers.models import EOS, PROMPTS, TOKENIZER, VOCAB, make_model

from oncurve.algo.truncation import Truncation
from oncurve.errors import UserError
from oncurve.model.forward import completion_logprobs
from oncurve.model.kv_cache import cache_argument
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.rollout import (
    BACKENDS,
    SamplerSettings,
    SamplingParams,
    TorchSampler,
    base,
    build_sampler,
    cpu_llama,
)
from oncurve.rollout.base import check_stops
from oncurve.rollout.hf_decoder import DYNAMIC_LAYER_ATTRIBUTES, HFDecoder, _GrowingLayer
from oncurve.rollout.torch_sampler import _stop_candidates, sample_tokens


def sample(model, group=2, backend="cpu_llama", prompts=PROMPTS, **params):
    return build_sampler(backend, model, TOKENIZER).generate(
        prompts, group, SamplingParams(**params)
    )


@pytest.mark.parametrize(
    "kind,backend",
    [
        ("llama", "cpu_llama"),
        ("qwen2", "cpu_llama"),
        ("mistral", "cpu_llama"),
        ("qwen2", "hf"),
        ("gpt2", "hf"),
    ],
)
def test_logprobs_equal_training_forward(kind: str, backend: str) -> None:
    # EOS made likely (bias 0.5, then top-k 20): rows end at different steps, the batch compacts.
    model = make_model(kind, eos_bias=0.5)
    batch = sample(
        model, group=3, backend=backend, max_new_tokens=12, temperature=0.7, top_k=20, seed=1
    )
    assert {"eos", "length"} <= set(batch.finish_reasons)
    assert len(set(batch.completion_lengths.tolist())) >= 3
    width = batch.completion_ids.shape[1]
    ids, mask = batch.input_ids, batch.attention_mask
    # the logprobs of the top-k distribution the rows were drawn from
    truncation = Truncation(top_k=20)
    logprobs, _ = completion_logprobs(model, ids, mask, width, 0.7, truncation=truncation)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)
    assert (batch.logprobs[~mask] == 0).all()


@pytest.mark.parametrize("backend", ["cpu_llama", "hf"])
def test_sampling_under_gradient_checkpointing_in_train_mode(backend: str) -> None:
    # The trainer's setting: HF would silently drop the KV cache in train mode.
    model = make_model("qwen2")
    reference = sample(model, backend=backend, max_new_tokens=6, seed=4)
    enable_gradient_checkpointing(model)
    batch = sample(model, backend=backend, max_new_tokens=6, seed=4)
    assert model.training
    assert torch.equal(batch.completion_ids, reference.completion_ids)
    assert torch.allclose(batch.logprobs, reference.logprobs, atol=1e-6, rtol=0)


def test_greedy_logprobs_are_at_temperature_one() -> None:
    model = make_model("qwen2")
    batch = sample(model, max_new_tokens=6, temperature=0.0)
    logprobs, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, 6, 1.0)
    assert torch.allclose(logprobs, batch.logprobs, atol=1e-5, rtol=0)


def hf_logits(model, ids: torch.Tensor, mask: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
    """`[B*G, P+t, V]` float32 logits of the HF forward over the `[B, P]` left-padded prompts,
    each repeated G times, followed by the `[B*G, t]` tokens `fed`."""
    group = fed.shape[0] // ids.shape[0]
    full_ids = torch.cat([ids.repeat_interleave(group, 0), fed], dim=1)
    full_mask = torch.cat([mask.repeat_interleave(group, 0), torch.ones_like(fed)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        return model(
            input_ids=full_ids, attention_mask=full_mask, position_ids=positions
        ).logits.float()


def decode_against_hf(model: transformers.PreTrainedModel):
    """The decoder, and (its, the HF forward's) `[4, V]` next-token logits after the prefill of
    two prompts of different lengths (G=2) and after each of two decode steps."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    fed = torch.tensor([[20, 30], [21, 31], [22, 32], [23, 33]])
    decoder = cpu_llama.LlamaDecoder(model, rows=4, width=5, new=3)
    with torch.inference_mode():
        steps = [decoder.prefill(ids, mask, group_size=2)]
        with decoder.decoding():
            for t in range(2):
                steps.append(decoder.step(fed[:, t]))
    reference = hf_logits(model, ids, mask, fed)
    return decoder, [(logits, reference[:, 4 + t]) for t, logits in enumerate(steps)]


def use_layout(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `LlamaDecoder` run `fused` (q/k/v one copy) or `plain` (the model's weights)."""
    monkeypatch.setattr(cpu_llama, "FUSE_MAX_BYTES", 2**30 if layout == "fused" else 0)


@pytest.mark.parametrize(
    "kind,layout",
    [
        ("llama", "fused"),
        ("qwen2", "fused"),
        ("qwen2", "plain"),
        ("mistral", "fused"),
    ],
)
def test_fast_decode_step_matches_hf_logits(
    kind: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_layout(layout, monkeypatch)
    model = make_model(kind)
    assert cpu_llama.supports(model, 40)
    decoder, pairs = decode_against_hf(model)
    assert decoder.layers[0].fused == (layout == "fused")
    for logits, reference in pairs:
        assert torch.allclose(logits, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_decode_step_matches_hf_logits_in_bfloat16(kind: str) -> None:
    # bf16 rounding in a different order stays well inside the tolerance, while normalising over
    # the wrong axis (the features-first layout's easy mistake) passes it many times over.
    model = make_model(kind).to(torch.bfloat16)
    for logits, reference in decode_against_hf(model)[1]:
        assert torch.allclose(logits, reference, atol=1e-2, rtol=0)


def cache_shape(decoder) -> tuple[int, ...]:
    """`(rows, kv heads, columns)` allocated in the decoder's first cache layer."""
    if isinstance(decoder, HFDecoder):
        layer = decoder.cache.layers[0]
        assert isinstance(layer, _GrowingLayer)
        return tuple(layer.storage[0].shape[:3])
    return tuple(decoder.keys[0].shape[:3])


@pytest.mark.parametrize(
    "kind,generic,heads,layout",
    [
        ("qwen2", False, 2, "fused"),
        ("gpt2", True, 4, None),
        ("qwen2", True, 2, None),
    ],
)
def test_cache_growth_and_dropped_rows_keep_the_logits_exact(
    kind: str, generic: bool, heads: int, layout: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_GROW_COLUMNS", 4)
    if layout:
        use_layout(layout, monkeypatch)
    model = make_model(kind)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    if generic:
        decoder = HFDecoder(model, rows=4, width=5, new=12, reserve=0)
    else:
        decoder = cpu_llama.LlamaDecoder(model, rows=4, width=5, new=12)
    fed = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(4)
    with torch.inference_mode():
        decoder.prefill(ids, mask, group_size=2)
        assert cache_shape(decoder) == (4, heads, 9)  # the prompt and _GROW_COLUMNS, not all 17
        if generic:  # HF's attention reads `keys`: a view of the 5 written columns, not all 9
            assert decoder.cache.layers[0].keys.shape[2] == 5
        with decoder.decoding():
            for t in range(12):
                if t == 6:  # rows 1 and 2 end between the two growths; 0 and 3 move up front
                    decoder.keep(torch.tensor([0, 3]))
                    rows = rows[[0, 3]]
                logits = decoder.step(fed[rows, t])
            # grown 9 -> 13 columns with 4 rows, then 13 -> 17 with the 2 live rows only
            assert cache_shape(decoder) == (2, heads, 17)
    reference = hf_logits(model, ids, mask, fed)[rows, -1]
    assert torch.allclose(logits, reference, atol=1e-5, rtol=0)


def test_generic_path_keeps_hf_sliding_window_layers_exact() -> None:
    model = make_model("mistral", eos_bias=0.5)
    model.config.sliding_window = 8
    assert not cpu_llama.supports(model, 20)
    batch = sample(model, group=3, max_new_tokens=12, temperature=0.7, top_k=20, seed=1)
    assert max(batch.prompt_mask.sum(1)) + max(batch.completion_lengths) > 8  # the window slides
    width = batch.completion_ids.shape[1]
    ids, mask = batch.input_ids, batch.attention_mask
    # the logprobs of the top-k distribution the rows were drawn from
    truncation = Truncation(top_k=20)
    logprobs, _ = completion_logprobs(model, ids, mask, width, 0.7, truncation=truncation)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)


def test_fast_path_declined_for_gpt2_and_short_windows() -> None:
    assert not cpu_llama.supports(make_model("gpt2"), 10)
    mistral = make_model("mistral")
    mistral.config.sliding_window = 8
    assert not cpu_llama.supports(mistral, 10)
    assert cpu_llama.supports(mistral, 8)


def test_a_prompt_as_wide_as_the_window_and_one_new_token_decodes_as_hf() -> None:
    mistral = make_model("mistral")
    mistral.config.sliding_window = 8
    prompt = [[1, *range(10, 17)]]  # 8 tokens: the window, with nothing to slide
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    fast = build_sampler("cpu_llama", mistral, TOKENIZER).generate_ids(prompt, 2, params)
    generic = build_sampler("hf", mistral, TOKENIZER).generate_ids(prompt, 2, params)
    assert fast.completion_ids.tolist() == generic.completion_ids.tolist()
    assert torch.allclose(fast.logprobs, generic.logprobs, atol=1e-6, rtol=0)


def test_shapes_masks_and_group_layout() -> None:
    batch = sample(make_model("qwen2"), group=3, max_new_tokens=5, seed=0)
    lengths = [len(TOKENIZER(p)["input_ids"]) for p in PROMPTS]
    width = max(lengths)
    assert batch.prompt_ids.shape == (9, width) and batch.group_size == 3
    assert batch.prompt_mask.sum(1).tolist() == [n for n in lengths for _ in range(3)]
    for i, prompt in enumerate(PROMPTS):
        expected = TOKENIZER(prompt)["input_ids"]
        for row in range(3 * i, 3 * i + 3):  # a prompt's G rows are contiguous
            assert batch.prompt_ids[row, width - len(expected) :].tolist() == expected
            assert (batch.prompt_ids[row, : width - len(expected)] == TOKENIZER.pad_token_id).all()
    n = batch.completion_lengths
    positions = torch.arange(batch.completion_ids.shape[1])
    assert torch.equal(batch.completion_mask.bool(), positions[None] < n[:, None])
    assert (batch.completion_ids[~batch.completion_mask.bool()] == TOKENIZER.pad_token_id).all()
    assert len(batch.texts) == len(batch.finish_reasons) == 9


@pytest.mark.parametrize("backend", ["cpu_llama", "hf"])
def test_every_row_ends_at_once_on_eos(backend: str) -> None:
    batch = sample(make_model("llama", eos_bias=100.0), backend=backend, max_new_tokens=8, seed=0)
    assert batch.finish_reasons == ["eos"] * 6
    assert batch.completion_ids.tolist() == [[EOS]] * 6
    assert batch.completion_mask.tolist() == [[1]] * 6
    assert batch.texts == [""] * 6


def test_min_new_tokens_suppresses_eos() -> None:
    batch = sample(make_model("llama", eos_bias=100.0), max_new_tokens=8, min_new_tokens=3, seed=0)
    assert batch.finish_reasons == ["eos"] * 6
    assert batch.completion_lengths.tolist() == [4] * 6
    assert (batch.completion_ids[:, 3] == EOS).all() and (batch.completion_ids[:, :3] != EOS).all()


@pytest.mark.parametrize("backend", ["cpu_llama", "hf"])
def test_no_row_ends_truncated_at_max_length(backend: str) -> None:
    batch = sample(make_model("qwen2", eos_bias=-100.0), backend=backend, max_new_tokens=7, seed=3)
    assert batch.finish_reasons == ["length"] * 6
    assert batch.completion_mask.shape == (6, 7) and batch.completion_mask.all()
    assert batch.texts == TOKENIZER.batch_decode(batch.completion_ids, skip_special_tokens=True)


@pytest.mark.parametrize("backend", ["cpu_llama", "hf"])
def test_stop_string_ends_row_and_cuts_text(backend: str) -> None:
    model = make_model("qwen2", eos_bias=-100.0)
    plain = sample(model, group=1, backend=backend, max_new_tokens=16, temperature=0.0)
    stop = plain.texts[0][4:6]  # ends the first row at its 6th token at the latest
    cut = plain.texts[0].find(stop) + len(stop)
    stopped = sample(
        model, group=1, backend=backend, max_new_tokens=16, temperature=0.0, stop=(stop,)
    )
    assert stopped.finish_reasons[0] == "stop"
    assert stopped.texts[0] == plain.texts[0][:cut]
    assert stopped.completion_lengths[0] == cut
    assert torch.equal(stopped.completion_ids[0, :cut], plain.completion_ids[0, :cut])
    # rows whose text never holds the stop string are unchanged; with this seed's model and
    # greedy decoding, neither other row does
    for i in (1, 2):
        assert stop not in plain.texts[i], plain.texts[i]
        assert stopped.texts[i] == plain.texts[i] and stopped.finish_reasons[i] == "length"
        assert torch.equal(stopped.completion_ids[i], plain.completion_ids[i])


def test_stop_candidates_are_tokens_holding_the_last_character() -> None:
    table = _stop_candidates(TOKENIZER, ("</a>", "##"), VOCAB)
    flagged = {TOKENIZER.convert_ids_to_tokens(i) for i in table.nonzero().flatten().tolist()}
    assert flagged == {">", "#"}
    padded = _stop_candidates(TOKENIZER, ("</a>",), VOCAB + 3)  # lm_head wider than tokenizer
    assert padded.shape == (VOCAB + 3,) and not padded[VOCAB:].any()


def test_seed_determinism_and_global_rng_untouched() -> None:
    model = make_model("qwen2")
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = sample(model, max_new_tokens=10, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    again = sample(model, max_new_tokens=10, seed=7)
    other = sample(model, max_new_tokens=10, seed=8)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert torch.equal(first.logprobs, again.logprobs)
    assert not torch.equal(first.completion_ids, other.completion_ids)


def test_fast_and_generic_paths_agree_greedy() -> None:
    model = make_model("mistral", eos_bias=2.0)
    fast = sample(model, max_new_tokens=10, temperature=0.0)
    generic = sample(model, backend="hf", max_new_tokens=10, temperature=0.0)
    assert torch.equal(fast.completion_ids, generic.completion_ids)
    assert fast.finish_reasons == generic.finish_reasons


def test_filters_that_keep_one_token_are_greedy() -> None:
    model = make_model("llama")
    greedy = sample(model, max_new_tokens=6, temperature=0.0).completion_ids
    for filters in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        batch = sample(model, max_new_tokens=6, temperature=1.5, seed=0, **filters)
        assert torch.equal(batch.completion_ids, greedy), filters


def test_sample_tokens_top_p_keeps_the_nucleus() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(4000, 4)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, SamplingParams(top_p=0.7), generator)
    counts = torch.bincount(tokens, minlength=4)
    assert counts[2:].sum() == 0  # 0.5 + 0.3 already reach 0.7
    assert abs(counts[0] / 4000 - 0.5 / 0.8) < 0.03
    # the logprobs are the nucleus's, renormalised: log 0.5 / 0.8 and log 0.3 / 0.8
    nucleus = torch.tensor([0.5, 0.3]).div(0.8).log()
    assert torch.allclose(logprobs, nucleus[tokens], atol=1e-6)


def test_invalid_input_is_reported() -> None:
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    sampler = TorchSampler(make_model("qwen2"), TOKENIZER)
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate_ids([[5], []], 2, SamplingParams())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        sampler.generate_ids([[5]], 2, SamplingParams(max_new_tokens=200))


class _OldForward(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None): ...


class _NewForward(torch.nn.Module):
    def forward(self, input_ids, cache=None): ...


@pytest.mark.parametrize("backend", ["cpu_llama", "hf"])
def test_the_kv_cache_goes_by_the_name_the_installed_forward_takes(backend: str) -> None:
    """transformers 5.24 renamed `past_key_values` to `cache` and warns on the old name at every
    call; both names must keep working."""
    assert cache_argument(_OldForward(), "kv") == {"past_key_values": "kv"}
    assert cache_argument(_NewForward(), "kv") == {"cache": "kv"}
    model = make_model("qwen2")
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 10]])  # one prompt (5, 6), two completions
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample(model, backend=backend, max_new_tokens=4, seed=0)
        completion_logprobs(model, ids, mask, 2, prompt_index=torch.tensor([0, 0]))


def test_auto_backend_is_cpu_llama_for_a_llama_family_model_on_the_cpu_else_hf() -> None:
    llama = build_sampler("auto", make_model("llama"), TOKENIZER)
    assert isinstance(llama, TorchSampler) and llama.make_decoder is cpu_llama.make_decoder
    gpt2 = build_sampler("auto", make_model("gpt2"), TOKENIZER)
    assert isinstance(gpt2, TorchSampler) and gpt2.make_decoder is HFDecoder
    # an active window only sends the calls it would slide in to the HF step
    mistral = make_model("mistral")
    mistral.config.sliding_window = 8
    assert build_sampler("auto", mistral, TOKENIZER).make_decoder is cpu_llama.make_decoder
    assert isinstance(cpu_llama.make_decoder(mistral, 2, 4, 4, 0), cpu_llama.LlamaDecoder)
    assert isinstance(cpu_llama.make_decoder(mistral, 2, 4, 5, 0), HFDecoder)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_keeps_the_sampler_contract(backend: str) -> None:
    """What `oncurve.rollout.base.Sampler` promises, for each registered backend."""
    model = make_model("qwen2", eos_bias=0.5)
    params = dict(group=3, backend=backend, max_new_tokens=12, temperature=0.7, seed=1)
    batch = sample(model, **params)
    rows, width, length = 9, batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    assert batch.prompt_mask.shape == (rows, width) and batch.group_size == 3
    assert batch.completion_mask.shape == batch.logprobs.shape == (rows, length)
    assert batch.logprobs.dtype == torch.float32 and batch.completion_ids.dtype == torch.long
    assert length == int(batch.completion_lengths.max())
    assert len(batch.texts) == len(batch.finish_reasons) == rows
    logprobs, _ = completion_logprobs(model, batch.input_ids, batch.attention_mask, length, 0.7)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)
    assert (batch.logprobs[~mask] == 0).all()
    again = sample(model, **params)
    assert torch.equal(again.completion_ids, batch.completion_ids)
    assert torch.equal(again.logprobs, batch.logprobs)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_declares_what_a_training_loop_needs_of_it(backend: str) -> None:
    """The loop reads a backend only through the protocol: traits on the class, and a scratch
    scope, a release, metrics and the settings it dropped on the instance."""
    model = make_model("qwen2")
    sampler = build_sampler(backend, model, TOKENIZER)
    kind = BACKENDS[backend].sampler
    assert type(sampler) is kind
    traits = (kind.exact_logprobs, kind.holds_cache, kind.compiles_steps)
    assert traits == ((False, True, True) if backend == "cuda_graph" else (True, False, False))
    sampler.prepare(SamplerSettings(longest_prompt=7, cuda_graphs=False, compile=False))
    params = SamplingParams(max_new_tokens=4, temperature=0.7, seed=1)
    with sampler.scratch():
        sampler.generate(["ab", "abc"], 2, params)
    sampler.release()
    assert sampler.turned_off() == {}  # nothing asked for, nothing failed
    metrics = sampler.metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert sorted(metrics) == (
        ["time/sampler_capture_total", "time/sampler_compile_total"]
        if backend == "cuda_graph"
        else []
    )


def test_an_unknown_backend_is_a_one_line_user_error_naming_the_setting_and_the_choices() -> None:
    with pytest.raises(UserError) as caught:
        build_sampler("vllm_typo", make_model("qwen2"), TOKENIZER)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("rollout.backend='vllm_typo'")
    assert all(name in message for name in ("auto", *BACKENDS))


def test_transformers_dynamic_layer_keeps_the_state_growing_layer_writes() -> None:
    """`_GrowingLayer` sets `DynamicLayer`'s attributes itself, for HF's attention and mask code
    to read: if transformers renames or drops one, this fails instead of the cache going stale."""
    states = torch.randn(2, 1, 3, 4)
    layer = transformers.cache_utils.DynamicLayer()
    layer.update(states, states)
    missing = set(DYNAMIC_LAYER_ATTRIBUTES) - set(vars(layer))
    assert not missing, f"transformers' DynamicLayer no longer sets {sorted(missing)}"
    growing = _GrowingLayer(reserve=0, limit=8)
    growing.update(states, states)
    for name in DYNAMIC_LAYER_ATTRIBUTES:
        assert type(getattr(growing, name)) is type(getattr(layer, name)), name
    assert growing.get_seq_length() == layer.get_seq_length() == 3
    assert growing.get_mask_sizes(1) == layer.get_mask_sizes(1)


def test_a_stop_string_that_is_a_special_token_is_refused() -> None:
    qwen3 = load_qwen3_tokenizer()
    check_stops(["</answer>", "\n\n"], qwen3, "rollout.stop")
    for special in ("<|im_start|>", "<|endoftext|>"):
        with pytest.raises(UserError, match=rf"rollout.stop: '{re.escape(special)}' is a special"):
            check_stops([special], qwen3, "rollout.stop")
