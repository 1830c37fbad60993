"""The training forward without padding: a microbatch's rows packed end to end by their real
tokens, as verl's remove-padding does, and a GRPO group's prompt run once for its rows.

The real tokens become one sequence `[1, S]`, cut into segments that attend only within
themselves, by the segments' bounds (`cu_seq_lens_q`, `cu_seq_lens_k`, as transformers' flash
attention takes them) rather than a mask: on CUDA torch's variable-length flash attention
(`torch.nn.attention.varlen`), elsewhere one `scaled_dot_product_attention` call a segment.
Without shared prompts a segment is a row, prompt and completion. With them (`RowLengths.groups`)
each distinct prompt is a segment once, and each row's completion a segment whose queries are
its own tokens and whose keys and values are its prompt's followed by its own
(`SharedPrompts`), so a prompt shared by G rows costs one forward and backward, not G, in the
same single forward. This module plans the rows and runs the forward over them
(`packed_hidden`); the attention that runs the segments, and the check that it does so where
the run is, are `oncurve.model.packed_attention`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from oncurve.model.devices import host_to_device


@dataclass(frozen=True)
class RowLengths:
    """A microbatch's rows as the host knows them (`update.step.Microbatch`): all the packing
    needs, so that it reads nothing back from the device.

    Attributes:
        prompts: each row's real prompt tokens (at least 1).
        completions: each row's real completion tokens.
        groups: each row's prompt number (rows of one number have one prompt: a GRPO group),
            or None to run every row whole.
    """

    prompts: tuple[int, ...]
    completions: tuple[int, ...]
    groups: tuple[int, ...] | None = None

    def shares_prompts(self) -> bool:
        """Whether some rows share a prompt, so that it runs once for them."""
        return self.groups is not None and len(set(self.groups)) < len(self.groups)


@dataclass(frozen=True)
class SharedPrompts:
    """How the keys and values `[S, H_kv, D]` of a packed sequence whose U distinct prompts
    come first, once each, become those of its segments: each prompt's own, then for each of
    the N rows its prompt's followed by its completion's.

    The prompts are laid out one a row (`prompt_slots`) and each row takes its prompt's by a
    one-hot `select` `[N, U]` matmul, as the padded shared-prompt forward does: exact, and its
    backward adds a group's gradients in a fixed order, where a gather's would add them with
    atomics. Every other move is a copy to distinct places, whose backward is a gather. Keys
    and values move together, in half the kernels (on a GPU the update waits on launches).

    Attributes:
        prompt_tokens: the prompts' tokens at the head of the sequence.
        width: the longest prompt (a prompt's row in the layout).
        prompt_slots: `[prompt_tokens]` each prompt token's place in the `[U * width]` layout.
        select: `[N, U]` one-hot, row n's prompt, in the keys' dtype.
        own: `[S]` each token's place among the segments' keys.
        expanded: `[N * width]` the place of each row's prompt slot among them (empty slots
            go past `size`, to be cut off).
        size: the segments' keys, all together.
    """

    prompt_tokens: int
    width: int
    prompt_slots: torch.Tensor
    select: torch.Tensor
    own: torch.Tensor
    expanded: torch.Tensor
    size: int

    def keys_and_values(
        self, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The segments' keys and values `[size, H_kv, D]` from the sequence's `[S, H_kv, D]`."""
        flat = torch.cat([keys.flatten(1), values.flatten(1)], dim=1)
        rows, prompts = self.select.shape
        # zeros: the empty slots of a short prompt meet the one-hot's zeros in the matmul
        layout = flat.new_zeros(prompts * self.width, flat.shape[1])
        layout.index_copy_(0, self.prompt_slots, flat[: self.prompt_tokens])
        taken = self.select @ layout.view(prompts, -1)
        # every place below `size` is written; the empty slots land past it
        out = flat.new_empty(self.size + rows * self.width, flat.shape[1])
        out.index_copy_(0, self.own, flat)
        out.index_copy_(0, self.expanded, taken.view(rows * self.width, -1))
        split = keys[0].numel()
        shape = (self.size, *keys.shape[1:])
        return out[: self.size, :split].view(shape), out[: self.size, split:].view(shape)


@dataclass(frozen=True)
class _Plan:
    """Where each token of the packed sequence comes from and goes, on the host.

    `lists` holds `sources` (each token's place in the flattened `[N, W]` input ids),
    `positions`, `query_bounds` and `key_bounds` (the segments'), `outputs` (each hidden
    state's place in `[N * T]`, or past it: with shared prompts, the completions' only) and,
    with shared prompts, `prompt_last` (each prompt's last token), `first_columns` and
    `SharedPrompts`' `prompt_slots`, `select` (flattened), `own` and `expanded`.
    """

    lists: dict[str, list[int]]
    longest_query: int
    longest_key: int
    shared: dict[str, int] | None  # `SharedPrompts`' sizes


def _bounds(lengths: list[int]) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


