"""TorchSampler: shapes and masks, finish reasons, stop strings, determinism, logprob equality
with the trainer's forward, and the fast Llama-family decode step against the HF forward."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import transformers

from oncurve.models import cache_argument, enable_gradient_checkpointing
from oncurve.rollout import SamplingParams, TorchSampler, decode_llama
from oncurve.rollout.torch_sampler import (
    HFDecoder,
    _GrowingLayer,
    _stop_candidates,
    sample_tokens,
)
from oncurve.tokenizer import char_tokenizer
from oncurve.train_step import completion_logprobs

TOKENIZER = char_tokenizer()
VOCAB = len(TOKENIZER)
EOS = TOKENIZER.eos_token_id
PROMPTS = ["12+34=", "x", "hello world"]


def make_model(
    kind: str, eos_bias: float | None = None, hidden: int = 32
) -> transformers.PreTrainedModel:
    """A random ~30k-parameter model (at `hidden` 32); `eos_bias` adds an lm_head bias on EOS
    only."""
    torch.manual_seed(0)
    sizes = dict(hidden_size=hidden, intermediate_size=2 * hidden)
    common = dict(vocab_size=VOCAB, **sizes, num_hidden_layers=2)
    heads = dict(num_attention_heads=4, max_position_embeddings=128)
    if kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(
            transformers.Qwen2Config(**common, **heads, num_key_value_heads=2)
        )
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**common, **heads, num_key_value_heads=4)
        )
    elif kind == "mistral":
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(**common, **heads, num_key_value_heads=1)
        )
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128
        )
        model = transformers.GPT2LMHeadModel(config)
    model.config.eos_token_id = EOS
    model.generation_config.eos_token_id = EOS
    if eos_bias is not None:
        old = model.get_output_embeddings()
        head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            head.weight.copy_(old.weight)
            head.bias.zero_()
            head.bias[EOS] = eos_bias
        model.set_output_embeddings(head)
    return model.eval()


def sample(model, group=2, fast=True, prompts=PROMPTS, **params):
    return TorchSampler(model, TOKENIZER, fast=fast).generate(
        prompts, group, SamplingParams(**params)
    )


@pytest.mark.parametrize(
    "kind,fast",
    [("llama", True), ("qwen2", True), ("mistral", True), ("qwen2", False), ("gpt2", False)],
)
def test_logprobs_equal_training_forward(kind: str, fast: bool) -> None:
    # EOS made likely (bias 0.5, then top-k 20): rows end at different steps, the batch compacts.
    model = make_model(kind, eos_bias=0.5)
    batch = sample(model, group=3, fast=fast, max_new_tokens=12, temperature=0.7, top_k=20, seed=1)
    assert {"eos", "length"} <= set(batch.finish_reasons)
    assert len(set(batch.completion_lengths.tolist())) >= 3
    logprobs, _ = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1], 0.7
    )
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)
    assert (batch.logprobs[~mask] == 0).all()


def test_packed_decode_returns_the_weights_bit_for_bit_and_trainable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_layout("packed", monkeypatch)
    model = make_model("qwen2", eos_bias=0.5, hidden=256)  # weights of many whole pages
    before = copy.deepcopy(model)
    addresses = [p.data_ptr() for p in model.parameters()]
    batch = sample(model, group=3, max_new_tokens=12, temperature=0.7, top_k=20, seed=1)
    assert [p.data_ptr() for p in model.parameters()] == addresses  # refilled in place
    assert len(set(batch.completion_lengths.tolist())) >= 3  # rows ended, the batch compacted
    for (name, param), original in zip(model.named_parameters(), before.parameters(), strict=True):
        assert torch.equal(param, original), name
        assert param.requires_grad and not param.is_inference(), name
        assert param.is_contiguous(), name
    attn = model.model.layers[0].self_attn
    storages = {p.untyped_storage().data_ptr() for p in (attn.q_proj.weight, attn.k_proj.weight)}
    assert len(storages) == 2  # not views of one concatenated tensor
    logprobs, _ = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1], 0.7
    )
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)
    logprobs[mask].sum().backward()
    assert attn.q_proj.weight.grad is not None and attn.q_proj.weight.grad.abs().sum() > 0


def test_released_pages_read_as_zeros_and_refill_in_place() -> None:
    if not decode_llama.can_pack(torch.zeros(1)):
        pytest.skip("packing needs Linux and oneDNN")
    weight = torch.arange(2**18, dtype=torch.float32)  # 1 MB: whole pages inside it
    decode_llama._release_pages(weight)
    zeros = weight == 0
    assert zeros.float().mean() > 0.98  # all but the partial pages at either end
    assert zeros[2**17]  # a page in the middle was given back
    weight.copy_(torch.arange(2**18, dtype=torch.float32))
    assert torch.equal(weight, torch.arange(2**18, dtype=torch.float32))


def test_packed_decode_restores_the_weights_when_a_step_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_layout("packed", monkeypatch)
    model = make_model("llama", hidden=256)
    before = copy.deepcopy(model)
    real_step = decode_llama.LlamaDecoder.step
    steps = []

    def failing_step(self, tokens):
        assert len(self.layers[0].packed) == 4  # q/k/v, o, gate/up, down stand in
        steps.append(tokens.shape[0])
        if len(steps) == 3:
            raise RuntimeError("interrupted")
        return real_step(self, tokens)

    monkeypatch.setattr(decode_llama.LlamaDecoder, "step", failing_step)
    with pytest.raises(RuntimeError, match="interrupted"):
        sample(model, max_new_tokens=8, min_new_tokens=8)
    assert len(steps) == 3
    for param, original in zip(model.parameters(), before.parameters(), strict=True):
        assert torch.equal(param, original)


@pytest.mark.parametrize("fast", [True, False])
def test_sampling_under_gradient_checkpointing_in_train_mode(fast: bool) -> None:
    # The trainer's setting: HF would silently drop the KV cache in train mode.
    model = make_model("qwen2")
    reference = sample(model, fast=fast, max_new_tokens=6, seed=4)
    enable_gradient_checkpointing(model)
    batch = sample(model, fast=fast, max_new_tokens=6, seed=4)
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
    decoder = decode_llama.LlamaDecoder(model, rows=4, width=5, new=3)
    with torch.inference_mode():
        steps = [decoder.prefill(ids, mask, group_size=2)]
        with decoder.decoding():
            for t in range(2):
                steps.append(decoder.step(fed[:, t]))
    reference = hf_logits(model, ids, mask, fed)
    return decoder, [(logits, reference[:, 4 + t]) for t, logits in enumerate(steps)]


def use_layout(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `LlamaDecoder` run `fused` (features first, q/k/v one copy), `plain` (features
    first on the model's weights) or `packed` (rows first on oneDNN's reordered weights)."""
    monkeypatch.setattr(decode_llama, "FUSE_MAX_BYTES", 2**30 if layout == "fused" else 0)
    if layout == "plain":
        monkeypatch.setattr(decode_llama, "_reorder_linear_weight", None)
    elif layout == "packed" and not decode_llama.can_pack(torch.zeros(1)):
        pytest.skip("this torch build has no oneDNN linear")


