"""The truncated distribution (top-k, top-p, min-p) against a brute-force computation on a
vocabulary of 7: which tokens are kept (ties included), the logprobs of the unchunked and the
chunked head, their gradients, and the entropy; and the sampler's logprobs against the
training forward's."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.models import TOKENIZER, make_model

from oncurve.algo import entropy_from_logits, logprobs_from_hidden, logprobs_from_logits
from oncurve.algo.truncation import KEEP_ALL, Truncation, keep_mask, keep_threshold
from oncurve.rollout import SamplingParams
from oncurve.rollout.torch_sampler import TorchSampler, sample_tokens
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs

# probabilities with ties at 0.2, 0.1 and 0.05, in a shuffled order
PROBS = [0.1, 0.3, 0.05, 0.2, 0.1, 0.2, 0.05]
LOGITS = torch.tensor(PROBS).log()


def brute_kept(logits: list[float], truncation: Truncation) -> set[int]:
    """The kept tokens by the definition, one token at a time, in float64."""
    kept = set(range(len(logits)))
    if truncation.top_k > 0:
        kth = sorted(logits, reverse=True)[min(truncation.top_k, len(logits)) - 1]
        kept = {v for v in kept if logits[v] >= kth}
    z = sum(math.exp(logits[v]) for v in kept)
    probs = {v: math.exp(logits[v]) / z for v in kept}
    if truncation.top_p < 1:
        mass, floor = 0.0, 0.0
        for v in sorted(kept, key=lambda v: -probs[v]):
            if mass >= truncation.top_p:
                break
            mass, floor = mass + probs[v], probs[v]
        kept = {v for v in kept if probs[v] >= floor}
    if truncation.min_p > 0:
        top = max(probs.values())
        kept = {v for v in kept if probs[v] >= truncation.min_p * top}
    return kept


def brute_logprob(logits: list[float], label: int, truncation: Truncation) -> float:
    """log p_label over the kept tokens and the label itself."""
    normaliser = brute_kept(logits, truncation) | {label}
    return logits[label] - math.log(sum(math.exp(logits[v]) for v in normaliser))


def brute_gradient(logits: list[float], label: int, truncation: Truncation) -> list[float]:
    """d logp / d logits: onehot(label) - the softmax over the kept tokens and the label."""
    normaliser = brute_kept(logits, truncation) | {label}
    z = sum(math.exp(logits[v]) for v in normaliser)
    return [(v == label) - (math.exp(logits[v]) / z if v in normaliser else 0.0) for v in range(7)]


# each with the tokens it keeps of PROBS, worked out by hand
CASES = {
    "top_k 1": (Truncation(top_k=1), {1}),
    "top_k 2, the tie at 0.2 kept": (Truncation(top_k=2), {1, 3, 5}),
    "top_k 4, the tie at 0.1 kept": (Truncation(top_k=4), {0, 1, 3, 4, 5}),
    "top_p 0.25": (Truncation(top_p=0.25), {1}),
    "top_p 0.45, the tie at 0.2 kept": (Truncation(top_p=0.45), {1, 3, 5}),
    "top_p 0.75": (Truncation(top_p=0.75), {0, 1, 3, 4, 5}),
    "min_p 0.5": (Truncation(min_p=0.5), {1, 3, 5}),
    "min_p 0.2": (Truncation(min_p=0.2), {0, 1, 3, 4, 5}),
    # 0.3 / 0.7 and 0.2 / 0.7: 0.43 and 0.29 each, so 0.5 of the mass takes two of the three
    "top_k 2 then top_p 0.5": (Truncation(top_k=2, top_p=0.5), {1, 3, 5}),
    "top_k 5 then top_p 0.5": (Truncation(top_k=5, top_p=0.5), {1, 3, 5}),
    "top_k 3 then min_p 0.9": (Truncation(top_k=3, min_p=0.9), {1}),
    "top_p 0.8 then min_p 0.4": (Truncation(top_p=0.8, min_p=0.4), {1, 3, 5}),
    "all three": (Truncation(top_k=6, top_p=0.95, min_p=0.3), {0, 1, 3, 4, 5}),
    "none dropped": (Truncation(top_p=0.999), set(range(7))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_kept_tokens_are_the_definitions(case, temperature):
    truncation, by_hand = CASES[case]
    scaled = LOGITS / temperature
    brute = brute_kept(scaled.tolist(), truncation)
    if temperature == 1.0:
        assert brute == by_hand
    mask = keep_mask(scaled[None], truncation)[0]
    assert set(mask.nonzero().squeeze(1).tolist()) == brute
    threshold = keep_threshold(scaled[None], truncation)
    assert torch.equal(scaled[None] >= threshold, mask[None])
    # a clear margin on both sides, so that the backward's recomputed logits fall the same way
    if len(brute) < 7:
        least_kept = min(scaled[v] for v in brute)
        most_dropped = max(scaled[v] for v in set(range(7)) - brute)
        assert float(threshold) == pytest.approx(float(least_kept + most_dropped) / 2)
    else:
        assert float(threshold) == float("-inf")


def test_the_threshold_keeps_the_masks_tokens_on_random_and_tied_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen)
    logits[:32] = logits[:32].round()  # many ties
    for truncation in (Truncation(top_k=7), Truncation(top_p=0.8), Truncation(3, 0.9, 0.05)):
        mask = keep_mask(logits, truncation)
        assert torch.equal(logits >= keep_threshold(logits, truncation), mask)
        for row in (0, 40):
            kept = set(mask[row].nonzero().squeeze(1).tolist())
            assert kept == brute_kept(logits[row].tolist(), truncation)


@pytest.mark.parametrize("case", list(CASES))
def test_logprobs_and_gradients_are_the_brute_forces(case):
    truncation, _ = CASES[case]
    temperature = 0.7
    logits = (LOGITS.expand(7, 7) + 0.0).requires_grad_()  # one row per label
    labels = torch.arange(7)
    got = logprobs_from_logits(logits, labels, temperature, truncation)
    scaled = (LOGITS / temperature).tolist()
    want = [brute_logprob(scaled, label, truncation) for label in range(7)]
    torch.testing.assert_close(got, torch.tensor(want), rtol=0, atol=1e-6)
    (grad,) = torch.autograd.grad(got.sum(), logits)
    want_grad = [[g / temperature for g in brute_gradient(scaled, y, truncation)] for y in range(7)]
    torch.testing.assert_close(grad, torch.tensor(want_grad), rtol=0, atol=1e-6)


def test_a_kept_token_has_its_truncated_logprob_and_a_dropped_one_counts_itself():
    logprobs = logprobs_from_logits(LOGITS.expand(7, 7), torch.arange(7), 1.0, Truncation(top_k=2))
    # kept {1, 3, 5}: mass 0.7
    assert logprobs[1].item() == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)
    assert logprobs[3].item() == pytest.approx(math.log(0.2 / 0.7), abs=1e-6)
    assert logprobs[0].item() == pytest.approx(math.log(0.1 / 0.8), abs=1e-6)
    assert logprobs[2].item() == pytest.approx(math.log(0.05 / 0.75), abs=1e-6)


def test_the_entropy_is_the_truncated_distributions():
    entropy = entropy_from_logits(LOGITS[None], 1.0, Truncation(top_p=0.45))
    kept = torch.tensor([0.3, 0.2, 0.2]) / 0.7
    assert entropy.item() == pytest.approx(float(-(kept * kept.log()).sum()), abs=1e-6)
    assert entropy_from_logits(LOGITS[None], 1.0, KEEP_ALL).item() == pytest.approx(
        -sum(p * math.log(p) for p in PROBS), abs=1e-6
    )


def head_inputs(seed: int, with_bias: bool):
    """[3, 5] positions of a head of 7 tokens; a few labels are outside their row's kept set."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 4, generator=gen).requires_grad_()
    weight = torch.randn(7, 4, generator=gen).requires_grad_()
    bias = torch.randn(7, generator=gen).requires_grad_() if with_bias else None
    labels = torch.randint(0, 7, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, generator=gen)
    return hidden, weight, bias, labels, upstream


