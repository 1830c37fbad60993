"""One policy update on a scored batch: microbatch forward -> logprobs -> loss -> backward.

No I/O and no optimizer here; the trainer owns those.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

import torch
import transformers

from oncurve import distributed
from oncurve.algo.correction import logprob_diff_mean, tis_weights
from oncurve.algo.logprobs import logprobs_from_hidden
from oncurve.compiled_layers import CompiledLayersFailed, compiled_layers
from oncurve.models import cache_argument, real_token_positions
from oncurve.packing import RowLengths, packed_hidden
from oncurve.process import NondeterministicOp, host_to_device, strictly_deterministic
from oncurve.types import TrainBatch


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    prompt_index: torch.Tensor | None = None,
    packed: RowLengths | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `completion_len` tokens of each row under `model`.

    The decoder trunk runs once; logits are formed only at the completion positions and in
    chunks (see `oncurve.algo.logprobs`). Position ids count real tokens only, so a left-padded
    prompt sees the same positions as an unpadded one; the sampler uses the same convention,
    which is what makes its logprobs equal these.

    With `prompt_index`, rows that share a prompt share its forward: each distinct prompt runs
    once and its KV cache (with its autograd graph) is expanded to its rows, which then run only
    their completion tokens. The G completions of a GRPO group have one prompt, so this saves
    (G - 1) / G of the prompt tokens' forward and backward; the result equals the plain forward
    up to float rounding (`tests/test_train_step.py`).

    With `packed` (the rows' real lengths and prompt numbers, known on the host), the rows run
    packed end to end with no padding, each shared prompt once (`oncurve.packing`; the model's
    attention must be `packing.ATTENTION`), and `prompt_index` is not used.

    Args:
        model: a Hugging Face causal LM (`base_model` trunk + output embeddings).
        input_ids: `[N, P+T]` left-padded prompt followed by right-padded completion.
        attention_mask: `[N, P+T]` 1 on real tokens.
        completion_len: T.
        prompt_index: `[N]` equal for rows whose P prompt columns are equal, or None.
    Returns:
        (`[N, T]` float32 logprobs, `[N, T]` entropy or None); values on padding are meaningless
        and must be masked by the caller.
    """
    hidden = completion_hidden(
        model.base_model, input_ids, attention_mask, completion_len, prompt_index, packed
    )
    labels = input_ids[:, -completion_len:]
    head = model.get_output_embeddings()
    return logprobs_from_hidden(
        hidden, head.weight, labels, temperature, chunk_size, head.bias, with_entropy
    )


def completion_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    prompt_index: torch.Tensor | None = None,
    packed: RowLengths | None = None,
) -> torch.Tensor:
    """`[N, T, H]` hidden states of a decoder `trunk` before each of the last `completion_len`
    tokens, position ids counting real tokens only; with `packed`, the rows packed, else with
    `prompt_index`, each distinct prompt run once (see `completion_logprobs`)."""
    if packed is not None:
        return packed_hidden(trunk, input_ids, completion_len, packed)
    position_ids = real_token_positions(attention_mask)
    if prompt_index is not None:
        prompts, row_prompt = torch.unique(prompt_index, return_inverse=True)
        # rows whose prompts are all distinct gain nothing from a second forward
        if len(prompts) < len(row_prompt):
            select = torch.nn.functional.one_hot(row_prompt, len(prompts))
            return _shared_prompt_hidden(
                trunk, input_ids, attention_mask, position_ids, completion_len, select
            )
    out = trunk(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    return out.last_hidden_state[:, -completion_len - 1 : -1]


def _shared_prompt_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_len: int,
    select: torch.Tensor,
) -> torch.Tensor:
    """`[N, T, H]` hidden states before each completion token, each distinct prompt run once;
    `select` `[N, U]` is one-hot: row n has prompt u."""
    prompt_len = input_ids.shape[1] - completion_len
    first_row = select.argmax(0)  # argmax takes the first of equal maxima: a prompt's first row
    cache = transformers.DynamicCache(config=trunk.config)
    prompt = trunk(
        input_ids=input_ids[first_row, :prompt_len],
        attention_mask=attention_mask[first_row, :prompt_len],
        position_ids=position_ids[first_row, :prompt_len],
        use_cache=True,
        **cache_argument(trunk, cache),
    )
    # Rows take their prompt's cache through a one-hot matmul, not indexing: the backward of an
    # index adds the G rows' gradients in an order that differs between processes, which made
    # two runs of one seed differ by 1e-7 and drift apart; a matmul sums in a fixed order.
    select = select.to(prompt.last_hidden_state.dtype)
    for layer in cache.layers:
        layer.keys = _rows_of(select, layer.keys)
        layer.values = _rows_of(select, layer.values)
    completion = trunk(
        input_ids=input_ids[:, prompt_len:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, prompt_len:],
        use_cache=True,
        **cache_argument(trunk, cache),
    )
    last_prompt = _rows_of(select, prompt.last_hidden_state[:, -1:])
    return torch.cat([last_prompt, completion.last_hidden_state[:, :-1]], dim=1)


