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
same single forward. The model's attention implementation becomes `ATTENTION`, which runs
packed calls so and hands every other call (the sampler's, evaluation's, a padded forward's)
to sdpa unchanged.
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from dataclasses import dataclass

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from oncurve.errors import error_line
from oncurve.model.devices import host_to_device
from oncurve.model.kv_cache import real_token_positions

ATTENTION = "oncurve_packed"
# where packed rows take torch's variable-length flash attention (tests add "meta": the CUDA
# path's shapes and calls, checked without a GPU)
VARLEN_DEVICES = ("cuda",)


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
    each prompt once where rows share it (the trunk's attention must be `ATTENTION`:
    `use_packed_attention`).

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


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function (`AttentionInterface`): `query` `[1, H, S, D]`, `key`
    and `value` `[1, H_kv, S, D]` of a packed sequence whose segments' bounds are
    `cu_seq_lens_q` and `cu_seq_lens_k` `[R+1]` (keys and values made with `shared_prompts`
    where prompts are shared), each segment's queries causal over its keys, aligned at the
    end; returns `[1, S, H, D]`. A call without `cu_seq_lens_q` is sdpa's."""
    query_bounds = kwargs.get("cu_seq_lens_q")
    if query_bounds is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    if dropout or kwargs.get("softcap") is not None:
        raise ValueError("packed rows take attention without dropout or logit soft-capping")
    window = kwargs.get("sliding_window")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]
    shared = kwargs.get("shared_prompts")
    if isinstance(shared, SharedPrompts):
        k, v = shared.keys_and_values(k, v)
    key_bounds = kwargs["cu_seq_lens_k"]
    longest = (int(kwargs["max_length_q"]), int(kwargs["max_length_k"]))
    if q.device.type in VARLEN_DEVICES:
        out = _varlen_attention(q, k, v, query_bounds, key_bounds, longest, scaling, window)
    else:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = _attention_by_segments(q, k, v, query_bounds, key_bounds, scaling, window)
    return out[None], None


def _varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_bounds: torch.Tensor,
    key_bounds: torch.Tensor,
    longest: tuple[int, int],
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """`[S, H, D]` torch's variable-length flash attention, causal aligned at each segment's
    end (within `window` tokens)."""
    from torch.nn.attention.varlen import varlen_attn

    options: dict[str, object] = {"window_size": (-1 if window is None else window - 1, 0)}
    if "enable_gqa" in VARLEN_PARAMETERS:
        options["enable_gqa"] = k.shape[1] < q.shape[1]
    else:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return varlen_attn(q, k, v, query_bounds, key_bounds, *longest, scale=scale, **options)


# Reading the bounds is free on the CPU; under `torch.compile` (`model.compile_layers`) the
# loop runs eagerly instead of recompiling for every count of segments.
@torch.compiler.disable
def _attention_by_segments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_bounds: torch.Tensor,
    key_bounds: torch.Tensor,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """`[S, H, D]` each segment's attention over its own keys, causal aligned at the end
    (within `window` tokens), one sdpa call a segment; `k` and `v` have the query's H heads."""
    out = []
    segments = zip(
        itertools.pairwise(query_bounds.tolist()),
        itertools.pairwise(key_bounds.tolist()),
        strict=True,
    )
    for (q_first, q_end), (k_first, k_end) in segments:
        queries, keys = q_end - q_first, k_end - k_first
        if queries == 0:
            continue
        # query i sees key j where j <= i + (keys - queries), as flash attention aligns them
        behind = (torch.arange(queries, device=q.device)[:, None] + keys - queries) - torch.arange(
            keys, device=q.device
        )
        allowed = behind >= 0
        if window is not None:
            allowed &= behind < window
        attended = torch.nn.functional.scaled_dot_product_attention(
            q[q_first:q_end].transpose(0, 1),
            k[k_first:k_end].transpose(0, 1),
            v[k_first:k_end].transpose(0, 1),
            attn_mask=allowed,
            scale=scale,
        )
        out.append(attended.transpose(0, 1))
    return torch.cat(out)


