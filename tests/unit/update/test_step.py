"""Sharing a group's prompt forward: the same logprobs, entropy and gradients as running every
row whole, and the trainer uses it exactly when it applies."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
from helpers.batches import (
    COMPLETION_LEN,
    accumulate_grpo,
    grouped_rows,
    grpo_batch,
    lengths_batch,
    loss_fns,
)
from helpers.configs import make_config
from helpers.counting import rows_per_call
from helpers.host_reads import host_reads_of
from helpers.models import make_model, tiny_qwen2

from oncurve import distributed
from oncurve.loop.trainer import setup
from oncurve.loop.training_step import training_step
from oncurve.model import forward as training_forward
from oncurve.model.forward import PolicyLogprobs, completion_logprobs
from oncurve.model.kv_cache import microbatch_tokens
from oncurve.model.weights import (
    enable_gradient_checkpointing,
    frozen_copy,
    offload_weights,
    weights_on,
)
from oncurve.types import TrainBatch
from oncurve.update import policy as policy_module
from oncurve.update import step as update_step
from oncurve.update.determinism import deterministic_kernels
from oncurve.update.microbatches import ForwardSettings, batch_logprobs, microbatches
from oncurve.update.policy import Policy
from oncurve.update.step import accumulate_gradients, keeps_gradients


@pytest.mark.parametrize("kind", ["qwen2", "llama", "mistral", "gpt2"])
def test_shared_prompt_forward_equals_the_plain_forward(kind: str) -> None:
    model = make_model(kind)
    ids, mask, completion_mask, index = grouped_rows()
    results = []
    for prompt_index in (None, index):
        logprobs, entropy = completion_logprobs(
            model, ids, mask, COMPLETION_LEN, with_entropy=True, prompt_index=prompt_index
        )
        objective = ((logprobs + entropy) * completion_mask).sum()
        grads = torch.autograd.grad(objective, list(model.parameters()))
        real = completion_mask.bool()
        results.append((logprobs[real], entropy[real], grads))
    (plain_lp, plain_ent, plain_grads), (shared_lp, shared_ent, shared_grads) = results
    torch.testing.assert_close(shared_lp, plain_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_ent, plain_ent, atol=1e-5, rtol=0)
    for shared, plain in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    assert max(float(g.abs().max()) for g in plain_grads) > 1e-2  # the gradients are not ~0


def accumulated_grads(
    seed: int, share_prompt: bool, microbatch_size: int, microbatch_tokens: int = 0
) -> list[torch.Tensor]:
    """The GRPO loss's gradients over `grouped_rows(seed)`, accumulated over microbatches."""
    model, batch = grpo_batch(seed, share_prompt)
    forward = ForwardSettings(1.0, 16, microbatch_size, microbatch_tokens)
    accumulate_grpo(model, batch, forward, float(batch.completion_mask.sum()))
    return [p.grad for p in model.parameters()]


def test_a_microbatch_runs_its_forward_and_its_recomputation_in_one_strict_mode() -> None:
    """Under deterministic kernels (warn-only, as the trainer sets them on CUDA) a
    microbatch's forward runs in torch's strict mode, as its backward does, and so the
    recomputation of a checkpointed layer runs in the mode its forward ran in: a compiled
    layer's code is specialised to that mode, and two would compile every layer twice (on
    CUDA, Dynamo's recompile limit then left layers eager). Warn-only comes back after."""
    model, batch = grpo_batch(0, share_prompt=False)
    enable_gradient_checkpointing(model)
    warn_only = []
    model.model.layers[0].mlp.register_forward_pre_hook(
        lambda *_: warn_only.append(torch.is_deterministic_algorithms_warn_only_enabled())
    )
    forward = ForwardSettings(1.0, 16, 8)
    with deterministic_kernels(True):
        accumulate_grpo(model, batch, forward, float(batch.completion_mask.sum()))
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert warn_only == [False, False]  # the forward, then its recomputation in the backward


