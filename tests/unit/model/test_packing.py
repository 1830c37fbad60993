"""Rows packed by their real tokens (`oncurve.model.packing`, their attention
`oncurve.model.packed_attention`), each shared prompt once: the padded forward's logprobs,
entropy and gradients for each architecture, a sliding window kept, padded calls left to sdpa,
nothing read back from the device, CUDA's path on meta tensors, the check before a run packs,
and the trainer packing exactly when configured."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.batches import (
    COMPLETION_LEN,
    accumulate_grpo,
    grouped_rows,
    grpo_batch,
    lengths_batch,
    lengths_of,
)
from helpers.configs import make_config
from helpers.counting import rows_per_call
from helpers.host_reads import host_reads_of
from helpers.models import make_model

from oncurve.config import load_config
from oncurve.errors import UserError
from oncurve.loop.preflight import Tolerances
from oncurve.loop.trainer import setup
from oncurve.loop.training_step import training_step
from oncurve.model import forward as training_forward
from oncurve.model import packed_attention, packing
from oncurve.model.forward import completion_logprobs
from oncurve.model.packing import RowLengths
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.run.settle import RunFacts, settle_pack_rows
from oncurve.update.microbatches import ForwardSettings, microbatches


def logprobs_and_grads(
    model: torch.nn.Module, packed: bool, shared: bool = False
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Logprobs and entropy on `grouped_rows`' completion tokens, and the gradients of their
    masked sum, with the rows padded or packed (with each shared prompt run once or not)."""
    ids, mask, completion_mask, groups = grouped_rows()
    logprobs, entropy = completion_logprobs(
        model,
        ids,
        mask,
        COMPLETION_LEN,
        with_entropy=True,
        packed=lengths_of(mask, groups if shared else None) if packed else None,
    )
    objective = ((logprobs + entropy) * completion_mask).sum()
    grads = torch.autograd.grad(objective, list(model.parameters()))
    real = completion_mask.bool()
    return logprobs[real].detach(), entropy[real], grads


def assert_same(got: tuple, want: tuple, atol: float = 1e-5) -> None:
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=atol, rtol=0)
    for a, b in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("shared", [False, True], ids=["whole rows", "shared prompts"])
@pytest.mark.parametrize("kind", ["qwen2", "llama", "mistral", "gpt2"])
def test_packed_rows_give_the_padded_forwards_logprobs_entropy_and_gradients(kind, shared) -> None:
    """`grouped_rows` holds 8 rows of 4 prompts (some sharing one) in shuffled order, prompts
    left-padded (3 and 1 columns), completions right-padded (3 columns in every other row): a
    row attending to another's tokens, a position counted with padding, a completion given
    another group's prompt or a hidden state put back in the wrong place would each move these
    by far more than float32 rounding."""
    model = make_model(kind)
    padded = logprobs_and_grads(model, packed=False)
    packed_attention.use_packed_attention(model)
    assert_same(logprobs_and_grads(model, packed=True, shared=shared), padded)
    assert max(float(g.abs().max()) for g in padded[2]) > 1e-2  # the gradients are not ~0


def test_shared_prompts_run_once_in_the_packed_sequence() -> None:
    """The packed sequence holds each distinct prompt once and every completion: here 4
    prompts of 6, 3, 6 and 5 tokens (2, 2, 2 and 2 of the 8 rows) instead of 8."""
    model = make_model("qwen2")
    packed_attention.use_packed_attention(model)
    ids, mask, _, groups = grouped_rows()
    lengths = lengths_of(mask, groups)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, a, out: seen.append(out.shape[1])
    )
    for rows in (lengths, RowLengths(lengths.prompts, lengths.completions)):
        completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
    hook.remove()
    distinct = {g: p for g, p in zip(lengths.groups, lengths.prompts, strict=True)}
    assert seen == [
        sum(distinct.values()) + sum(lengths.completions),
        sum(lengths.prompts) + sum(lengths.completions),
    ]
    assert len(distinct) < len(lengths.groups)  # some rows do share a prompt


def test_in_bfloat16_packed_rows_are_the_padded_forward_within_its_rounding() -> None:
    model = make_model("qwen2").to(torch.bfloat16)
    padded, _, _ = logprobs_and_grads(model, packed=False)
    packed_attention.use_packed_attention(model)
    for shared in (False, True):
        packed, _, _ = logprobs_and_grads(model, packed=True, shared=shared)
        gap = (packed.float() - padded.float()).abs()
        assert float(gap.mean()) < Tolerances.of(torch.bfloat16).logprob / 10
        assert float(gap.max()) < 0.1