def _rows_of(select: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`[N, ...]` row n of `values` `[U, ...]` picked by the one-hot `select` `[N, U]` (exact:
    a product with one 1 and zeros)."""
    picked = select @ values.flatten(1)
    return picked.view(select.shape[0], *values.shape[1:])


class PolicyLogprobs(torch.nn.Module):
    """`completion_logprobs` as a module, so that DDP or FSDP2 can wrap the training forward
    (their gradient hooks are armed by the wrapper's forward)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_len: int,
        temperature: float = 1.0,
        chunk_size: int = 1024,
        with_entropy: bool = False,
        prompt_index: torch.Tensor | None = None,
        packed: RowLengths | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return completion_logprobs(
            self.model,
            input_ids,
            attention_mask,
            completion_len,
            temperature,
            chunk_size,
            with_entropy,
            prompt_index,
            packed,
        )


@dataclass(frozen=True)
class LossFns:
    """The pieces of the per-token objective, looked up by name from `oncurve.algo.registry`.

    Attributes:
        policy_loss: `fn(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high,
            dual_clip) -> ([N, T] loss, metrics)`.
        aggregate: `fn(per_token, mask, *, num_seqs, num_tokens, norm_len) -> scalar`.
        kl: `fn(logprobs, ref_logprobs) -> [N, T]`, used when beta > 0.
        tis_cap: truncated importance sampling (`oncurve.algo.correction`): each token's policy
            loss is weighted by min(pi_old / pi_sampler, tis_cap) where the batch has the
            sampler's logprobs; 0 off.
    """

    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    aggregate: Callable[..., torch.Tensor]
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    beta: float
    eps_low: float
    eps_high: float
    dual_clip: float | None
    norm_len: float
    tis_cap: float = 0.0


@dataclass(frozen=True)
class ForwardSettings:
    """How the policy's (and the critic's) training forward runs, one value for every caller.

    Attributes:
        temperature: divides the logits, as in sampling.
        chunk_size: completion positions per chunk of logits (`oncurve.algo.logprobs`).
        microbatch_rows: rows per forward/backward at most.
        microbatch_tokens: tokens per forward/backward at most (`microbatches`); 0 no cap.
        compile_layers: run the decoder layers compiled (`oncurve.compiled_layers`).
        pack_rows: run the policy's rows packed, without padding (`oncurve.packing`).
        reference_tokens: tokens per microbatch of the reference pass, which keeps nothing
            for a backward (`memory.forward_only_tokens`); None: `microbatch_tokens`.
        share_prompt: run each group's prompt once, where the batch says which rows share one
            (`TrainBatch.prompt_index`); off where the forward cannot (`session.forward_settings`).
    """

    temperature: float = 1.0
    chunk_size: int = 1024
    microbatch_rows: int = 64
    microbatch_tokens: int = 0
    compile_layers: bool = False
    pack_rows: bool = False
    reference_tokens: int | None = None
    share_prompt: bool = True

    def for_reference(self) -> ForwardSettings:
        """These settings with the reference pass's token cap. The old policy's pass keeps
        the update's: its logprobs must be those of the update's first pass bit for bit."""
        if self.reference_tokens is None:
            return self
        return replace(self, microbatch_tokens=self.reference_tokens)

    def packed(self, micro: TrainBatch) -> RowLengths | None:
        """What the policy's forward of `micro` takes as `packed`: None when not packing."""
        return micro.row_lengths if self.pack_rows else None

    def prompt_index(self, micro: TrainBatch) -> torch.Tensor | None:
        """What the policy's forward of `micro` takes as `prompt_index`: None when prompts are
        not shared."""
        return micro.prompt_index if self.share_prompt else None


def trim_padding(batch: TrainBatch, longest_prompt: int, longest_completion: int) -> TrainBatch:
    """Drop the columns that are padding in every row: left of the longest prompt and right of
    the longest completion (the rows' longest, as `Microbatch` holds them, known on the host),
    so a microbatch of short sequences costs what its tokens cost."""
    completion_len = batch.completion_mask.shape[1]
    prompt_len = batch.input_ids.shape[1] - completion_len
    longest_completion = max(longest_completion, 1)
    keep = slice(prompt_len - longest_prompt, prompt_len + longest_completion)

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:, :longest_completion]

    return TrainBatch(
        input_ids=batch.input_ids[:, keep],
        attention_mask=batch.attention_mask[:, keep],
        completion_mask=batch.completion_mask[:, :longest_completion],
        advantages=batch.advantages if batch.advantages.dim() == 1 else cut(batch.advantages),
        old_logprobs=cut(batch.old_logprobs),
        ref_logprobs=cut(batch.ref_logprobs),
        sample_logprobs=cut(batch.sample_logprobs),
        prompt_index=batch.prompt_index,
        row_lengths=batch.row_lengths,
    )


def length_order(prompts: list[int], completions: list[int]) -> list[int]:
    """Row indices, longest sequence (prompt + completion tokens) first.

    Microbatches cut from this order hold rows of similar length, so `trim_padding` removes
    most of their padding (a third of the tokens of a 64-row microbatch of the default job
    when cut in sampling order). The longest rows come first, so the first microbatch sets the
    peak memory, no higher than in sampling order. The sort is stable: the same batch always
    gives the same microbatches, which keeps pi_old bitwise equal to the first pass's logprobs.
    """
    return sorted(range(len(prompts)), key=lambda row: -(prompts[row] + completions[row]))


def group_order(prompts: list[int], completions: list[int], groups: list[int]) -> list[int]:
    """Row indices, a group's rows together (in batch order), the group of most packed tokens
    (its prompt once, its completions) first; stable, as `length_order`.

    Packed rows have no padding to trim, but a group's prompt runs once per microbatch that
    holds some of its rows: kept together, a group spans at most two microbatches. In length
    order, completions of different lengths scatter a group, and its prompt runs again in
    every microbatch its rows land in. The costliest groups first set the peak early.
    """
    members: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)

    def packed_tokens(rows: list[int]) -> int:
        return prompts[rows[0]] + sum(completions[row] for row in rows)

    ordered = sorted(members.values(), key=lambda rows: -packed_tokens(rows))
    return [row for rows in ordered for row in rows]


