"""The training forward without padding: a microbatch's rows packed end to end by their real
tokens, as verl's remove-padding does.

The rows' real tokens become one sequence `[1, sum of lengths]` and each row attends only to
its own tokens, through the rows' bounds (`cu_seq_lens_q`, as transformers' flash attention
takes them) rather than a mask: on CUDA torch's variable-length flash attention
(`torch.nn.attention.varlen`), elsewhere one `scaled_dot_product_attention` call a row. The
model's attention implementation becomes `ATTENTION`, which runs packed calls so and hands
every other call (the sampler's, evaluation's, a padded forward's) to sdpa unchanged.
"""

from __future__ import annotations

import functools
import inspect
import itertools

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from oncurve.errors import error_line
from oncurve.models import real_token_positions

ATTENTION = "oncurve_packed"
# where packed rows take torch's variable-length flash attention (tests add "meta": the CUDA
# path's shapes and calls, checked without a GPU)
VARLEN_DEVICES = ("cuda",)


def packed_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    tokens: int,
) -> torch.Tensor:
    """`[N, T, H]` hidden states of a decoder `trunk` before each of the last `completion_len`
    (T) tokens of `input_ids` `[N, L]`, from one forward of the rows' `tokens` real tokens
    packed end to end (the trunk's attention must be `ATTENTION`: `use_packed_attention`).

    Position ids count real tokens only, as in the padded forward, whose results these equal
    up to float rounding; values on padding are 0. `tokens` (`attention_mask.sum()`) and L,
    which bounds every row's length, are the host's, so nothing is read back from the device.
    """
    rows, width = input_ids.shape
    padding = (attention_mask.flatten() == 0).to(torch.uint8)
    # a stable sort puts the real tokens first, each row's in order and rows one after another
    real = torch.argsort(padding, stable=True)[:tokens]
    starts = torch.nn.functional.pad(attention_mask.sum(1).cumsum(0), (1, 0)).to(torch.int32)
    out = trunk(
        input_ids=input_ids.flatten()[real][None],
        # transformers passes a 4-D mask to the attention untouched, so it builds none and reads
        # nothing back; the packed attention needs none: the rows' bounds are `starts`
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=input_ids.device),
        position_ids=real_token_positions(attention_mask).flatten()[real][None],
        use_cache=False,
        cu_seq_lens_q=starts,
        cu_seq_lens_k=starts,
        max_length_q=width,
        max_length_k=width,
    )
    hidden = out.last_hidden_state[0]
    padded = hidden.new_zeros(rows * width, hidden.shape[-1]).index_copy(0, real, hidden)
    return padded.view(rows, width, -1)[:, -completion_len - 1 : -1]


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
    and `value` `[1, H_kv, S, D]` of packed rows whose bounds are `cu_seq_lens_q` `[R+1]`,
    each row causal within itself; returns `[1, S, H, D]`. A call without `cu_seq_lens_q` is
    sdpa's."""
    starts = kwargs.get("cu_seq_lens_q")
    if starts is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    if dropout or kwargs.get("softcap") is not None:
        raise ValueError("packed rows take attention without dropout or logit soft-capping")
    window = kwargs.get("sliding_window")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, D]
    if q.device.type in VARLEN_DEVICES:
        out = _varlen_attention(q, k, v, starts, int(kwargs["max_length_q"]), scaling, window)
    else:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = _attention_by_rows(q, k, v, starts, scaling, window)
    return out[None], None


def _varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: torch.Tensor,
    longest: int,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """`[S, H, D]` torch's variable-length flash attention, causal (within `window` tokens)."""
    from torch.nn.attention.varlen import varlen_attn

    options: dict[str, object] = {"window_size": (-1 if window is None else window - 1, 0)}
    if "enable_gqa" in _varlen_parameters():
        options["enable_gqa"] = k.shape[1] < q.shape[1]
    else:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return varlen_attn(q, k, v, starts, starts, longest, longest, scale=scale, **options)


# Reading the bounds is free on the CPU; under `torch.compile` (`model.compile_layers`) the rows
# loop runs eagerly instead of recompiling for every count of rows.
@torch.compiler.disable
def _attention_by_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: torch.Tensor,
    scale: float | None,
    window: int | None,
) -> torch.Tensor:
    """`[S, H, D]` each row's causal attention (within `window` tokens) over its own tokens,
    one sdpa call a row; `k` and `v` have the query's H heads."""
    bounds = starts.tolist()
    out = []
    for first, end in itertools.pairwise(bounds):
        rq, rk, rv = (t[first:end].transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        band = None
        if window is not None and end - first > window:
            ahead = torch.arange(end - first, device=q.device)
            behind = ahead[:, None] - ahead[None, :]
            band = (behind >= 0) & (behind < window)
        attended = torch.nn.functional.scaled_dot_product_attention(
            rq, rk, rv, attn_mask=band, is_causal=band is None, scale=scale
        )
        out.append(attended.transpose(0, 1))
    return torch.cat(out)


@functools.cache
def _varlen_parameters() -> frozenset[str]:
    """The parameters of this torch's `varlen_attn`; empty where it has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


def unsupported(model: transformers.PreTrainedModel) -> str | None:
    """Why `model`'s training forward cannot run packed here, or None when it can."""
    config = model.config
    implementation = config._attn_implementation
    if implementation not in ("sdpa", ATTENTION):
        return f"the model's attention is {implementation}; packed rows replace sdpa only"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "the model soft-caps its attention logits"
    if model.device.type == "cuda":
        if "window_size" not in _varlen_parameters():
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
    (one a single token), packed and padded, each forward and its backward to the token
    embeddings (through every layer's attention), the two equal within bf16 rounding.

    Run before a run packs by default, on the run's model and device, so that a kernel, a
    layout or a transformers release that the packed path does not meet ends in padded rows
    and one warning, not in a failed update.
    """
    lengths = torch.tensor([5, 1, 9])
    mask = (torch.arange(9) < lengths[:, None]).long().to(model.device)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(vocab, mask.shape, generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device) * mask
    embedded: list[torch.Tensor] = []

    def leaf(module: torch.nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        embedded.append(out.detach().requires_grad_())
        return embedded[-1]

    results = []
    hook = model.get_input_embeddings().register_forward_hook(leaf)
    try:
        for tokens in (0, int(lengths.sum())):
            if tokens:
                hidden = packed_hidden(model.base_model, ids, mask, 8, tokens)
            else:
                out = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
                hidden = out.last_hidden_state[:, :-1]
            hidden = hidden.float() * mask[:, :-1, None]
            (grad,) = torch.autograd.grad(hidden.square().sum(), embedded[-1])
            # the real tokens' gradients, in the packed order (rows are right-padded here)
            grad = grad[0] if tokens else grad[mask.bool()]
            results.append((hidden.detach(), grad.float()))
    except Exception as error:  # the check exists to turn any failure into a reason
        return error_line(error)
    finally:
        hook.remove()
    for name, got, want in zip(("hidden states", "gradient"), *results[::-1], strict=True):
        gap = float((got - want).norm() / want.norm().clamp(min=1e-12))
        if not gap < 0.05:
            return f"its {name} differ from the padded forward's by {gap:.3g} (relative)"
    return None