@pytest.mark.parametrize(
    "kind,layout",
    [
        ("llama", "fused"),
        ("qwen2", "fused"),
        ("qwen2", "plain"),
        ("qwen2", "packed"),
        ("llama", "packed"),
        ("mistral", "fused"),
    ],
)
def test_fast_decode_step_matches_hf_logits(
    kind: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_layout(layout, monkeypatch)
    model = make_model(kind)
    assert decode_llama.supports(model, 40)
    decoder, pairs = decode_against_hf(model)
    assert (decoder.layers[0].fused, decoder.packs) == (layout == "fused", layout == "packed")
    for logits, reference in pairs:
        assert torch.allclose(logits, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_decode_step_matches_hf_logits_in_bfloat16(kind: str) -> None:
    # These logits are ~0.3 in size; bf16 rounding in a different order leaves ~2e-3, while
    # normalising over the wrong axis (the features-first layout's easy mistake) is off by 0.1.
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
        ("qwen2", False, 2, "packed"),
        ("gpt2", True, 4, None),
        ("qwen2", True, 2, None),
    ],
)
def test_cache_growth_and_dropped_rows_keep_the_logits_exact(
    kind: str, generic: bool, heads: int, layout: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decode_llama, "_GROW_COLUMNS", 4)
    if layout:
        use_layout(layout, monkeypatch)
    model = make_model(kind)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    if generic:
        decoder = HFDecoder(model, rows=4, width=5, new=12, reserve=0)
    else:
        decoder = decode_llama.LlamaDecoder(model, rows=4, width=5, new=12)
    fed = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(4)
    with torch.inference_mode():
        decoder.prefill(ids, mask, group_size=2)
        assert cache_shape(decoder) == (4, heads, 9)  # the prompt and _GROW_COLUMNS, not all 17
        if generic:  # HF's attention reads `keys`: a view of the 5 written columns, not all 9
            assert decoder.cache.layers[0].keys.shape[2] == 5
        with contextlib.nullcontext() if generic else decoder.decoding():
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
    assert not decode_llama.supports(model, 20)
    batch = sample(model, group=3, max_new_tokens=12, temperature=0.7, top_k=20, seed=1)
    assert max(batch.prompt_mask.sum(1)) + max(batch.completion_lengths) > 8  # the window slides
    logprobs, _ = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1], 0.7
    )
    mask = batch.completion_mask.bool()
    assert torch.allclose(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)