@dataclass(frozen=True)
class Microbatch:
    """Rows of a batch that go through one forward (and backward) together.

    Attributes:
        index: `[n]` the rows.
        longest_prompt, longest_completion: the rows' longest, in real tokens (what
            `trim_padding` keeps).
        completion_tokens: the rows' completion tokens that count in the loss.
        lengths: the rows' real lengths and prompt numbers, what a packed forward needs.
    """

    index: torch.Tensor
    longest_prompt: int
    longest_completion: int
    completion_tokens: int
    lengths: RowLengths

    def of(self, batch: TrainBatch) -> TrainBatch:
        """These rows of `batch`, padding-trimmed, their lengths known."""
        rows = replace(batch.rows(self.index), row_lengths=self.lengths)
        return trim_padding(rows, self.longest_prompt, self.longest_completion)

    def first_row(self) -> Microbatch:
        """Its first row alone, counting no tokens: a stand-in (`even_across_ranks`)."""
        lengths = self.lengths
        groups = None if lengths.groups is None else lengths.groups[:1]
        alone = RowLengths(lengths.prompts[:1], lengths.completions[:1], groups)
        return Microbatch(self.index[:1], alone.prompts[0], alone.completions[0], 0, alone)


def even_across_ranks(parts: list[Microbatch], module: torch.nn.Module) -> list[Microbatch]:
    """`parts` and, where `module` is FSDP2-sharded, stand-ins after them (`first_row` of the
    last, `completion_tokens` 0) until every rank has as many: each rank cuts its own rows by
    tokens into as many microbatches as their lengths need, but each forward of a sharded
    module gathers its weights, a collective that every rank must join as often. A stand-in's
    result is thrown away (its loss counts zero times)."""
    if not distributed.shards_weights(module):
        return parts
    most = int(distributed.all_max([float(len(parts))])[0])
    return parts + [parts[-1].first_row()] * (most - len(parts))