@pytest.mark.parametrize("shared", [False, True], ids=["whole rows", "shared prompts"])
def test_a_sliding_window_shorter_than_the_rows_is_kept(shared) -> None:
    """Mistral with a 3-token window (rows here hold up to 13 tokens): the packed segments'
    band is the padded forward's, which differs from full attention."""
    model = make_model("mistral")
    full, _, _ = logprobs_and_grads(model, packed=False)
    model.config.sliding_window = 3
    for layer in model.model.layers:
        layer.self_attn.sliding_window = 3
    padded = logprobs_and_grads(model, packed=False)
    assert float((padded[0] - full).abs().max()) > 1e-2  # the window matters here
    packed_attention.use_packed_attention(model)
    assert_same(logprobs_and_grads(model, packed=True, shared=shared), padded)


def test_padded_calls_through_the_packed_attention_are_sdpas_bit_for_bit() -> None:
    """The sampler, evaluation and the critic run the same model padded."""
    model = make_model("qwen2")
    ids, mask, _, _ = grouped_rows()
    before, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN)
    packed_attention.use_packed_attention(model)
    assert model.config._attn_implementation == packed_attention.ATTENTION
    after, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN)
    assert torch.equal(after, before)


def test_a_kernel_registered_for_a_device_is_what_its_packed_rows_run(monkeypatch) -> None:
    """`VARLEN_KERNELS` chooses the attention of packed rows by device type: a kernel
    registered for the CPU is called once a layer, with the query's heads and the key's, the
    same bounds and longest segments in every layer, and the model's scale, and its output is the
    attention's; padded calls never reach it. Unregistered, the CPU runs an sdpa call a
    segment again."""
    model = make_model("qwen2")
    packed_attention.use_packed_attention(model)
    ids, mask, _, groups = grouped_rows()
    rows = lengths_of(mask, groups)
    expected, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
    calls = []

    def zeros(q, k, v, query_bounds, key_bounds, longest, scale, window):
        calls.append((q.shape[1], k.shape[1], int(query_bounds[-1]), longest, scale, window))
        return torch.zeros_like(q)

    monkeypatch.setitem(packed_attention.VARLEN_KERNELS, "cpu", zeros)
    completion_logprobs(model, ids, mask, COMPLETION_LEN)
    assert calls == []
    replaced, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
    config = model.config
    heads = (config.num_attention_heads, config.num_key_value_heads)
    assert [c[:2] for c in calls] == [heads] * config.num_hidden_layers
    head_dim = config.hidden_size // config.num_attention_heads
    assert all(c[4] == pytest.approx(head_dim**-0.5) and c[5] is None for c in calls)
    assert len({c[2:4] for c in calls}) == 1 and 0 < calls[0][3][0] <= calls[0][2]
    assert not torch.allclose(replaced, expected)
    monkeypatch.delitem(packed_attention.VARLEN_KERNELS, "cpu")
    again, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
    assert torch.equal(again, expected)


@pytest.mark.parametrize("shared", [False, True], ids=["whole rows", "shared prompts"])
def test_the_packing_reads_nothing_back_but_the_cpu_segments_bounds(shared) -> None:
    """transformers finds packed rows from the position ids with a host read, and would build
    a mask over them; the packed forward passes its own bounds, made on the host from the
    rows' lengths. What is counted: the one tensor made from the host's plan (on CUDA it goes
    from pinned memory without waiting for the device) and the CPU attention's reads, one
    `tolist` of each bound a layer (CUDA's variable-length attention takes them on the
    device)."""
    model = make_model("qwen2")
    packed_attention.use_packed_attention(model)
    ids, mask, _, groups = grouped_rows()
    rows = lengths_of(mask, groups if shared else None)
    reads = host_reads_of(
        lambda: completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
    )
    assert reads == 1 + 2 * model.config.num_hidden_layers


@pytest.mark.skipif(
    "window_size" not in packed_attention.VARLEN_PARAMETERS,
    reason=f"torch {torch.__version__} has no variable-length attention with windows",
)
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("shared", [False, True], ids=["whole rows", "shared prompts"])
def test_the_cuda_path_runs_forward_and_backward_on_meta_tensors(
    monkeypatch, shared, window
) -> None:
    """CUDA's path, without a GPU: on the meta device (shapes, no values) the packed trunk
    calls torch's variable-length attention once a layer, with GQA and a sliding window, and
    the backward reaches every weight of the trunk. Meta tensors cannot be read, so this also
    shows that the path reads nothing back from the device."""
    calls = []
    original = packed_attention.VARLEN_KERNELS["cuda"]

    def counting(*args):
        calls.append(args[-1])
        return original(*args)

    monkeypatch.setitem(packed_attention.VARLEN_KERNELS, "meta", counting)
    model = make_model("mistral" if window else "qwen2").to(torch.bfloat16)
    if window:
        model.config.sliding_window = window
        for layer in model.model.layers:
            layer.self_attn.sliding_window = window
    packed_attention.use_packed_attention(model)
    model.to("meta")
    ids, mask, _, groups = grouped_rows()
    rows = lengths_of(mask, groups if shared else None)
    hidden = packing.packed_hidden(model.model, ids.to("meta"), COMPLETION_LEN, rows)
    assert hidden.shape == (8, COMPLETION_LEN, model.config.hidden_size)
    assert calls == [window] * model.config.num_hidden_layers
    hidden.float().sum().backward()
    trunk = list(model.model.parameters())
    assert all(p.grad is not None and p.grad.shape == p.shape for p in trunk)