def _varlen_parameters() -> frozenset[str]:
    """The parameters of this torch's `varlen_attn`; empty where it has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


# read once at import: a compiled layer (`model.compile_layers`) then finds a constant, where a
# call would be traced into `inspect` on every compilation
VARLEN_PARAMETERS = _varlen_parameters()


def unsupported(model: transformers.PreTrainedModel) -> str | None:
    """Why `model`'s training forward cannot run packed here, or None when it can."""
    config = model.config
    implementation = config._attn_implementation
    if implementation not in ("sdpa", ATTENTION):
        return f"the model's attention is {implementation}; packed rows replace sdpa only"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "the model soft-caps its attention logits"
    if model.device.type == "cuda":
        if "window_size" not in VARLEN_PARAMETERS:
            return f"torch {torch.__version__} has no variable-length attention (2.11+)"
        if model.dtype not in (torch.bfloat16, torch.float16):
            return f"CUDA's variable-length flash attention takes no {model.dtype}"
    return None


def use_packed_attention(model: transformers.PreTrainedModel) -> None:
    """Switch `model`'s attention to `ATTENTION` (padded calls still go to sdpa, masks too)."""
    transformers.AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)


def packed_failure(model: transformers.PreTrainedModel) -> str | None:
    """Why `model`'s packed forward fails where it is, or None: three rows of random tokens
    (two sharing a prompt, one completion a single token), packed with the prompt shared and
    with every row whole, each against the padded forward, forward and backward, equal within
    bf16 rounding. The backward, of the hidden states along a random direction, is taken to
    the embeddings of the tokens used (a token's
    gradients summed, so that a prompt run once compares with its copies), through every
    layer's attention.

    Run before a run packs by default, on the run's model and device, so that a kernel, a
    layout or a transformers release that the packed path does not meet ends in padded rows
    and one warning, not in a failed update.
    """
    prompts, completions = (4, 4, 2), (3, 1, 5)
    g = torch.Generator().manual_seed(0)
    embedding = model.get_input_embeddings()
    prompt = torch.randint(embedding.num_embeddings, (4,), generator=g)
    ids = torch.randint(embedding.num_embeddings, (3, 9), generator=g)
    ids[1, :4] = ids[0, :4] = prompt
    mask = torch.cat(
        [
            torch.arange(4) >= 4 - torch.tensor(prompts)[:, None],
            torch.arange(5) < torch.tensor(completions)[:, None],
        ],
        dim=1,
    ).long()
    # made on the host (the same tokens whatever the device), then moved to the model's
    ids, mask = (ids * mask).to(model.device), mask.to(model.device)
    used = torch.unique(ids)
    table = embedding(used).detach().requires_grad_()

    def embed(module: torch.nn.Module, args: tuple[torch.Tensor], out: torch.Tensor) -> object:
        return table[torch.searchsorted(used, args[0])]

    hook = embedding.register_forward_hook(embed)
    direction = torch.randn(3, 5, embedding.embedding_dim, generator=g).to(model.device)
    results = []
    try:
        # the gradients are compared within a tolerance: torch's warnings that an attention's
        # backward adds in no fixed order (deterministic mode's warn-only) do not apply
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*non-deterministic algorithm", UserWarning)
            for groups in (None, (0, 0, 1), ()):
                if groups is None:
                    hidden = model.base_model(
                        input_ids=ids,
                        attention_mask=mask,
                        position_ids=real_token_positions(mask),
                        use_cache=False,
                    ).last_hidden_state[:, 3:-1]
                else:
                    rows = RowLengths(prompts, completions, groups or None)
                    hidden = packed_hidden(model.base_model, ids, 5, rows)
                hidden = hidden.float() * mask[:, 4:, None]
                # a fixed random direction: the sum of squares after a final norm hardly
                # depends on the input, which leaves its gradient to rounding
                (grad,) = torch.autograd.grad((hidden * direction).sum(), table)
                results.append((hidden.detach(), grad.float()))
    except Exception as error:  # the check exists to turn any failure into a reason
        return error_line(error)
    finally:
        hook.remove()
    padded = results[0]
    for way, packed in (("shared prompts", results[1]), ("whole rows", results[2])):
        for name, got, want in zip(("hidden states", "gradient"), packed, padded, strict=True):
            gap = float((got - want).norm() / want.norm().clamp(min=1e-12))
            if not gap < 0.05:
                return f"its {name} ({way}) differ from the padded forward's by {gap:.3g}"
    return None