def microbatches(
    batch: TrainBatch,
    max_rows: int,
    max_tokens: int = 0,
    packed: bool = False,
    share_prompt: bool = True,
) -> list[Microbatch]:
    """The microbatches of `batch`: consecutive runs of `length_order` (of `group_order` for
    `packed` rows that share prompts: `prompt_index`, with `share_prompt`), each of at most `max_rows` rows and,
    when `max_tokens` > 0, at most `max_tokens` tokens once `trim_padding` has cut it (rows x
    (longest prompt + longest completion)), or with `packed` rows, at most `max_tokens` real
    tokens (a shared prompt counted once, as it runs); a row longer than that goes alone.

    A token budget keeps every microbatch's activations about one size whatever the lengths
    sampled (short completions pack many rows, long ones few); `models.microbatch_tokens` says
    why that size matters on CPU. The rows' lengths (and `prompt_index`, for a packed forward)
    are read to the host once, here, and the order goes back in one copy that waits for
    nothing, so that the microbatches' forwards and backwards follow one another with no wait
    for the device.
    """
    completion_len = batch.completion_mask.shape[1]
    prompt_len = batch.input_ids.shape[1] - completion_len
    # A completion's span is its real tokens, not its loss tokens: an episode's observations
    # are read by the forward but have no loss.
    columns = [
        batch.attention_mask[:, :prompt_len].sum(1),
        batch.attention_mask[:, prompt_len:].sum(1),
        batch.completion_mask.sum(1).long(),
    ]
    if share_prompt and batch.prompt_index is not None:
        columns.append(batch.prompt_index.to(columns[0].dtype))
    prompts, completions, loss_tokens, *groups = torch.stack(columns).tolist()
    shared = packed and bool(groups)
    if shared:
        order = group_order(prompts, completions, groups[0])
    else:
        order = length_order(prompts, completions)
    prompts, completions, loss_tokens, *groups = (
        [values[row] for row in order] for values in (prompts, completions, loss_tokens, *groups)
    )
    index = host_to_device(order, batch.input_ids.device)
    cuts: list[Microbatch] = []
    start = 0
    while start < len(prompts):
        end, longest_prompt, longest_completion = start + 1, prompts[start], completions[start]
        real = prompts[start] + completions[start]
        while end < len(prompts) and end - start < max_rows:
            grown = (max(longest_prompt, prompts[end]), max(longest_completion, completions[end]))
            runs_its_prompt = not shared or groups[0][end] != groups[0][end - 1]
            more = real + prompts[end] * runs_its_prompt + completions[end]
            cost = more if packed else (end - start + 1) * sum(grown)
            if max_tokens > 0 and cost > max_tokens:
                break
            longest_prompt, longest_completion, real = *grown, more
            end += 1
        lengths = RowLengths(
            tuple(prompts[start:end]),
            tuple(completions[start:end]),
            tuple(groups[0][start:end]) if groups else None,
        )
        cuts.append(
            Microbatch(
                index[start:end],
                longest_prompt,
                longest_completion,
                sum(loss_tokens[start:end]),
                lengths,
            )
        )
        start = end
    return cuts