def _plan(rows: RowLengths, width: int, completion_len: int) -> _Plan:
    """The packing of rows of `width` columns (prompts left-padded, then `completion_len`
    completion columns right-padded) with these lengths."""
    prompt_width = width - completion_len
    count = len(rows.prompts)
    trash = itertools.count(count * completion_len)
    sources: list[int] = []
    positions: list[int] = []
    outputs: list[int] = []

    def prompt_of(row: int) -> None:
        length = rows.prompts[row]
        first = row * width + prompt_width - length
        sources.extend(range(first, first + length))
        positions.extend(range(length))

    def completion_of(row: int) -> None:
        """Row `row`'s completion tokens: token i's hidden state precedes token i + 1."""
        length, offset = rows.completions[row], rows.prompts[row]
        first = row * width + prompt_width
        sources.extend(range(first, first + length))
        positions.extend(range(offset, offset + length))
        outputs.extend(row * completion_len + i + 1 for i in range(length - 1))
        outputs.extend(itertools.islice(trash, min(length, 1)))

    if not rows.shares_prompts():
        for row in range(count):
            prompt_of(row)  # its last token's hidden state precedes the completion
            outputs.extend(itertools.islice(trash, rows.prompts[row] - 1))
            outputs.append(row * completion_len)
            completion_of(row)
        lengths = [p + c for p, c in zip(rows.prompts, rows.completions, strict=True)]
        lists = {
            "sources": sources,
            "positions": positions,
            "query_bounds": _bounds(lengths),
            "key_bounds": _bounds(lengths),
            "outputs": outputs,
        }
        return _Plan(lists, max(lengths), max(lengths), None)

    groups = rows.groups or ()
    firsts: dict[int, int] = {}  # each prompt's first row, in order
    for row, group in enumerate(groups):
        firsts.setdefault(group, row)
    prompt_lengths = [rows.prompts[first] for first in firsts.values()]
    for first in firsts.values():
        prompt_of(first)
    for row in range(count):
        completion_of(row)
    longest = max(prompt_lengths)
    number = {group: u for u, group in enumerate(firsts)}
    row_prompt = [number[group] for group in groups]
    key_lengths = prompt_lengths + [
        prompt_lengths[u] + c for u, c in zip(row_prompt, rows.completions, strict=True)
    ]
    key_starts = _bounds(key_lengths)
    own = [key_starts[u] + i for u, length in enumerate(prompt_lengths) for i in range(length)]
    expanded = []
    spare = itertools.count(key_starts[-1])
    for row, u in enumerate(row_prompt):
        start = key_starts[len(prompt_lengths) + row]
        own.extend(start + prompt_lengths[u] + i for i in range(rows.completions[row]))
        expanded.extend(start + i for i in range(prompt_lengths[u]))
        expanded.extend(itertools.islice(spare, longest - prompt_lengths[u]))
    query_lengths = prompt_lengths + list(rows.completions)
    lists = {
        "sources": sources,
        "positions": positions,
        "query_bounds": _bounds(query_lengths),
        "key_bounds": key_starts,
        "outputs": outputs,
        "prompt_last": [end - 1 for end in itertools.accumulate(prompt_lengths)],
        "first_columns": list(range(0, count * completion_len, completion_len)),
        "prompt_slots": [u * longest + i for u, n in enumerate(prompt_lengths) for i in range(n)],
        "select": [int(u == v) for u in row_prompt for v in range(len(prompt_lengths))],
        "own": own,
        "expanded": expanded,
    }
    sizes = {"prompt_tokens": sum(prompt_lengths), "width": longest, "size": key_starts[-1]}
    return _Plan(lists, max(query_lengths), max(key_lengths), sizes)


def _on_device(lists: dict[str, list[int]], device: torch.device) -> dict[str, torch.Tensor]:
    """`lists` as long tensors on `device`, in one `host_to_device` copy."""
    flat = host_to_device([v for values in lists.values() for v in values], device)
    parts = flat.split([len(values) for values in lists.values()])
    return dict(zip(lists, parts, strict=True))


def packed_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    completion_len: int,
    rows: RowLengths,
) -> torch.Tensor:
    """`[N, T, H]` hidden states of a decoder `trunk` before each of the last `completion_len`
    (T) tokens of `input_ids` `[N, W]` (prompts left-padded, completions right-padded, each
    row's real lengths in `rows`), from one forward of the rows' real tokens packed end to end,
    each prompt once where rows share it (the trunk's attention must be
    `packed_attention.ATTENTION`: `packed_attention.use_packed_attention`).

    Position ids count real tokens only, as in the padded forward, whose results these equal
    up to float rounding; values on padding are 0.
    """
    count, width = input_ids.shape
    plan = _plan(rows, width, completion_len)
    device = input_ids.device
    at = _on_device(plan.lists, device)
    shared = None
    if plan.shared is not None:
        prompts = len(at["prompt_last"])
        shared = SharedPrompts(
            prompt_slots=at["prompt_slots"],
            select=at["select"].view(count, prompts).to(trunk.get_input_embeddings().weight.dtype),
            own=at["own"],
            expanded=at["expanded"],
            **plan.shared,
        )
    out = trunk(
        input_ids=input_ids.flatten()[at["sources"]][None],
        # transformers passes a 4-D mask to the attention untouched, so it builds none and reads
        # nothing back; the packed attention needs none: the segments' bounds say it all
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device),
        position_ids=at["positions"][None],
        use_cache=False,
        cu_seq_lens_q=at["query_bounds"].to(torch.int32),
        cu_seq_lens_k=at["key_bounds"].to(torch.int32),
        max_length_q=plan.longest_query,
        max_length_k=plan.longest_key,
        shared_prompts=shared,
    )
    hidden = out.last_hidden_state[0]
    size = count * completion_len
    placed = hidden.new_zeros(size + len(plan.lists["sources"]), hidden.shape[-1])
    if shared is None:
        placed = placed.index_copy(0, at["outputs"], hidden)
    else:
        # each prompt's last hidden state precedes the first completion token of all its rows
        last = shared.select @ hidden[at["prompt_last"]]
        placed = placed.index_copy(0, at["outputs"], hidden[shared.prompt_tokens :])
        placed = placed.index_copy(0, at["first_columns"], last)
    return placed[:size].view(count, completion_len, -1)