def test_accumulated_gradients_are_the_same_with_the_shared_prompt_forward() -> None:
    plain = accumulated_grads(seed=1, share_prompt=False, microbatch_size=3)
    shared = accumulated_grads(seed=1, share_prompt=True, microbatch_size=3)
    for a, b in zip(shared, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "max_rows,max_tokens,expected",
    [
        # rows 0, 2, 3, 4, 1 hold 9, 8, 6, 6, 3 tokens (prompt + completion)
        (8, 16, [[0], [2], [3], [4, 1]]),  # rows 3 and 4 hold 12 tokens but pad to 2 x 9
        (8, 18, [[0, 2], [3, 4], [1]]),
        (3, 0, [[0, 2, 3], [4, 1]]),  # rows only
        (8, 5, [[0], [2], [3], [4], [1]]),  # each row over the budget goes alone
    ],
)
def test_microbatches_cut_the_length_order_within_rows_and_padded_tokens(
    max_rows, max_tokens, expected
) -> None:
    prompts, completions = [4, 2, 3, 4, 1], [5, 1, 5, 2, 5]
    batch = lengths_batch(prompts, completions)
    cuts = microbatches(batch, max_rows, max_tokens)
    assert [cut.index.tolist() for cut in cuts] == expected
    for cut, rows in zip(cuts, expected, strict=True):
        # the lengths read once for the whole batch, each microbatch's known on the host
        assert cut.longest_prompt == max(prompts[r] for r in rows)
        assert cut.longest_completion == max(completions[r] for r in rows)
        assert cut.completion_tokens == sum(completions[r] for r in rows)
        trimmed = cut.of(batch)
        assert trimmed.input_ids.shape[1] == cut.longest_prompt + cut.longest_completion
        # only padding went
        assert trimmed.attention_mask.sum() == batch.rows(cut.index).attention_mask.sum()
        if max_tokens and len(rows) > 1:
            assert trimmed.input_ids.numel() <= max_tokens


def test_a_microbatch_keeps_an_episodes_sampled_tokens_after_its_observations() -> None:
    """An episode's completion holds observation tokens that are read but have no loss: the
    trim keeps the completion's real span, not as many columns as it has loss tokens, and the
    logprobs of the tokens after an observation are the unbatched forward's."""
    model = make_model("qwen2")
    batch = lengths_batch([4, 2], [5, 3])
    batch.completion_mask = batch.completion_mask.clone()
    batch.completion_mask[0, 1:3] = 0  # an observation in row 0: 5 real tokens, 3 with loss
    (cut,) = microbatches(batch, 2)
    assert (cut.longest_completion, cut.completion_tokens) == (5, 3 + 3)
    trimmed = cut.of(batch)
    assert trimmed.completion_mask.sum() == batch.completion_mask.sum()
    got = batch_logprobs(PolicyLogprobs(model), batch, ForwardSettings(1.0, 16, 2))
    alone, _ = completion_logprobs(model, batch.input_ids[:1], batch.attention_mask[:1], 5)
    torch.testing.assert_close(got[0, 3:], alone[0, 3:], atol=1e-6, rtol=0)
    assert float(got[0, 4].abs()) > 0.1  # a real logprob, not the 0 left on cut columns