def accumulate(
    module: torch.nn.Module,
    minibatch: TrainBatch,
    forward: ForwardSettings,
    micro_loss: Callable[[TrainBatch, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]]:
    """Forward and backward over `minibatch` in its `microbatches`, adding into `.grad` (zero,
    or None, when it is called): the one gradient-accumulation loop of the policy and the
    critic.

    `micro_loss(micro, index)` returns the loss of the padding-trimmed microbatch `micro`,
    whose rows are `index` `[n]` of `minibatch`, and its statistics (0-dim tensors). `module`
    is the model whose forward `micro_loss` calls; when it is DDP-wrapped, gradients are
    all-reduced in the last microbatch's backward only. Nothing is read back from the device
    here: the caller reads every microbatch's numbers at once (`host_values`). A microbatch
    that meets an op with no deterministic kernel (`process.strictly_deterministic`) or whose
    compiled layers fail in the backward (`compiled_layers`) leaves partial gradients, so the
    loop starts again from zero gradients (the next time in warn-only mode, or eagerly).

    Returns:
        (completion tokens, detached loss, statistics) of each microbatch, in order.
    """
    real = microbatches(
        minibatch,
        forward.microbatch_rows,
        forward.microbatch_tokens,
        forward.pack_rows,
        forward.share_prompt,
    )
    parts = even_across_ranks(real, module)

    for last_try in (False, True):
        done = []
        try:
            for i, part in enumerate(parts):
                micro = part.of(minibatch)
                defer_sync = i < len(parts) - 1 and hasattr(module, "no_sync")
                with (
                    module.no_sync() if defer_sync else contextlib.nullcontext(),
                    compiled_layers(forward.compile_layers),
                    strictly_deterministic(),
                ):
                    loss, stats = micro_loss(micro, part.index)
                    if i >= len(real):  # a stand-in: its backward joins the collectives, adds 0
                        loss = loss * 0
                    loss.backward()
                if i < len(real):
                    done.append((part.completion_tokens, loss.detach(), stats))
            return done
        except (NondeterministicOp, CompiledLayersFailed):
            if last_try:
                raise
            for param in module.parameters():
                if param.grad is not None:
                    param.grad.zero_()
    raise AssertionError("unreachable: the last try returns or raises")


def host_values(
    done: list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]],
) -> list[tuple[int, float, dict[str, float]]]:
    """`accumulate`'s results with their numbers read to the host in one transfer."""
    if not done:
        return []
    names = list(done[0][2])
    table = torch.stack(
        [torch.stack([loss.float(), *(stats[k].float() for k in names)]) for _, loss, stats in done]
    ).tolist()
    return [
        (tokens, row[0], dict(zip(names, row[1:], strict=True)))
        for (tokens, _, _), row in zip(done, table, strict=True)
    ]


@torch.no_grad()
def over_microbatches(
    batch: TrainBatch,
    forward: ForwardSettings,
    module: torch.nn.Module,
    per_token: Callable[[TrainBatch], torch.Tensor],
) -> torch.Tensor:
    """`[N, T]` float32 values of `per_token(micro)` `[n, t]` over the padding-trimmed
    `microbatches` of `batch` (`even_across_ranks`: `module` is the one `per_token` calls),
    no graph kept; 0 on padding."""
    completion_len = batch.completion_mask.shape[1]
    out = torch.zeros(
        batch.completion_mask.shape, dtype=torch.float32, device=batch.input_ids.device
    )
    real = microbatches(
        batch,
        forward.microbatch_rows,
        forward.microbatch_tokens,
        forward.pack_rows,
        forward.share_prompt,
    )
    for i, part in enumerate(even_across_ranks(real, module)):
        micro = part.of(batch)
        with compiled_layers(forward.compile_layers):
            values = per_token(micro)
        if i < len(real):
            out[part.index, : values.shape[1]] = values * micro.completion_mask
    return out[:, :completion_len]


