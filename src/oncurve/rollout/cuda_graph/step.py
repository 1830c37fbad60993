"""The static decode step of a `cuda_graph` sampler: which models it reproduces (`supports`),
their projections laid out for it (`lay_out_projections`), one decoder layer for one token per
row over the static cache (`_layer_step`), and the step's regions around the draw, compiled or
eager (`StaticStep`: compiling them, and decoding uncompiled once that fails).
"""

from __future__ import annotations

import dataclasses
import sys
import time
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F

from oncurve.errors import error_line
from oncurve.rollout.base import SamplingParams
from oncurve.rollout.cuda_graph.workspace import Workspace

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def supports(model: torch.nn.Module, total_len: int | None = None) -> bool:
    """Whether the static step reproduces `model`'s forward for sequences of `total_len` tokens
    (None: for some length): a Llama/Qwen2/Qwen3/Mistral (LoRA adapters allowed) with static
    RoPE and no sliding window shorter than the sequence."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return False
    window = getattr(config, "sliding_window", None)
    windowed = getattr(config, "use_sliding_window", True)
    if window is not None and windowed and total_len is not None and window < total_len:
        return False
    attention = model.base_model.layers[0].self_attn
    return all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# (weight, bias) of projections that one matmul computes: their rows, back to back
Together = tuple[torch.Tensor, torch.Tensor | None]


def _projection_groups(layer: torch.nn.Module) -> tuple[list, list]:
    """The projections of a decoder layer that read the same input: q, k and v; gate and up."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
    return qkv, [getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)]


def _plain(linears: list) -> bool:
    """Plain `nn.Linear`s (no LoRA wrapper) of one input width, dtype and device, with dense
    weights (not FSDP2's sharded ones) and biases on all or none."""
    if not all(type(m) is torch.nn.Linear for m in linears):
        return False
    weights = [m.weight for m in linears]
    return (
        len({(w.shape[1], w.dtype, w.device) for w in weights}) == 1
        and all(type(w.data) is torch.Tensor for w in weights)
        and len({m.bias is None for m in linears}) == 1
    )


def _together(linears: list) -> Together | None:
    """The weight and bias of `linears` as one projection, read in place: views that span
    their rows, when each tensor begins where the previous one ends in one storage (as
    `lay_out_projections` leaves them), else None."""
    if not _plain(linears):
        return None
    spans = []
    for name in ("weight", "bias"):
        parts = [getattr(m, name) for m in linears]
        if parts[0] is None:
            spans.append(None)
            continue
        first = parts[0]
        storage = first.untyped_storage().data_ptr()  # tensors apart may still lie adjacent
        step = first[0].numel() * first.element_size()  # bytes a row
        at = first.data_ptr()
        for part in parts:
            same = part.untyped_storage().data_ptr() == storage
            if not (same and part.is_contiguous() and part.data_ptr() == at):
                return None
            at += part.shape[0] * step
        rows = sum(part.shape[0] for part in parts)
        spans.append(first.detach().as_strided((rows, *first.shape[1:]), first.stride()))
    return spans[0], spans[1]


def lay_out_projections(model: torch.nn.Module) -> int:
    """Store each decoder layer's q, k and v weights (and biases) back to back in one tensor,
    and its gate and up weights in another, so that the decode step computes each group with
    one matmul (`_layer_step`): a layer's kernels on a GPU are each worth a few microseconds
    of launch, whatever their size. The parameters stay the same objects with the same values,
    now views (`Parameter.data`), so the optimizer, the training forward and an optimizer's
    in-place update are as before, and the step reads the updated weights in place. LoRA-
    wrapped and sharded (FSDP2) projections are left as they are. Returns the groups laid out
    (already laid out ones included)."""
    groups = [g for layer in model.base_model.layers for g in _projection_groups(layer)]
    groups = [linears for linears in groups if _plain(linears)]
    with torch.no_grad():
        for linears in groups:
            if _together(linears) is not None:
                continue
            for name in ("weight", "bias"):
                parts = [getattr(m, name) for m in linears]
                if parts[0] is not None:
                    whole = torch.cat([p.detach() for p in parts])
                    for part, view in zip(parts, whole.split([len(p) for p in parts]), strict=True):
                        part.data = view
    return len(groups)


