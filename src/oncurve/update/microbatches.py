"""A batch cut into microbatches (rows and tokens capped, a group's rows kept together, the
same count on every rank) and forward passes over them without a graph (pi_old, pi_ref)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from oncurve import distributed
from oncurve.algo.truncation import KEEP_ALL, Truncation
from oncurve.model.compiled_layers import compiled_layers
from oncurve.model.devices import host_to_device
from oncurve.model.packing import RowLengths
from oncurve.types import TrainBatch


@dataclass(frozen=True)
class ForwardSettings:
    """How the policy's (and the critic's) training forward runs, one value for every caller.

    Attributes:
        temperature: divides the logits, as in sampling.
        chunk_size: completion positions per chunk of logits (`oncurve.algo.logprobs`).
        microbatch_rows: rows per forward/backward at most.
        microbatch_tokens: tokens per forward/backward at most (`microbatches`); 0 no cap.
        compile_layers: run the decoder layers compiled (`oncurve.model.compiled_layers`).
        pack_rows: run the policy's rows packed, without padding (`oncurve.model.packing`).
        reference_tokens: tokens per microbatch of the reference pass, which keeps nothing
            for a backward (`memory_plan.forward_only_tokens`); None: `microbatch_tokens`.
        share_prompt: run each group's prompt once, where the batch says which rows share one
            (`TrainBatch.prompt_index`); off where the forward cannot (`session.forward_settings`).
        truncation: the sampler's top-k / top-p / min-p, under which the policy's (and the
            reference's) logprobs are taken (`oncurve.algo.truncation`).
    """

    temperature: float = 1.0
    chunk_size: int = 1024
    microbatch_rows: int = 64
    microbatch_tokens: int = 0
    compile_layers: bool = False
    pack_rows: bool = False
    reference_tokens: int | None = None
    share_prompt: bool = True
    truncation: Truncation = KEEP_ALL

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
    sampled (short completions pack many rows, long ones few); `kv_cache.microbatch_tokens` says
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
            truncation=forward.truncation,
        )
        return values

    return over_microbatches(batch, forward, policy, logprobs)