def accumulate_gradients(
    policy: torch.nn.Module,
    minibatch: TrainBatch,
    fns: LossFns,
    forward: ForwardSettings,
    *,
    num_seqs: float,
    num_tokens: float,
) -> dict[str, float]:
    """The policy's forward and backward over `minibatch` (`accumulate`), adding into `.grad`.

    `policy` is a `PolicyLogprobs`, possibly wrapped by DDP. `num_seqs` and `num_tokens` are
    the counts of the whole optimizer step (every microbatch; under data parallelism, every
    rank's, divided by the number of ranks because DDP averages gradients): with them the
    aggregations make the sum of microbatch losses equal the loss of one big batch, so gradient
    accumulation and data parallelism change nothing.
    When `minibatch.old_logprobs` is None (mu = 1) pi_old is the forward's own detached
    logprobs: the ratio is exactly 1 and its gradient is the policy gradient.

    Returns:
        the step's loss (sum over microbatches) and token-weighted means of kl, entropy, clip
        fractions and the ratio, plus the ratio's min and max and the largest gap between pi_old
        and the sampler's logprobs (`logprob_diff/max`, the sampler/trainer health check; its
        token mean is `logprob_diff/mean`, and `tis/capped_frac` the fraction of tokens whose
        TIS weight was truncated, when `fns.tis_cap` > 0).
    """

    totals: dict[str, float] = {"loss/policy": 0.0, "logprob_diff/max": 0.0}
    weighted: dict[str, float] = {}
    ratio_min, ratio_max = float("inf"), float("-inf")
    tokens_seen = 0.0
    policy_loss = partial(
        microbatch_loss, policy, fns=fns, forward=forward, num_seqs=num_seqs, num_tokens=num_tokens
    )
    for tokens, loss, stats in host_values(accumulate(policy, minibatch, forward, policy_loss)):
        totals["loss/policy"] += loss
        totals["logprob_diff/max"] = max(totals["logprob_diff/max"], stats.pop("sampler_gap"))
        ratio_min = min(ratio_min, stats.pop("ratio/min"))
        ratio_max = max(ratio_max, stats.pop("ratio/max"))
        for key, value in stats.items():
            weighted[key] = weighted.get(key, 0.0) + value * tokens
        tokens_seen += tokens
    totals.update({key: value / max(tokens_seen, 1.0) for key, value in weighted.items()})
    totals["ratio/min"], totals["ratio/max"] = ratio_min, ratio_max
    return totals