def read_bfloat16_head_in_place(monkeypatch) -> None:
    """The CUDA path that reads a bfloat16 head in place (`torch.mm(..., out_dtype=float32)`),
    on the CPU: float32 products of bfloat16 values, summed in float32."""
    import oncurve.algo.logprobs as logprobs_module

    monkeypatch.setattr(logprobs_module, "half_matmul", lambda a, b: a.float() @ b.float())
    monkeypatch.setattr(
        logprobs_module,
        "reads_head_in_place",
        lambda hidden, weight: hidden.dtype == weight.dtype == torch.bfloat16,
    )


@pytest.mark.parametrize("case", ["top_k 2, the tie at 0.2 kept", "top_p 0.75", "all three"])
@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
@pytest.mark.parametrize("head", ["float32", "bfloat16 blocks", "bfloat16 in place"])
def test_the_chunked_head_is_the_brute_force(monkeypatch, case, chunk_size, head):
    """Values, entropy and gradients in hidden, weight and bias, with a float32 head (one
    block) or a bfloat16 one whose backward forms the logits 3 vocabulary rows at a time (so a
    row's label is in one block of three), as float32 copies or read in place."""
    import oncurve.algo.logprobs as logprobs_module

    monkeypatch.setattr(logprobs_module, "HEAD_BLOCK_ROWS", 3)
    if head == "bfloat16 in place":
        read_bfloat16_head_in_place(monkeypatch)
    dtype = torch.float32 if head == "float32" else torch.bfloat16
    truncation, _ = CASES[case]
    hidden, weight, bias, labels, upstream = head_inputs(1, True)
    # the model's tensors, and float32 copies of their values for the brute force
    model = [t.detach().to(dtype).requires_grad_() for t in (hidden, weight, bias)]
    exact = [t.detach().float().requires_grad_() for t in model]
    got, entropy = logprobs_from_hidden(
        model[0], model[1], labels, 0.7, chunk_size, model[2], True, truncation
    )
    logits = exact[0] @ exact[1].T + exact[2]
    scaled = (logits.detach() / 0.7).reshape(15, 7).tolist()
    flat = labels.reshape(15).tolist()
    want = [brute_logprob(row, y, truncation) for row, y in zip(scaled, flat, strict=True)]
    torch.testing.assert_close(got, torch.tensor(want).view(3, 5), rtol=0, atol=1e-5)
    outside = [y not in brute_kept(row, truncation) for row, y in zip(scaled, flat, strict=True)]
    assert any(outside) and not all(outside)
    torch.testing.assert_close(
        entropy, entropy_from_logits(logits.detach(), 0.7, truncation), rtol=0, atol=1e-5
    )
    # the gradient through the logits is the brute force's, carried to hidden, weight, bias
    brute = [brute_gradient(row, y, truncation) for row, y in zip(scaled, flat, strict=True)]
    grad_logits = torch.tensor(brute).view(3, 5, 7) / 0.7 * upstream[..., None]
    want_grads = torch.autograd.grad(logits, exact, grad_logits)
    got_grads = torch.autograd.grad((got * upstream).sum(), model)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == dtype and w.abs().max() > 1e-3
        # a bfloat16 model's gradients are the float32 ones rounded to bfloat16
        torch.testing.assert_close(
            g, w.to(dtype), rtol=0, atol=1e-5 if dtype is torch.float32 else 0
        )