def test_fast_path_declined_for_gpt2_and_short_windows() -> None:
    assert not decode_llama.supports(make_model("gpt2"), 10)
    mistral = make_model("mistral")
    mistral.config.sliding_window = 8
    assert not decode_llama.supports(mistral, 10)
    assert decode_llama.supports(mistral, 8)


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


@pytest.mark.parametrize("fast", [True, False])
def test_every_row_ends_at_once_on_eos(fast: bool) -> None:
    batch = sample(make_model("llama", eos_bias=100.0), fast=fast, max_new_tokens=8, seed=0)
    assert batch.finish_reasons == ["eos"] * 6
    assert batch.completion_ids.tolist() == [[EOS]] * 6
    assert batch.completion_mask.tolist() == [[1]] * 6
    assert batch.texts == [""] * 6


def test_min_new_tokens_suppresses_eos() -> None:
    batch = sample(make_model("llama", eos_bias=100.0), max_new_tokens=8, min_new_tokens=3, seed=0)
    assert batch.finish_reasons == ["eos"] * 6
    assert batch.completion_lengths.tolist() == [4] * 6
    assert (batch.completion_ids[:, 3] == EOS).all() and (batch.completion_ids[:, :3] != EOS).all()


@pytest.mark.parametrize("fast", [True, False])
def test_no_row_ends_truncated_at_max_length(fast: bool) -> None:
    batch = sample(make_model("qwen2", eos_bias=-100.0), fast=fast, max_new_tokens=7, seed=3)
    assert batch.finish_reasons == ["length"] * 6
    assert batch.completion_mask.shape == (6, 7) and batch.completion_mask.all()
    assert batch.texts == TOKENIZER.batch_decode(batch.completion_ids, skip_special_tokens=True)


@pytest.mark.parametrize("fast", [True, False])
def test_stop_string_ends_row_and_cuts_text(fast: bool) -> None:
    model = make_model("qwen2", eos_bias=-100.0)
    plain = sample(model, group=1, fast=fast, max_new_tokens=16, temperature=0.0)
    stop = plain.texts[0][4:6]  # ends the first row at its 6th token at the latest
    cut = plain.texts[0].find(stop) + len(stop)
    stopped = sample(model, group=1, fast=fast, max_new_tokens=16, temperature=0.0, stop=(stop,))
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
    generic = sample(model, fast=False, max_new_tokens=10, temperature=0.0)
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
    assert torch.allclose(logprobs, logits.gather(1, tokens[:, None]).squeeze(1), atol=1e-6)


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


@pytest.mark.parametrize("fast", [True, False])
def test_the_kv_cache_goes_by_the_name_the_installed_forward_takes(fast: bool) -> None:
    """transformers 5.24 renamed `past_key_values` to `cache` and warns on the old name at every
    call; both names must keep working."""
    assert cache_argument(_OldForward(), "kv") == {"past_key_values": "kv"}
    assert cache_argument(_NewForward(), "kv") == {"cache": "kv"}
    model = make_model("qwen2")
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 10]])  # one prompt (5, 6), two completions
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample(model, fast=fast, max_new_tokens=4, seed=0)
        completion_logprobs(model, ids, mask, 2, prompt_index=torch.tensor([0, 0]))
