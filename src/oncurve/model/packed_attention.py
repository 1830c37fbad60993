"""The attention of packed rows (`oncurve.model.packing`): a transformers attention
implementation, `ATTENTION`, that runs a packed sequence's segments each within its own bounds
(`cu_seq_lens_q`, `cu_seq_lens_k`, as transformers' flash attention takes them) rather than by
a mask: on CUDA torch's variable-length flash attention (`torch.nn.attention.varlen`),
elsewhere one `scaled_dot_product_attention` call a segment. Every other call (the sampler's,
evaluation's, a padded forward's) goes to sdpa unchanged.

Also here: the variable-length kernel of each device type (`VARLEN_KERNELS`), whether a model
can run packed (`unsupported`), the switch (`use_packed_attention`), and the check that the
packed forward equals the padded one where it runs (`packed_failure`).
"""

from __future__ import annotations

import inspect
import itertools
import warnings
from collections.abc import Callable

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from oncurve.errors import error_line
from oncurve.model.kv_cache import real_token_positions
from oncurve.model.packing import RowLengths, SharedPrompts, packed_hidden

ATTENTION = "oncurve_packed"
# fn(q, k, v, query_bounds, key_bounds, (longest query, longest key), scale, window) -> [S, H, D],
# with q `[S, H, D]` and k, v `[S_k, H_kv, D]`, each segment causal aligned at its end
VarlenKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int],
     float | None, int | None],
    torch.Tensor,
]  # fmt: skip


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
    kernel = VARLEN_KERNELS.get(q.device.type)
    if kernel is not None:
        out = kernel(q, k, v, query_bounds, key_bounds, longest, scaling, window)
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

# The public registry of variable-length kernels: device type -> the kernel packed rows run
# there, read by every packed call. Null `model.pack_rows` packs by default on the device types
# listed. A device type without one runs an sdpa call a segment. Registering a kernel for
# another device type lets a caller run CUDA's path where no GPU is: the tests register "meta"
# (the path's shapes and calls), the micro-benchmarks a one-op stand-in on the CPU.
VARLEN_KERNELS: dict[str, VarlenKernel] = {"cuda": _varlen_attention}


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