@pytest.mark.parametrize(
    "kind,dtype,configured,expected",
    [
        ("qwen2", torch.float32, None, 2**24 // (64 * 4)),  # intermediate 64 > hidden 32
        ("qwen2", torch.bfloat16, None, 2**24 // (64 * 2)),
        ("gpt2", torch.float32, None, 2**24 // (4 * 32 * 4)),  # GPT-2's MLP is 4 x hidden
        ("qwen2", torch.float32, 0, 0),
        ("qwen2", torch.float32, 300, 300),
    ],
)
def test_the_default_token_cap_keeps_a_layers_widest_activation_at_16_mb_on_cpu(
    kind, dtype, configured, expected
) -> None:
    model = make_model(kind).to(dtype)
    assert microbatch_tokens(model, configured) == expected


def test_a_token_budget_changes_no_gradient() -> None:
    ids, mask, completion_mask, _ = grouped_rows(seed=2)
    batch = TrainBatch(ids, mask, completion_mask, torch.zeros(ids.shape[0]))
    assert len(microbatches(batch, 8, 30)) >= 3  # the budget does split this batch
    whole = accumulated_grads(seed=2, share_prompt=False, microbatch_size=8)
    split = accumulated_grads(seed=2, share_prompt=False, microbatch_size=8, microbatch_tokens=30)
    for a, b in zip(split, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert max(float(g.abs().max()) for g in whole) > 1e-3


@pytest.mark.parametrize(
    "overrides,shared",
    [
        ((), True),
        (("model.share_prompt_forward=false",), False),
        (("model.gradient_checkpointing=true",), False),
        (("optim.microbatch_size=1",), False),  # one row a microbatch: nothing to share
    ],
)
def test_the_trainer_shares_the_prompt_forward_when_it_applies(
    tiny_model_dir, data_file, tmp_path, monkeypatch, overrides, shared
) -> None:
    calls = rows_per_call(monkeypatch, training_forward, "_shared_prompt_hidden")
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *overrides))
    with s.rewards:
        training_step(s, 1)
    # 16 rows: the reference pass and the update, one microbatch each
    assert calls == ([16, 16] if shared else [])


REPEAT_SCRIPT = """
import hashlib, torch, transformers
from oncurve.model.sources import resolve_model_path
from oncurve.model.forward import completion_logprobs
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_pretrained(resolve_model_path("default"))
rows, group = 64, 8
ids = torch.randint(3, 100, (rows // group, 11)).repeat_interleave(group, 0)
ids = torch.cat([ids, torch.randint(3, 100, (rows, 34))], dim=1)
mask = torch.ones_like(ids)
mask[: 3 * group, :4] = 0
mask[::3, -9:] = 0
order = torch.randperm(rows)
for _ in range(3):
    logprobs, _ = completion_logprobs(
        model, ids[order], mask[order], 34, prompt_index=(torch.arange(rows) // group)[order]
    )
    objective = (logprobs * mask[order][:, -34:]).sum()
    digest = hashlib.sha256()
    for grad in torch.autograd.grad(objective, list(model.parameters())):
        digest.update(grad.numpy().tobytes())
    print(digest.hexdigest())
"""


def test_the_shared_prompt_backward_is_bitwise_the_same_in_every_process() -> None:
    """A seed must give one run, not a family: gathering the prompt cache by indexing would
    make the gradients differ between processes and between backwards in one process
    (left-padded prompts, rows out of group order)."""
    # two processes at once, not one after the other: each spends seconds importing, and a
    # backward takes a fraction of one, so each process repeats it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPEAT_SCRIPT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    digests = set()
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
            assert len(out.split()) == 3, out
            digests.update(out.split())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert len(digests) == 1


@pytest.mark.parametrize("rows", [8, 2, 1], ids=["1 microbatch", "4", "8"])
@pytest.mark.parametrize("share_prompt", [False, True], ids=["plain", "shared prompt"])
def test_an_update_reads_the_device_twice_whatever_its_microbatches(share_prompt, rows) -> None:
    """The gradient accumulation reads the rows' lengths once and every microbatch's loss and
    statistics once, at the end, so on a GPU the CPU queues one microbatch's kernels while the
    device runs the previous one's; the rows' order goes back in one tensor made on the host
    (`process.host_to_device`: on CUDA a copy that waits for nothing), which the count lists
    with the reads. What the forward itself reads (transformers' mask checks for padding, the
    shared prompt's `torch.unique`) comes on top, as in any trainer."""
    model, batch = grpo_batch(3, share_prompt)
    forward = ForwardSettings(1.0, 16, rows)
    policy = PolicyLogprobs(model)
    parts = [cut.of(batch) for cut in microbatches(batch, rows)]
    assert len(parts) == 8 // rows
    by_forward = sum(
        host_reads_of(
            lambda micro=micro: policy(
                micro.input_ids, micro.attention_mask, micro.completion_mask.shape[1],
                forward.temperature, forward.chunk_size, with_entropy=True,
                prompt_index=micro.prompt_index,
            )
        )
        for micro in parts
    )  # fmt: skip
    tokens = float(batch.completion_mask.sum())
    assert host_reads_of(lambda: accumulate_grpo(model, batch, forward, tokens)) == by_forward + 3


class RecordsTheBackwardsMode(torch.autograd.Function):
    """Identity whose backward notes whether deterministic mode is strict there, and can call
    an op that has no deterministic kernel (`put_`, on the CPU too)."""

    strict: list[bool] = []
    nondeterministic = False

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        RecordsTheBackwardsMode.strict.append(
            torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled()
        )
        if RecordsTheBackwardsMode.nondeterministic:
            grad.clone().put_(torch.tensor([0]), grad.new_ones(1))
        return grad


def test_under_deterministic_kernels_the_backward_is_strict_until_an_op_has_no_such_kernel(
    monkeypatch, capsys
) -> None:
    """Warn-only mode lets CUDA's memory-efficient attention backward add key splits with
    atomics, so the update's backward runs in strict mode. An op with no deterministic kernel
    then gets one warning line naming the setting, the accumulation starts again from zero
    gradients in warn-only mode (the same gradients), and the run's later backwards stay
    warn-only; a new run is strict again."""
    from oncurve.update.determinism import deterministic_kernels

    model, batch = grpo_batch(0, share_prompt=False)
    forward = ForwardSettings(1.0, 16, 4)  # 2 microbatches
    norm = model.model.norm

    def recorded(x: torch.Tensor, forward_of_norm=norm.forward) -> torch.Tensor:
        return RecordsTheBackwardsMode.apply(forward_of_norm(x))

    monkeypatch.setattr(norm, "forward", recorded)
    monkeypatch.setattr(RecordsTheBackwardsMode, "strict", [])
    tokens = float(batch.completion_mask.sum())
    accumulate_grpo(model, batch, forward, tokens)
    want = [p.grad.clone() for p in model.parameters()]
    assert RecordsTheBackwardsMode.strict == [False, False]  # not asked for: as it was
    model.zero_grad(set_to_none=False)
    with deterministic_kernels(True):
        accumulate_grpo(model, batch, forward, tokens)
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # strict only in there
        model.zero_grad(set_to_none=False)
        monkeypatch.setattr(RecordsTheBackwardsMode, "nondeterministic", True)
        with pytest.warns(UserWarning, match="put_ does not have a deterministic"):
            accumulate_grpo(model, batch, forward, tokens)
        for got, expected in zip([p.grad for p in model.parameters()], want, strict=True):
            assert torch.equal(got, expected)
        model.zero_grad(set_to_none=False)
        with pytest.warns(UserWarning, match="put_ does not have a deterministic"):
            accumulate_grpo(model, batch, forward, tokens)
    # two strict microbatches; the third run's first, which met put_; its restart's two and
    # the fourth run's two, warn-only
    assert RecordsTheBackwardsMode.strict == [False, False, True, True, True] + [False] * 4
    said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(said) == 1 and said[0].startswith("warning: run.deterministic: put_ does not")
    with deterministic_kernels(True):  # the next run
        monkeypatch.setattr(RecordsTheBackwardsMode, "nondeterministic", False)
        accumulate_grpo(model, batch, forward, tokens)
    assert RecordsTheBackwardsMode.strict[-2:] == [True, True]


def test_the_reference_pass_cuts_microbatches_by_its_own_token_cap(monkeypatch) -> None:
    """Four rows of 9 tokens: the old policy's pass keeps the update's cap (9 tokens, a row a
    microbatch, so its logprobs are the update's first pass's bit for bit); the reference
    pass, which keeps nothing for a backward, takes its own (18: two rows)."""
    batch = lengths_batch([4, 4, 4, 4], [5, 5, 5, 5])
    forward = ForwardSettings(1.0, 16, 8, microbatch_tokens=9, reference_tokens=18)
    policy = Policy(make_model("qwen2"), forward=forward, with_reference=True)
    rows = rows_per_call(monkeypatch, PolicyLogprobs, "forward")
    reference = policy.reference_logprobs(batch)
    assert rows == [2, 2]
    rows.clear()
    old = policy.logprobs(batch)
    assert rows == [1, 1, 1, 1]
    torch.testing.assert_close(reference, old, rtol=0, atol=1e-6)  # the same weights


def test_offloaded_weights_are_on_the_device_only_inside_weights_on() -> None:
    """`offload_weights` moves a frozen module's parameters to the host; `weights_on` puts
    copies on the device (here the host: copies all the same) for its block, the tied head
    and embedding one parameter copied once, and afterwards, also after an error, the
    parameters are the very host tensors again. Buffers do not move."""
    model = frozen_copy(tiny_qwen2(40))
    offload_weights(model)
    params = list(model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(params) == len({id(p) for p in model.parameters()})
    host = [p.data for p in params]
    buffers = [b.data_ptr() for b in model.buffers()]
    copied = []
    for fails in (False, True):
        raised = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with raised, weights_on(model, torch.device("cpu")) as on_device:
            assert on_device is model and model.lm_head.weight is model.model.embed_tokens.weight
            copies = [p.data for p in params]
            assert all(torch.equal(c, h) for c, h in zip(copies, host, strict=True))
            copied.append({c.data_ptr() for c in copies})
            if fails:
                raise RuntimeError("a forward that ran out of memory")
        assert [p.data_ptr() for p in params] == [h.data_ptr() for h in host]
        assert all(p.device.type == "cpu" and not p.requires_grad for p in params)
        assert [b.data_ptr() for b in model.buffers()] == buffers
    assert all(not ptrs & {h.data_ptr() for h in host} for ptrs in copied)
    assert all(len(ptrs) == len(params) for ptrs in copied)


def test_weights_that_cannot_be_pinned_stay_in_pageable_memory_with_one_warning(
    monkeypatch, capsys
) -> None:
    """Where CUDA is available but pinning fails (a container's locked-memory limit), the
    offloaded weights are still moved to the host, and one warning says they were not
    pinned; no pinning is tried after the first failure."""
    tries = []

    def pin_fails(self: torch.Tensor) -> torch.Tensor:
        tries.append(self.shape)
        raise RuntimeError("CUDA error: out of memory\nmore")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_fails)
    model = frozen_copy(tiny_qwen2(40))
    offload_weights(model)
    assert len(tries) == 1 and all(p.device.type == "cpu" for p in model.parameters())
    said = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert said == [
        "warning: pinning the reference's weights in host memory failed (RuntimeError: CUDA "
        "error: out of memory); they are copied to the GPU from pageable memory"
    ]


def test_an_offloaded_reference_gives_the_kept_ones_logprobs(monkeypatch) -> None:
    """`Policy(offload_reference=True)`: the reference pass brings the reference's weights
    onto the policy's device for that pass (`weights_on`, once per pass) and its logprobs
    are the kept reference's bit for bit."""
    batch = lengths_batch([4, 4, 4, 4], [5, 5, 5, 5])
    forward = ForwardSettings(1.0, 16, 8, microbatch_tokens=9, reference_tokens=18)
    kept = Policy(make_model("qwen2"), forward=forward, with_reference=True)
    offloaded = Policy(
        make_model("qwen2"), forward=forward, with_reference=True, offload_reference=True
    )
    assert offloaded.reference_offloaded and not kept.reference_offloaded
    entered = []

    def recorded(module: torch.nn.Module, device: torch.device):
        entered.append((module, device))
        return weights_on(module, device)

    monkeypatch.setattr(policy_module, "weights_on", recorded)
    assert torch.equal(offloaded.reference_logprobs(batch), kept.reference_logprobs(batch))
    assert entered == [(offloaded.reference, torch.device("cpu"))]


def test_stand_in_microbatches_change_no_result(monkeypatch) -> None:
    """Where another rank cut two more microbatches (FSDP2: each forward gathers weights on
    every rank), this one runs two stand-ins, the first row of its last microbatch, counted
    nowhere: the logprobs, the gradients and the statistics are those without them."""
    model, batch = grpo_batch(0, share_prompt=False)
    forward = ForwardSettings(1.0, 16, 3)
    tokens = float(batch.completion_mask.sum())
    policy = PolicyLogprobs(model)
    fns = loss_fns("seq-mean-token-mean")

    def update() -> tuple[torch.Tensor, list[torch.Tensor], dict[str, float]]:
        model.zero_grad(set_to_none=True)
        logprobs = batch_logprobs(policy, batch, forward)
        stats = accumulate_gradients(policy, batch, fns, forward, num_seqs=8.0, num_tokens=tokens)
        return logprobs, [p.grad.clone() for p in model.parameters()], stats

    want = update()
    monkeypatch.setattr(distributed, "shards_weights", lambda module: True)
    monkeypatch.setattr(distributed, "all_max", lambda values: [values[0] + 2])
    rows = rows_per_call(monkeypatch, PolicyLogprobs, "forward")
    got = update()
    assert rows == [3, 3, 2, 1, 1] * 2  # 8 rows in 3, 3 and 2, then two stand-ins, twice
    assert torch.equal(got[0], want[0])
    for mine, theirs in zip(got[1], want[1], strict=True):
        assert torch.equal(mine, theirs)
    assert got[2] == want[2]


def test_an_updates_gradients_are_made_before_it_and_freed_after_it_on_cuda(monkeypatch):
    """`make_gradients`: zeros where a parameter has no gradient (an existing one stays the
    same tensor); `releasing_gradients`: after the update, also after an error, they are kept
    where `keeps_gradients` (the CPU), else freed (CUDA). The update's optimizer step makes
    them before its backward."""
    assert keeps_gradients(torch.device("cpu")) and not keeps_gradients(torch.device("cuda", 1))
    model = make_model("qwen2")
    params = list(model.parameters())
    kept = params[0].grad = torch.zeros_like(params[0])
    with update_step.releasing_gradients(params):
        update_step.make_gradients(params)
        assert params[0].grad is kept
        assert all(p.grad is not None and not p.grad.any() for p in params)
        assert all(p.grad.shape == p.shape and p.grad.dtype == p.dtype for p in params)
    assert all(p.grad is not None for p in params) and params[0].grad is kept
    monkeypatch.setattr(update_step, "keeps_gradients", lambda device: False)
    with pytest.raises(RuntimeError), update_step.releasing_gradients(params):
        raise RuntimeError("out of memory in the update")
    assert all(p.grad is None for p in params)
    made = []
    real = update_step.accumulate_gradients

    def accumulate(*args, **kwargs):
        made.append(all(p.grad is not None and not p.grad.any() for p in params))
        return real(*args, **kwargs)

    monkeypatch.setattr(update_step, "accumulate_gradients", accumulate)
    model_batch = grpo_batch(0, share_prompt=False)
    params = list(model_batch[0].parameters())
    optimizer = torch.optim.SGD(params, lr=0.0)
    with update_step.releasing_gradients(params):
        update_step.optimizer_step(
            PolicyLogprobs(model_batch[0]), optimizer, model_batch[1],
            loss_fns("seq-mean-token-mean"), ForwardSettings(1.0, 16, 8), grad_clip=1.0,
        )  # fmt: skip
    assert made == [True] and all(p.grad is None for p in params)