def _layer_step(
    layer: torch.nn.Module,
    x: torch.Tensor,
    mlp_out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    column: torch.Tensor,
    bias: torch.Tensor,
    heads: int,
    kv_heads: int,
    qkv: Together | None,
    gate_up: Together | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer for one token per row: writes the token's key and value at `column` of
    the layer's static cache. `qkv` and `gate_up` are the layer's projections as one each
    (`_together`), or None to run them one by one.

    The residual stream arrives as the previous layer's `x` and `mlp_out`, and leaves as this
    layer's: their sum is formed here, where it fuses with the input norm into one kernel (the
    matmul that makes `mlp_out` cannot take it; the last sum goes into the final norm).

    Shapes: x, mlp_out `[n, 1, H]`; cos, sin `[n, 1, 1, d]`; keys, values `[n, kv_heads, L,
    d]`; column `[1]`; bias `[n, 1, 1, L]`, 0 on the columns a row attends to, -inf elsewhere.
    """
    rows = x.shape[0]
    attention = layer.self_attn
    head_dim = attention.head_dim
    x = x + mlp_out
    h = layer.input_layernorm(x)
    if qkv is None:
        q, k, v = attention.q_proj(h), attention.k_proj(h), attention.v_proj(h)
    else:
        kv_width = kv_heads * head_dim
        q, k, v = F.linear(h, *qkv).split([heads * head_dim, kv_width, kv_width], dim=-1)
    q = q.view(rows, 1, heads, head_dim)
    k = k.view(rows, 1, kv_heads, head_dim)
    v = v.view(rows, 1, kv_heads, head_dim)
    if hasattr(attention, "q_norm"):  # Qwen3 normalises each head before RoPE
        q, k = attention.q_norm(q), attention.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [n, h, 1, d]
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys.index_copy_(2, column, k)
    values.index_copy_(2, column, v)
    # grouped-query attention without repeating the cache: a kv head's query heads stand in
    # the query-length dimension, where no causal mask separates them
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        grouped, keys, values, attn_mask=bias, scale=attention.scaling
    )
    x = x + attention.o_proj(out.reshape(rows, 1, heads * head_dim))
    h = layer.post_attention_layernorm(x)
    mlp = layer.mlp
    if gate_up is None:
        return x, mlp(h)
    gate, up = F.linear(h, *gate_up).chunk(2, dim=-1)
    return x, mlp.down_proj(mlp.act_fn(gate) * up)


def _compiled(fn: Callable, dynamic: bool = False) -> Callable:
    """`fn` compiled by inductor as one graph, for static shapes or (`dynamic`) symbolic ones,
    with a compile cache of its own. Dynamo keeps compiled code per code object, shared by
    every `torch.compile` of it and limited to 8 entries (past them a `fullgraph` compile
    fails); static shapes need one entry per bucket of each workspace, so each bucket's region
    compiles a copy of the code."""
    if isinstance(fn, types.MethodType):
        return types.MethodType(_compiled(fn.__func__, dynamic), fn.__self__)
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    # no CUDA graphs of inductor's own (mode="default"): the sampler captures the whole step
    return torch.compile(copy, dynamic=dynamic, fullgraph=True)


@dataclasses.dataclass
class Regions:
    """The callables of a decode step around its draw, compiled or eager: `enter` (embedding,
    rotary tables, the attention bias), `layer` (`_layer_step`, for every layer), `leave`
    (final norm, float32 logits, what the draw reads) and, after the draw, `record` (the
    drawn tokens' logprobs and the bookkeeping)."""

    enter: Callable
    layer: Callable
    leave: Callable
    record: Callable


class StaticStep:
    """`GraphSampler`'s decode step (`_step`): the regions of a bucket of a workspace, compiled
    while `compile_step` is on (one compilation per bucket, or with `dynamic_compile` one for
    all), run over its layers; the regions' bodies are `StepEdges`'."""

    def _step(self, ws: Workspace, rows: int, params: SamplingParams) -> None:
        """Feed the first `rows` decoder rows' tokens, draw the next ones: static shapes, no
        host synchronisation (what a graph captures). With compiling on, the first call of a
        bucket's regions compiles them (`compile_seconds`); when compiling fails
        the step runs eagerly, now and from then on. Before its last region a step only
        rewrites what it would write again, so running it again after a failure samples the
        same."""
        regions, fresh = self._regions(ws, rows)
        if not self.compile_step:
            self._run_step(ws, rows, params, regions)
            return
        start = time.perf_counter()
        try:
            self._run_step(ws, rows, params, regions)
        except torch.OutOfMemoryError:
            raise  # a step that does not fit is the caller's to handle, compiled or not
        except Exception as error:  # noqa: BLE001 - any failure to compile: the eager step
            self._stop_compiling(error)
            self._run_step(ws, rows, params, self._regions(ws, rows)[0])
        finally:
            if fresh:
                self.compile_seconds += time.perf_counter() - start

    def _regions(self, ws: Workspace, rows: int) -> tuple[Regions, bool]:
        """The step's regions for the first `rows` decoder rows of `ws` while `compile_step` is
        on: compiled for this bucket of a workspace of its sizes, or (`dynamic_compile`) for
        all; else eager. And whether they run for such a bucket for the first time (when they
        may compile)."""
        if not self.compile_step:
            return Regions(self._enter, _layer_step, self._leave, self._record), False
        shape = ws.shape(rows)
        fresh = shape not in self._compiled
        if fresh and self.dynamic_compile:
            if self._dynamic_regions is None:
                self._dynamic_regions = self._compile_regions(dynamic=True)
            self._compiled[shape] = self._dynamic_regions
        elif fresh:
            self._compiled[shape] = self._compile_regions(dynamic=False)
        return self._compiled[shape], fresh

    def _compile_regions(self, dynamic: bool) -> Regions:
        return Regions(
            _compiled(self._enter, dynamic),
            _compiled(_layer_step, dynamic),
            _compiled(self._leave, dynamic),
            _compiled(self._record, dynamic),
        )

    def _run_step(self, ws: Workspace, rows: int, params: SamplingParams, regions: Regions) -> None:
        """`_step` with the given regions."""
        config = self.model.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        x, mlp_out, cos, sin, bias = regions.enter(ws, rows)
        layers = self.model.base_model.layers
        projections = self._call_projections or self._projections()
        for layer, keys, values, (qkv, gate_up) in zip(
            layers, ws.keys, ws.values, projections, strict=True
        ):
            x, mlp_out = regions.layer(
                layer, x, mlp_out, cos, sin, keys[:rows], values[:rows], ws.column, bias, heads,
                kv_heads, qkv, gate_up,
            )  # fmt: skip
        eos = self._eos_mask(self.model.get_output_embeddings().weight.shape[0], x.device)
        settings = (params.temperature, params.min_new_tokens, params.truncation, eos)
        inputs = regions.leave(ws, rows, x, mlp_out, *settings)
        self._sample_and_record(ws, rows, inputs, eos, params, regions.record)

    def _projections(self) -> list[tuple[Together | None, Together | None]]:
        """Each layer's q/k/v and gate/up as `_layer_step` takes them (`_together`), as the
        weights lie now: worked out once a call, as it takes tens of microseconds a layer on
        the host, which an eager step (graphs off) would pay every token."""
        layers = self.model.base_model.layers
        return [tuple(_together(g) for g in _projection_groups(layer)) for layer in layers]

    def _stop_compiling(self, error: BaseException) -> None:
        """Run the uncompiled step from now on (the same samples as an uncompiled sampler's,
        more kernel launches), saying why."""
        self.compile_error = error_line(error)
        self.compile_step = False
        self._dynamic_regions = None
        self._compiled.clear()
        print(
            f"warning: cuda_graph sampler: compiling the decode step failed "
            f"({self.compile_error}); decoding with the uncompiled step for the rest of the run",
            file=sys.stderr,
        )