def test_a_token_budget_counts_real_tokens_when_rows_are_packed() -> None:
    """Rows of 9, 8, 6, 6 and 3 real tokens in length order: padded, rows 2 and 3 cost 2 x 8
    columns and 3 and 4 pad to 2 x 9; packed, they cost what they hold."""
    batch = lengths_batch([4, 2, 3, 4, 1], [5, 1, 5, 2, 5])
    padded = microbatches(batch, 8, 16)
    packed = microbatches(batch, 8, 16, packed=True)
    assert [cut.index.tolist() for cut in padded] == [[0], [2], [3], [4, 1]]
    assert [cut.index.tolist() for cut in packed] == [[0], [2, 3], [4, 1]]
    assert packed[1].lengths == RowLengths((3, 4), (5, 2))


def test_packed_rows_that_share_prompts_keep_each_group_together() -> None:
    """Groups A, B, C of two rows: prompts of 4, 2 and 2 tokens, completions (1, 5), (5, 5),
    (1, 1). Length order (9, 7, 7, 5, 3, 3 tokens) splits A around B; packed, a group's rows
    stay together, the group of most packed tokens (B: 12) first, and a budget counts each
    prompt once: B's two rows fit in 12 tokens, which counted twice (14) they would not."""
    batch = lengths_batch([4, 4, 2, 2, 2, 2], [1, 5, 5, 5, 1, 1])
    padded = [cut.index.tolist() for cut in microbatches(batch, 2)]
    assert padded == [[1, 2], [3, 0], [4, 5]]
    whole = microbatches(batch, 2, packed=True)  # no prompt_index: no prompt runs once
    assert [cut.index.tolist() for cut in whole] == padded
    batch.prompt_index = torch.tensor([0, 0, 1, 1, 2, 2])
    assert [cut.index.tolist() for cut in microbatches(batch, 2)] == padded
    for max_rows, max_tokens in ((2, 0), (8, 12)):
        cuts = microbatches(batch, max_rows, max_tokens, packed=True)
        assert [cut.index.tolist() for cut in cuts] == [[2, 3], [0, 1], [4, 5]]
        assert [cut.lengths.groups for cut in cuts] == [(1, 1), (0, 0), (2, 2)]
        assert cuts[1].lengths == RowLengths((4, 4), (1, 5), (0, 0))
    assert [cut.index.tolist() for cut in microbatches(batch, 8, 11, packed=True)][0] == [2]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["", "checkpointed"])
@pytest.mark.parametrize("shared", [False, True], ids=["whole rows", "shared prompts"])
def test_accumulated_gradients_are_the_same_with_rows_packed(shared, checkpointing) -> None:
    """Against padded rows each run whole. Under gradient checkpointing the layers run again
    in the backward, given the segments' bounds and the shared prompts' layout again."""
    grads = []
    for pack in (False, True):
        model, batch = grpo_batch(1, share_prompt=shared and pack)
        if checkpointing:
            enable_gradient_checkpointing(model)
        if pack:
            packed_attention.use_packed_attention(model)
        forward = ForwardSettings(1.0, 16, 3, pack_rows=pack)  # 3 microbatches
        accumulate_grpo(model, batch, forward, float(batch.completion_mask.sum()))
        grads.append([p.grad for p in model.parameters()])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert max(float(g.abs().max()) for g in grads[0]) > 1e-3


@pytest.mark.parametrize(
    "overrides,packed,shared",
    [
        ((), False, True),  # null: off on the CPU
        (("model.pack_rows=true",), True, True),
        (("model.pack_rows=true", "model.gradient_checkpointing=true"), True, True),
        (("model.pack_rows=true", "model.share_prompt_forward=false"), True, False),
        (("model.pack_rows=false",), False, True),
    ],
)
def test_the_trainer_packs_the_update_and_reference_rows_as_configured(
    tiny_model_dir, data_file, tmp_path, monkeypatch, overrides, packed, shared
) -> None:
    """Null settles to off on the CPU; true packs the reference pass's and the update's
    microbatches, with each group's prompt once (under gradient checkpointing too, which the
    padded shared forward cannot), and records true."""
    calls = []
    original = training_forward.packed_hidden

    def counting(trunk, input_ids, completion_len, rows):
        calls.append((input_ids.shape[0], rows.shares_prompts()))
        return original(trunk, input_ids, completion_len, rows)

    monkeypatch.setattr(training_forward, "packed_hidden", counting)
    padded_shared = rows_per_call(monkeypatch, training_forward, "_shared_prompt_hidden")
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *overrides))
    assert s.config.model.pack_rows is packed
    with s.rewards:
        metrics = training_step(s, 1)
    # 16 rows: the reference pass and the update, one microbatch each
    assert calls == ([(16, shared), (16, shared)] if packed else [])
    assert padded_shared == ([16, 16] if shared and not packed else [])
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))