def microbatch_loss(
    policy: torch.nn.Module,
    micro: TrainBatch,
    rows: torch.Tensor | None = None,
    *,
    fns: LossFns,
    forward: ForwardSettings,
    num_seqs: float,
    num_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The aggregated loss of one microbatch (policy term + beta * KL) and its statistics
    (0-dim tensors, left on the device): `accumulate`'s `micro_loss` with the policy, the loss
    and the step's counts bound. `rows`, the microbatch's `[n]` rows in its minibatch, is what
    `accumulate` passes every loss; the policy's targets travel in `micro` itself.

    With `fns.tis_cap` > 0 and the sampler's logprobs in `micro`, each token's policy term (not
    the KL term, as in verl) is weighted by min(pi_old / pi_sampler, tis_cap) (`tis_weights`).
    """
    mask = micro.completion_mask.to(torch.float32)
    logprobs, entropy = policy(
        micro.input_ids,
        micro.attention_mask,
        mask.shape[1],
        forward.temperature,
        forward.chunk_size,
        with_entropy=True,
        prompt_index=forward.prompt_index(micro),
        packed=forward.packed(micro),
    )
    old = logprobs.detach() if micro.old_logprobs is None else micro.old_logprobs
    advantages = micro.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logprobs)
    per_token, stats = fns.policy_loss(
        logprobs,
        old,
        advantages,
        mask,
        eps_low=fns.eps_low,
        eps_high=fns.eps_high,
        dual_clip=fns.dual_clip,
    )
    if micro.sample_logprobs is not None:
        if fns.tis_cap > 0:
            weights, correction = tis_weights(old, micro.sample_logprobs, mask, fns.tis_cap)
            per_token = per_token * weights
            stats.update(correction)
        else:
            stats["logprob_diff/mean"] = logprob_diff_mean(old, micro.sample_logprobs, mask)
    if fns.beta > 0:
        kl = fns.kl(logprobs, micro.ref_logprobs)
        per_token = per_token + fns.beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask)
    stats["entropy"] = masked_mean(entropy, mask)
    stats["sampler_gap"] = (
        ((old - micro.sample_logprobs).abs() * mask).max()
        if micro.sample_logprobs is not None
        else mask.new_zeros(())
    )
    loss = fns.aggregate(
        per_token, mask, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=fns.norm_len
    )
    return loss, {key: value.detach() for key, value in stats.items()}


def keeps_gradients(device: torch.device) -> bool:
    """Whether gradients stay allocated between updates on `device` (`releasing_gradients`):
    on CUDA they are freed, so that the sampler and the reference pass do not hold them (the
    caching allocator hands the same blocks back at the next update); elsewhere they are kept
    (glibc would map and zero fresh pages for them each step)."""
    return device.type != "cuda"


def make_gradients(params: list[torch.nn.Parameter]) -> None:
    """Zeros for every parameter without a gradient, made before a backward's first activation
    (made by autograd amid the activations they fragment the heap)."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


@contextlib.contextmanager
def releasing_gradients(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """An update (or the preflight's gradient check): when it ends, also by an error, the
    parameters' gradients are freed unless `keeps_gradients`."""
    try:
        yield
    finally:
        if params and not keeps_gradients(params[0].device):
            for param in params:
                param.grad = None


def optimizer_step(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    minibatch: TrainBatch,
    fns: LossFns,
    forward: ForwardSettings,
    *,
    grad_clip: float,
) -> dict[str, float]:
    """One optimizer step on `minibatch` (this rank's rows of it): accumulate gradients over
    microbatches, clip the global norm, step, zero. An update whose loss or gradient norm is
    not finite is skipped (`updates/skipped` = 1) and the weights stay as they were."""
    _, world_size = distributed.world()
    # Global counts over ranks, divided by the ranks because DDP averages gradients.
    seqs, tokens = distributed.all_sum(
        [float(minibatch.num_rows), float(minibatch.completion_mask.sum())]
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    make_gradients(params)  # where `releasing_gradients` freed them after the last update
    stats = accumulate_gradients(
        policy, minibatch, fns, forward, num_seqs=seqs / world_size, num_tokens=tokens / world_size
    )
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    # Every rank must take the same decision, or their weights drift apart.
    bad_loss = distributed.all_sum([float(not math.isfinite(stats["loss/policy"]))])[0]
    skip = bad_loss > 0 or not math.isfinite(grad_norm)
    if not skip:
        optimizer.step()
    # zeroed, not freed: the next optimizer step of the update adds into them
    # (`releasing_gradients` frees them when the update ends)
    optimizer.zero_grad(set_to_none=False)
    return {**stats, "grad_norm": grad_norm, "updates/skipped": float(skip)}


def batch_logprobs(
    policy: torch.nn.Module, batch: TrainBatch, forward: ForwardSettings
) -> torch.Tensor:
    """`[N, T]` logprobs of the completions under `policy`, a `PolicyLogprobs` of pi_old or
    pi_ref (or its DDP / FSDP2 wrapper, whose forward gathers sharded weights), no graph kept,
    computed in the same microbatches and with the same forward as training; 0 on padding."""

    def logprobs(micro: TrainBatch) -> torch.Tensor:
        values, _ = policy(
            micro.input_ids,
            micro.attention_mask,
            micro.completion_mask.shape[1],
            forward.temperature,
            forward.chunk_size,
            prompt_index=forward.prompt_index(micro),
            packed=forward.packed(micro),
        )
        return values

    return over_microbatches(batch, forward, policy, logprobs)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)