def test_the_sampler_records_the_truncated_logprob():
    logits = LOGITS.expand(4000, 7)
    params = SamplingParams(top_p=0.45)
    tokens, logprobs = sample_tokens(logits, params, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=7)
    assert set(counts.nonzero().squeeze(1).tolist()) == {1, 3, 5}
    assert abs(counts[1] / 4000 - 0.3 / 0.7) < 0.03
    want = logprobs_from_logits(logits, tokens, 1.0, params.truncation)
    torch.testing.assert_close(logprobs, want, rtol=0, atol=1e-6)
    assert logprobs[tokens == 1][0].item() == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)


def test_a_suppressed_token_changes_the_draw_not_the_logprob():
    """EOS (token 1, the likeliest) suppressed: the draw keeps the suppressed distribution's
    top 2, the logprob is the policy's, over its own top 2 and the token."""
    logits = LOGITS.expand(2000, 7)
    params = SamplingParams(top_k=2)
    tokens, logprobs = sample_tokens(
        logits, params, torch.Generator().manual_seed(0), torch.tensor([1])
    )
    assert set(tokens.tolist()) == {3, 5}  # the tie at 0.2 after 0.3 is gone
    torch.testing.assert_close(
        logprobs, logprobs_from_logits(logits, tokens, 1.0, params.truncation), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    "truncation", [Truncation(top_p=0.9), Truncation(top_k=5), Truncation(top_k=20, min_p=0.1)]
)
def test_the_samplers_logprobs_are_the_training_forwards(truncation):
    """The decode loop against the training forward of its own samples: equal to float32
    rounding, and far from the full distribution's."""
    model = make_model("qwen2", eos_bias=-2.0)
    sampler = TorchSampler(model, TOKENIZER)
    params = SamplingParams(
        max_new_tokens=12, temperature=1.3, seed=0, top_k=truncation.top_k,
        top_p=truncation.top_p, min_p=truncation.min_p,
    )  # fmt: skip
    rollout = sampler.generate_ids([[5, 6, 7], [9, 4]], 4, params)
    batch = TrainBatch(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        completion_mask=rollout.completion_mask,
        advantages=torch.zeros(rollout.num_rows),
    )
    mask = rollout.completion_mask.bool()
    for chunk in (16, 1024):
        forward = ForwardSettings(1.3, chunk, 3, truncation=truncation)
        trained = batch_logprobs(model_forward(model), batch, forward)
        torch.testing.assert_close(trained[mask], rollout.logprobs[mask], rtol=0, atol=1e-5)
    full = batch_logprobs(model_forward(model), batch, ForwardSettings(1.3, 16, 3))
    assert (full[mask] - rollout.logprobs[mask]).abs().max() > 0.05


def model_forward(model):
    from oncurve.model.forward import PolicyLogprobs

    return PolicyLogprobs(model)