def test_packing_an_unsupported_model_is_a_one_line_error_and_null_leaves_it_padded() -> None:
    model = make_model("qwen2")
    model.set_attn_implementation("eager")
    with pytest.raises(UserError, match=r"^model\.pack_rows: the model's attention is eager"):
        settle_pack_rows_of(load_config(None, ["model.pack_rows=true"]), model)
    settled, note = settle_pack_rows_of(load_config(None, []), model)
    assert settled.model.pack_rows is False and note == ""
    assert model.config._attn_implementation == "eager"
    model.config.attn_logit_softcapping = 50.0
    model.set_attn_implementation("sdpa")
    assert packed_attention.unsupported(model) == "the model soft-caps its attention logits"


def test_the_check_passes_a_packed_forward_and_names_what_fails(monkeypatch) -> None:
    model = make_model("qwen2")
    packed_attention.use_packed_attention(model)
    assert packed_attention.packed_failure(model) is None
    in_bfloat16 = make_model("gpt2").to(torch.bfloat16)
    packed_attention.use_packed_attention(in_bfloat16)
    assert packed_attention.packed_failure(in_bfloat16) is None
    original = packed_attention._attention_by_segments

    def shifted(q, k, v, query_bounds, key_bounds, scale, window):
        """Queries aligned with the keys' start, not their end: a shared prompt's rows would
        each miss their own last tokens."""
        return original(
            q, k[: q.shape[0]], v[: q.shape[0]], query_bounds, query_bounds, scale, window
        )

    monkeypatch.setattr(packed_attention, "_attention_by_segments", shifted)
    assert packed_attention.packed_failure(model).startswith(
        "its hidden states (shared prompts) differ"
    )


def test_the_checks_backward_lets_no_determinism_warning_out(monkeypatch) -> None:
    """On CUDA the check runs in deterministic mode's warn-only (the trainer's), where the
    padded forward's attention backward warns that it adds in no fixed order: the check's
    gradients are compared within a tolerance, so those warnings stay inside it, and others
    come out."""
    model = make_model("qwen2")
    packed_attention.use_packed_attention(model)
    grad = torch.autograd.grad

    def warning_grad(*args, **kwargs):
        warnings.warn(
            "Flash Attention defaults to a non-deterministic algorithm. To explicitly enable "
            "determinism call torch.use_deterministic_algorithms(True, warn_only=False).",
            UserWarning,
            stacklevel=2,
        )
        warnings.warn("another warning", UserWarning, stacklevel=2)
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", warning_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert packed_attention.packed_failure(model) is None
    assert [str(w.message) for w in caught] == ["another warning"] * 3


def test_null_packs_where_the_check_passes_and_else_warns_once_and_stays_padded(
    monkeypatch, capsys
) -> None:
    """Null packs where packed rows take the variable-length attention (here the CPU, with the
    segments loop standing in for it where it passes); torch's own on the CPU, which has no
    kernel there, fails the check: one warning, rows padded. The check leaves the model's
    attention as it found it; the run switches it when it packs."""
    kernels = packed_attention.VARLEN_KERNELS
    monkeypatch.setitem(kernels, "cpu", kernels["cuda"])
    model = make_model("qwen2")
    failing, note = settle_pack_rows_of(load_config(None, []), model)
    assert failing.model.pack_rows is False
    assert model.config._attn_implementation == "sdpa"  # as it was before the check
    assert note.startswith("warning: rows stay padded in the update (model.pack_rows): the packed")

    def segments_loop(q, k, v, query_bounds, key_bounds, longest, scale, window):
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return packed_attention._attention_by_segments(
            q, k, v, query_bounds, key_bounds, scale, window
        )

    monkeypatch.setitem(kernels, "cpu", segments_loop)
    passing, note = settle_pack_rows_of(load_config(None, []), model)
    assert passing.model.pack_rows is True and note == ""
    assert model.config._attn_implementation == "sdpa"  # switched when the run is built
    assert capsys.readouterr().err == ""


def settle_pack_rows_of(config, model) -> tuple:
    """`settle_pack_rows` with the facts gathered from `model` where it is."""
    return settle_pack_rows(config, RunFacts.gather(config, model))
