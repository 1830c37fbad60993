"""The `cuda_graph` backend: a static-cache decode for the Llama family, replayed as CUDA graphs.

On a GPU a decode step is a few hundred small kernels whose launches, not their memory traffic,
set the pace. This backend makes every shape static so that the whole step (the model's forward
for one token per row, temperature / top-k / top-p / min-p, the draw, the drawn token's logprob,
EOS bookkeeping) is captured once as a CUDA graph and replayed:

- one KV cache `[rows, kv_heads, L, head_dim]` per layer (`_cache_columns`: W + new - 1 and up to
  15 never attended to), allocated for all rows; the B
  prompts are prefilled once (Hugging Face forward) and each copied into its G rows; attention
  runs over every column with a visibility mask, so its shape never changes;
- the uniforms of every draw are drawn up front from the call's seed (`[new, rows]`), and a row
  reads those of its output row, so compaction never changes what a row samples;
- graphs are captured per batch-size bucket (rows, then halves down to 8): once the live rows
  fit a smaller bucket, they are gathered to the front and the smaller graph runs, so finished
  rows stop costing compute;
- prompt widths are rounded up to a multiple of `WIDTH_STEP`, so steps whose prompts differ by a
  few tokens replay the same graphs.

The step calls the model's own modules (norms, projections, MLP, rotary embedding), so it reads
the training weights in place: after an optimizer step the next rollout samples the new weights
with no copy and no recapture, LoRA adapters included. The sampler lays each layer's q, k and v
weights out back to back in one tensor, and its gate and up weights in another
(`lay_out_projections`: the same parameters, now views), so that the step reads each group with
one matmul: three kernels fewer a layer. Only the attention over the static cache
is written here (grouped-query attention through `scaled_dot_product_attention`). Graphs are
recaptured only when a weight's storage moved (FSDP2 refills its whole-weights copy) or the
sampling settings or sizes change. Without CUDA the same step runs eagerly, which is how the CPU
tests check it.

Before it is captured the step is compiled (`torch.compile`, inductor, static shapes, in four
regions: entering the layers, one decoder layer, leaving them up to what the draw reads of the
float32 logits, and recording what was drawn), so that norms, rotary embeddings, activations and
bookkeeping become a few fused kernels instead of a few hundred launches. The draw itself stays
uncompiled: inductor's code for a scan as wide as a real vocabulary (the inverse-CDF draw's
cumsum) fails on CUDA. Each bucket gets
its compiled regions, the layer's shared by every layer (they differ only in their weights,
which are inputs of the compiled code, read in place like the eager step's); the graphs capture
the compiled kernels. With `dynamic_compile` the regions are compiled once for every bucket and
workspace instead (`torch.compile(dynamic=True)`: sizes are symbols), the way vLLM compiles its
step before capturing a graph per batch size: a few seconds of compiling in all instead of a few
per bucket, with kernels for symbolic sizes. A failure to compile decodes with the eager step
from then on, with one warning.

Supported: Llama, Qwen2, Qwen3 and Mistral with static RoPE and no sliding window in reach;
`supports` says which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
import transformers

from oncurve.algo.logprobs import float_logits
from oncurve.errors import error_line
from oncurve.models import cache_argument, real_token_positions
from oncurve.rollout.base import SamplerSettings, SamplingParams, seeded_generator
from oncurve.rollout.torch_sampler import (
    _EOS,
    _LENGTH,
    TorchSampler,
    draw_token_ids,
    end_at_stops,
)
from oncurve.types import RolloutBatch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
WIDTH_STEP = 64  # prompt widths are padded to a multiple of this
SMALLEST_BUCKET = 8
COLUMN_ALIGNMENT = 16  # elements a row of the attention bias is aligned to
MAX_WORKSPACES = 2  # a run's training calls and an evaluation's chunks (`scratch`)
SETTINGS_PER_WORKSPACE = 3  # graphs kept per workspace: training, greedy and sampled evaluation


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


def _settings(params: SamplingParams) -> tuple:
    """What a captured or compiled step depends on of `params`: all but the seed, the first
    row and the stop strings (read outside the step)."""
    return dataclasses.astuple(dataclasses.replace(params, seed=None, stop=(), first_row=0))


def buckets(rows: int) -> list[int]:
    """Batch sizes that get a graph, largest first: `rows`, then powers of two below it down to
    `SMALLEST_BUCKET`."""
    sizes = [rows]
    size = 2 ** math.floor(math.log2(max(rows - 1, 1)))
    while size >= SMALLEST_BUCKET and size < rows:
        sizes.append(size)
        size //= 2
    return sizes


def _cache_columns(width: int, new: int) -> int:
    """KV cache columns of a workspace for `width` prompt columns and `new` tokens: the
    `width + new - 1` a call can fill, rounded up to a multiple of `COLUMN_ALIGNMENT`, so that
    the attention bias needs no padded copy (the memory-efficient attention kernel pads one
    whose rows are not aligned, at every call of every layer)."""
    return math.ceil((width + new - 1) / COLUMN_ALIGNMENT) * COLUMN_ALIGNMENT


def bucket_for(alive: int, sizes: list[int]) -> int:
    """The smallest of `sizes` that holds `alive` rows."""
    return min(s for s in sizes if s >= alive)


@contextlib.contextmanager
def _writes_once() -> Iterator[None]:
    """Deterministic algorithms off for the duration, then as they were. Every index the decode
    step writes is written once (a cache column, a row's token, logprob, end), so the usual
    kernels give the same result; in deterministic mode CUDA's `index_put_` and `index_copy_`
    sort their indices first, several kernels each where one does, and inductor compiles each
    such write as a call of that op, cut out of the fused kernel around it (two a layer)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


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
class _Regions:
    """The callables of a decode step around its draw, compiled or eager: `enter` (embedding,
    rotary tables, the attention bias), `layer` (`_layer_step`, for every layer), `leave`
    (final norm, float32 logits, what the draw reads) and, after the draw, `record` (the
    drawn tokens' logprobs and the bookkeeping)."""

    enter: Callable
    layer: Callable
    leave: Callable
    record: Callable


@dataclasses.dataclass
class _Workspace:
    """The static buffers calls of up to `rows` rows, `width` prompt columns and `new` tokens
    decode in; graphs read and write them in place.

    Shapes: N rows, L = `_cache_columns(W, new)` cache columns, V vocabulary.
    """

    rows: int
    width: int  # W, prompt columns
    new: int
    keys: list[torch.Tensor]  # per layer [N, kv_heads, L, head_dim]
    values: list[torch.Tensor]
    visible: torch.Tensor  # [N, L] bool: columns a row attends to
    tokens: torch.Tensor  # [N] the token each decoder row feeds next
    positions: torch.Tensor  # [N] its position (real tokens before it)
    row_ids: torch.Tensor  # [N] the output row of each decoder row
    alive: torch.Tensor  # [N] bool, per decoder row
    column: torch.Tensor  # [1] cache column the next step writes
    t: torch.Tensor  # [1] index of the token the next step samples
    uniforms: torch.Tensor  # [new, N] float32, by output row
    completion: torch.Tensor  # [N, new] by output row
    logprobs: torch.Tensor  # [N, new] float32
    ends: torch.Tensor  # [N] completion lengths
    reasons: torch.Tensor  # [N] finish reason codes
    # the graphs of each set of sampling settings, by bucket, oldest settings first
    graphs: dict[tuple, dict[int, torch.cuda.CUDAGraph]] = dataclasses.field(default_factory=dict)
    weights: tuple[int, ...] = ()  # data pointers of the weights the graphs read

    def shape(self, bucket: int) -> tuple[int, int, int, int]:
        """What a bucket's compiled regions are specialised to: their workspace's sizes and
        the bucket (a workspace of the same sizes, made again, runs the same code)."""
        return (self.rows, self.width, self.new, bucket)


class GraphSampler(TorchSampler):
    """A `Sampler` whose decode steps are CUDA graphs (see the module docstring); on a device
    without CUDA graphs the same steps run eagerly, and so do they, with one warning, for the
    rest of the sampler's life once a capture fails for any reason.

    Args:
        model: a model `supports` accepts (else `generate` refuses it), on its device; its
            projections are laid out (`lay_out_projections`).
        tokenizer: as `TorchSampler`'s.
        use_graphs: capture and replay graphs; default: when the model is on CUDA.
        compile_step: compile the decode step (module docstring); default: when the model is
            on CUDA.
        dynamic_compile: compile it once for every bucket, with symbolic sizes (module
            docstring), instead of once per bucket.

    Attributes:
        use_graphs: whether graphs are captured; False after a capture failed.
        graph_error: the first line of the error that made it False, else None.
        compile_step: whether the step is compiled; False after a compilation failed.
        compile_error: the first line of the error that made it False, else None.
        min_width: prompt columns every workspace has at least (the trainer sets it to its
            longest prompt, so that no training step meets a wider one and recaptures).
        capture_seconds: spent capturing graphs, over all calls (compiling not included).
        compile_seconds: spent compiling the step (the first step of each bucket of each
            workspace, with compiling on).
    """

    def __init__(
        self,
        model: transformers.PreTrainedModel,
        tokenizer,
        use_graphs: bool | None = None,
        compile_step: bool | None = None,
        dynamic_compile: bool = False,
    ):
        super().__init__(model, tokenizer)
        if supports(model):
            lay_out_projections(model)
        device = model.get_output_embeddings().weight.device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.compile_step = device.type == "cuda" if compile_step is None else compile_step
        self.dynamic_compile = dynamic_compile
        self._dynamic_regions: _Regions | None = None
        self.graph_error: str | None = None
        self.compile_error: str | None = None
        self.min_width = 0
        self.capture_seconds = 0.0
        self.compile_seconds = 0.0
        self._workspaces: list[_Workspace] = []  # least recently used first
        # by `_Workspace.shape`: they outlive their workspace, so one made again (an
        # evaluation's, `scratch`) captures again but does not compile again
        self._compiled: dict[tuple[int, int, int, int], _Regions] = {}
        self._warmup_stream: torch.cuda.Stream | None = None  # made at the first capture
        # each layer's `_together` groups while a call runs (its weights cannot move then)
        self._call_projections: list[tuple[Together | None, Together | None]] | None = None

    @torch.inference_mode()
    def generate_ids(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> RolloutBatch:
        """Sample `group_size` completions of each tokenized prompt; the result follows the
        `Sampler` contract (a prompt's G rows contiguous, completions right-padded)."""
        ids, mask = self._pad_prompts(prompt_ids, group_size, params)
        new, rows = params.max_new_tokens, ids.shape[0] * group_size
        width = self._width(ids.shape[1], new)
        if not supports(self.model, width + new):
            raise ValueError(
                f"the cuda_graph sampler does not support this {self.model.config.model_type} "
                f"model at {width + new} tokens; use rollout.backend=hf"
            )
        was_training = self.model.training
        self.model.eval()
        self._call_projections = self._projections()
        try:
            ws = self._workspace(rows, width, new)
            with _writes_once():
                graphs = self._prepare_graphs(ws, params)
            extra = ws.width - ids.shape[1]
            logits = self._prefill(
                ws,
                F.pad(ids, (extra, 0), value=self.pad_id),
                F.pad(mask, (extra, 0), value=0),
                group_size,
                params,
            )
            with _writes_once():
                self._decode(ws, rows, logits, params, graphs)
        finally:
            self.model.train(was_training)
            self._call_projections = None
        ends = ws.ends[:rows]
        longest = int(ends.max())
        return self._rollout(
            ids,
            mask,
            group_size,
            ws.completion[:rows, :longest],
            ws.logprobs[:rows, :longest],
            ends,
            ws.reasons[:rows],
            params,
        )

    # the static step's kernels compute logprobs apart from the trainer's forward; workspaces
    # are kept from call to call, so that their graphs are replayed
    exact_logprobs = False
    holds_cache = True
    compiles_steps = True

    def prepare(self, settings: SamplerSettings) -> None:
        """Capture graphs and compile the step as `settings` say; make every workspace as wide
        as the run's longest prompt."""
        self.use_graphs = settings.cuda_graphs
        self.compile_step = settings.compile
        self.min_width = settings.longest_prompt

    def metrics(self) -> dict[str, float]:
        """This process's totals, what a run pays up front: seconds compiling and capturing."""
        return {
            "time/sampler_compile_total": self.compile_seconds,
            "time/sampler_capture_total": self.capture_seconds,
        }

    def turned_off(self) -> dict[str, bool]:
        """`cuda_graphs` and `compile`, once a capture or a compilation failed."""
        failed = {"cuda_graphs": self.graph_error, "compile": self.compile_error}
        return {name: False for name, error in failed.items() if error is not None}

    def release(self) -> None:
        """Free the workspaces and their graphs (the next call captures again)."""
        self._workspaces.clear()

    @contextlib.contextmanager
    def scratch(self) -> Iterator[None]:
        """The workspaces made inside are freed at its end, with their graphs; those it finds
        stay. An evaluation runs in one: its workspace (up to `eval.batch_rows` rows at full
        length) would otherwise hold its KV cache through every update until the next
        evaluation, or the end; so does a training step's sampling when the cache is not kept
        (`rollout.keep_cache`). Made again, a workspace captures again (a fraction of a second)
        but runs the code its sizes compiled before."""
        # weakly: a `release` inside (to retry smaller after running out of memory) must free
        kept = [weakref.ref(ws) for ws in self._workspaces]
        try:
            yield
        finally:
            found = [ws for ws in self._workspaces if any(ws is k() for k in kept)]
            made = [weakref.ref(ws) for ws in self._workspaces if all(ws is not f for f in found)]
            self._workspaces = found
            if any(ws() is not None for ws in made):
                # Dynamo's tracing of a workspace's first steps leaves reference cycles that
                # hold it: collected now, its memory is free for the update that follows (a
                # whole collection takes a while, so only then)
                gc.collect()

    def _width(self, prompt_width: int, new: int) -> int:
        """Prompt columns of a call: its longest prompt or `min_width`, whichever is wider,
        rounded up to `WIDTH_STEP` within the model's positions."""
        width = math.ceil(max(prompt_width, self.min_width) / WIDTH_STEP) * WIDTH_STEP
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None:
            width = max(prompt_width, min(width, limit - new))
        return width

    def _workspace(self, rows: int, width: int, new: int) -> _Workspace:
        """The smallest kept workspace that holds this call, else a new one of its size.

        Up to `MAX_WORKSPACES` are kept, each with its KV cache allocated (graphs point into
        it): a run's training calls and its evaluation chunks each find theirs, instead of
        recapturing at every switch; a third shape replaces the least recently used."""
        fits = [
            ws for ws in self._workspaces if ws.new == new and ws.rows >= rows and ws.width >= width
        ]
        if fits:
            ws = min(fits, key=lambda w: (w.rows, w.width))
            self._workspaces.remove(ws)
            self._workspaces.append(ws)
            return ws
        if len(self._workspaces) >= MAX_WORKSPACES:
            self._workspaces.pop(0)
        trunk = self.model.base_model
        config = self.model.config
        head_dim = trunk.layers[0].self_attn.head_dim
        weight = self.model.get_output_embeddings().weight
        device, dtype = weight.device, weight.dtype
        columns = _cache_columns(width, new)
        shape = (rows, config.num_key_value_heads, columns, head_dim)
        layers = len(trunk.layers)

        def zeros(*size: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        ws = _Workspace(
            rows=rows,
            width=width,
            new=new,
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            visible=zeros(rows, columns, dtype=torch.bool),
            tokens=zeros(rows),
            positions=zeros(rows),
            row_ids=zeros(rows),
            alive=zeros(rows, dtype=torch.bool),
            column=zeros(1),
            t=zeros(1),
            uniforms=zeros(new, rows, dtype=torch.float32),
            completion=zeros(rows, new),
            logprobs=zeros(rows, new, dtype=torch.float32),
            ends=zeros(rows),
            reasons=zeros(rows),
        )
        self._workspaces.append(ws)
        return ws

    def _prepare_graphs(
        self, ws: _Workspace, params: SamplingParams
    ) -> dict[int, torch.cuda.CUDAGraph]:
        """The graphs, by bucket, of these sampling settings on `ws`: those captured before
        while the weights stay at the same addresses, else new ones; none (decode eagerly)
        without graphs, for fewer than 2 decode steps, or when the capture fails."""
        if not self.use_graphs or params.max_new_tokens < 3:
            return {}
        settings = _settings(params)
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        if ws.weights != weights:
            ws.graphs.clear()
            ws.weights = weights
        if settings in ws.graphs:
            ws.graphs[settings] = ws.graphs.pop(settings)  # most recently used last
            return ws.graphs[settings]
        if len(ws.graphs) >= SETTINGS_PER_WORKSPACE:
            ws.graphs.pop(next(iter(ws.graphs)))
        try:
            ws.graphs[settings] = self._capture(ws, params)
        except torch.OutOfMemoryError:
            raise  # a capture that does not fit is the caller's to redo smaller (`oncurve.oom`)
        except Exception as error:  # noqa: BLE001 - any failure to capture: decode eagerly
            self._stop_capturing(error)
            return {}
        return ws.graphs[settings]

    def _capture(self, ws: _Workspace, params: SamplingParams) -> dict[int, torch.cuda.CUDAGraph]:
        """Capture the step of every bucket of `ws`, after an eager warm-up (lazy
        initialisations, library workspaces, compiling) on a side stream."""
        start, compiling = time.perf_counter(), self.compile_seconds
        self._eos_mask(self.model.get_output_embeddings().weight.shape[0], ws.tokens.device)
        stream = torch.cuda.current_stream()
        if self._warmup_stream is None:
            # one for the sampler's life: cuBLAS keeps a workspace for each stream it ran on
            # until its workspaces are cleared, so a stream per capture (an evaluation's
            # workspace captures at every evaluation) could leave one behind each time
            self._warmup_stream = torch.cuda.Stream()
        side = self._warmup_stream
        side.wait_stream(stream)
        try:
            with torch.cuda.stream(side):
                # smallest first: compiling with symbolic sizes at the workspace's own row count
                # would tie the step to it (sizes equal by chance are assumed equal), and the next
                # bucket would compile again
                for rows in reversed(buckets(ws.rows)):
                    # a state that keeps every index in range; the prefill resets it
                    self._reset(ws, ws.rows, seed=0)
                    for _ in range(2):
                        self._step(ws, rows, params)
            stream.wait_stream(side)
            # A pool of its own for each round of captures: the first capture of the process
            # allocates cuBLAS's workspace in its pool, and that workspace outlives the graphs,
            # so a pool whose graphs were all freed can never be erased, and PyTorch's
            # allocator asserts (use_count > 0) when a later capture reuses it.
            pool = torch.cuda.graph_pool_handle()
            graphs = {}
            for rows in buckets(ws.rows):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._step(ws, rows, params)
                graphs[rows] = graph
            torch.cuda.synchronize()
        except BaseException:
            torch.cuda.set_stream(stream)  # a failed capture can leave the side stream current
            raise
        compiled = self.compile_seconds - compiling
        seconds = time.perf_counter() - start - compiled
        self.capture_seconds += seconds
        print(
            f"cuda_graph sampler: captured {len(graphs)} decode graphs "
            f"({', '.join(map(str, graphs))} rows) in {seconds:.1f} s"
            + (f", after compiling the step for {compiled:.1f} s" if compiled else ""),
            file=sys.stderr,
        )
        return graphs

    def _stop_capturing(self, error: BaseException) -> None:
        """Decode eagerly from now on (the same samples, more kernel launches), saying why."""
        self.graph_error = error_line(error)
        self.use_graphs = False
        for ws in self._workspaces:
            ws.graphs.clear()
        print(
            f"warning: cuda_graph sampler: capturing the decode step failed ({self.graph_error});"
            " decoding eagerly, with the same samples, for the rest of the run",
            file=sys.stderr,
        )

    def _reset(self, ws: _Workspace, rows: int, seed: int | None, first_row: int = 0) -> None:
        """Put every decode buffer in its state before the first draw, in place, for a call of
        `rows` rows (the workspace's others are dead from the start), rows `first_row`.. of
        the call with this `seed` (`SamplingParams.first_row`)."""
        device = ws.tokens.device
        ws.row_ids.copy_(torch.arange(ws.rows, device=device))
        ws.alive.fill_(False)
        ws.alive[:rows] = True
        ws.ends.fill_(ws.new)
        ws.reasons.fill_(_LENGTH)
        ws.column.fill_(ws.width)
        ws.t.fill_(0)
        ws.visible[:, ws.width :] = False
        # a row's draws are consecutive numbers of the stream, drawn for the call's rows only:
        # a row samples the same in any workspace and in any part of a call split to fit memory
        drawn = torch.rand(
            (first_row + rows, ws.new), generator=seeded_generator(seed, device), device=device
        )
        ws.uniforms.zero_()
        ws.uniforms[:, :rows] = drawn[first_row:].T

    def _prefill(
        self,
        ws: _Workspace,
        ids: torch.Tensor,
        mask: torch.Tensor,
        group_size: int,
        params: SamplingParams,
    ) -> torch.Tensor:
        """Forward the B prompts `[B, W]` once, copy each one's keys and values into its G rows
        of the static cache and set the decode state. Returns `[N, V]` float32 logits."""
        rows = ids.shape[0] * group_size
        self._reset(ws, rows, params.seed, params.first_row)
        trunk = self.model.base_model
        cache = transformers.DynamicCache(config=self.model.config)
        positions = real_token_positions(mask)
        out = trunk(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **cache_argument(trunk, cache),
        )
        for layer, keys, values in zip(cache.layers, ws.keys, ws.values, strict=True):
            keys[:rows, :, : ws.width] = layer.keys.repeat_interleave(group_size, 0)
            values[:rows, :, : ws.width] = layer.values.repeat_interleave(group_size, 0)
        ws.visible[:rows, : ws.width] = mask.bool().repeat_interleave(group_size, 0)
        ws.positions[:rows] = mask.sum(-1).repeat_interleave(group_size)
        # rows past the call's are dead but may share a bucket with live ones: they attend as
        # its first row does, so that they compute finite values
        ws.visible[rows:, : ws.width] = ws.visible[:1, : ws.width]
        ws.positions[rows:] = ws.positions[0]
        head = self.model.get_output_embeddings()
        logits = float_logits(out.last_hidden_state[:, -1], head.weight, head.bias)
        return logits.repeat_interleave(group_size, 0)

    def _decode(
        self,
        ws: _Workspace,
        rows: int,
        logits: torch.Tensor,
        params: SamplingParams,
        graphs: dict[int, torch.cuda.CUDAGraph],
    ) -> None:
        """Draw the first token of the call's `rows` rows from the prefill's `logits`, then
        step (replaying `graphs` where one has the bucket) until every row ended.

        Which rows ended (and stop strings) is read on the host only every `check_every`
        steps (each read waits for the device); rows that end in between decode on harmlessly,
        their ends already recorded. The live rows then move to a smaller bucket when they fit
        one."""
        sizes = buckets(ws.rows)
        self._first_draw(ws, rows, logits, params)
        stop_table = (
            self._stop_table(params.stop, logits.shape[-1], logits.device) if params.stop else None
        )
        bucket = bucket_for(rows, sizes)
        checked = 0  # tokens of every row whose endings were read
        for drawn in range(1, params.max_new_tokens + 1):
            last = drawn == params.max_new_tokens
            if last or drawn - checked >= self.check_every:
                if stop_table is not None:
                    end_at_stops(
                        self.tokenizer, params.stop, stop_table, ws.completion,
                        ws.row_ids[:bucket], ws.alive[:bucket], ws.ends, ws.reasons, checked,
                        drawn,
                    )  # fmt: skip
                checked = drawn
                alive = int(ws.alive[:bucket].sum())
                if alive == 0 or last:
                    break
                smaller = bucket_for(alive, sizes)
                if smaller < bucket:
                    self._compact(ws, bucket, smaller)
                    bucket = smaller
            if bucket in graphs:
                graphs[bucket].replay()
            else:
                self._step(ws, bucket, params)

    def _step(self, ws: _Workspace, rows: int, params: SamplingParams) -> None:
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

    def _regions(self, ws: _Workspace, rows: int) -> tuple[_Regions, bool]:
        """The step's regions for the first `rows` decoder rows of `ws` while `compile_step` is
        on: compiled for this bucket of a workspace of its sizes, or (`dynamic_compile`) for
        all; else eager. And whether they run for such a bucket for the first time (when they
        may compile)."""
        if not self.compile_step:
            return _Regions(self._enter, _layer_step, self._leave, self._record), False
        shape = ws.shape(rows)
        fresh = shape not in self._compiled
        if fresh and self.dynamic_compile:
            if self._dynamic_regions is None:
                self._dynamic_regions = self._compile_regions(dynamic=True)
            self._compiled[shape] = self._dynamic_regions
        elif fresh:
            self._compiled[shape] = self._compile_regions(dynamic=False)
        return self._compiled[shape], fresh

    def _compile_regions(self, dynamic: bool) -> _Regions:
        return _Regions(
            _compiled(self._enter, dynamic),
            _compiled(_layer_step, dynamic),
            _compiled(self._leave, dynamic),
            _compiled(self._record, dynamic),
        )

    def _run_step(
        self, ws: _Workspace, rows: int, params: SamplingParams, regions: _Regions
    ) -> None:
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
        settings = (params.temperature, params.min_new_tokens, eos)
        inputs = regions.leave(ws, rows, x, mlp_out, *settings)
        self._sample_and_record(ws, rows, inputs, eos, params, regions.record)

    def _projections(self) -> list[tuple[Together | None, Together | None]]:
        """Each layer's q/k/v and gate/up as `_layer_step` takes them (`_together`), as the
        weights lie now: worked out once a call, as it takes tens of microseconds a layer on
        the host, which an eager step (graphs off) would pay every token."""
        layers = self.model.base_model.layers
        return [tuple(_together(g) for g in _projection_groups(layer)) for layer in layers]

    def _enter(self, ws: _Workspace, rows: int) -> tuple[torch.Tensor, ...]:
        """The first region of a step: the embeddings `[n, 1, H]` of the first `rows` decoder
        rows' tokens and zeros as the residual stream's other part (`_layer_step`), their
        rotary tables cos and sin `[n, 1, 1, d]` (broadcast over heads), and the attention bias
        `[n, 1, 1, L]` of the columns they attend to, now with the one the step writes: made
        once for every layer, in the queries' dtype, as the attention kernel takes it (given a
        boolean mask, each layer would convert it)."""
        trunk = self.model.base_model
        # `forward`, not the module's call: gradient checkpointing hooks the embedding's output
        # with `requires_grad_`, which a compiled region cannot return
        x = trunk.embed_tokens.forward(ws.tokens[:rows, None])
        cos, sin = trunk.rotary_emb(x, ws.positions[:rows, None])
        visible = ws.visible[:rows]
        visible.index_fill_(1, ws.column, True)
        bias = torch.zeros(visible.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(~visible, float("-inf"))
        return x, torch.zeros_like(x), cos[:, None], sin[:, None], bias[:, None, None, :]

    def _leave(
        self,
        ws: _Workspace,
        rows: int,
        x: torch.Tensor,
        mlp_out: torch.Tensor,
        temperature: float,
        min_new_tokens: int,
        eos: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        """The region after the layers: from the last layer's residual stream (`_layer_step`),
        the float32 logits and what the draw reads of them (`_draw_inputs`)."""
        trunk = self.model.base_model
        hidden = trunk.norm(x + mlp_out)[:, 0]
        head = self.model.get_output_embeddings()
        logits = float_logits(hidden, head.weight, head.bias)
        return self._draw_inputs(ws, rows, logits, temperature, min_new_tokens, eos)

    def _draw_inputs(
        self,
        ws: _Workspace,
        rows: int,
        logits: torch.Tensor,
        temperature: float,
        min_new_tokens: int,
        eos: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        """What the draw of token t (`draw_tokens`) reads, from `[rows, V]` float32 logits:
        them divided by the temperature, their logsumexp `[rows]`, the same with EOS (`eos`,
        `[V]` bool) at -inf while fewer than `min_new_tokens` tokens were drawn, and each row's
        uniform `[rows, 1]` (None for greedy). A decode step forms them in its compiled last
        region, where the logsumexp and the mask are a kernel or two instead of a dozen."""
        scaled = logits / temperature if temperature not in (0, 1) else logits
        lse = torch.logsumexp(scaled, dim=-1)
        work = scaled
        if min_new_tokens > 0:
            work = scaled.masked_fill(eos[None] & (ws.t < min_new_tokens), float("-inf"))
        uniforms = None
        if temperature != 0:
            uniforms = ws.uniforms.index_select(0, ws.t)[0, ws.row_ids[:rows]][:, None]
        return scaled, lse, work, uniforms

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

    def _sample_and_record(
        self,
        ws: _Workspace,
        rows: int,
        inputs: tuple[torch.Tensor | None, ...],
        eos: torch.Tensor,
        params: SamplingParams,
        record: Callable | None = None,
    ) -> None:
        """Draw token t for the first `rows` decoder rows from their `_draw_inputs` and record
        it with `record`, a step's last region (the positions and the cache column advance),
        or else `_record` alone (after the prefill, whose state is the first step's)."""
        scaled, lse, work, uniforms = inputs
        tokens = draw_token_ids(work, params, uniforms)
        if record is None:
            self._record(ws, rows, tokens, scaled, lse, eos, advance=False)
        else:
            record(ws, rows, tokens, scaled, lse, eos, advance=True)

    def _record(
        self,
        ws: _Workspace,
        rows: int,
        tokens: torch.Tensor,
        scaled: torch.Tensor,
        lse: torch.Tensor,
        eos: torch.Tensor,
        advance: bool,
    ) -> None:
        """Write the drawn `tokens` `[rows]`, their logprobs under `scaled` `[rows, V]` (whose
        logsumexp is `lse`) and any EOS (`eos`, `[V]` bool) in the output rows, and feed the
        tokens back; t advances, and with `advance` the rows' positions and the cache column
        (the step that fed the previous tokens is over). The only writes of a step that are
        not rewrites, so a step whose compilation fails runs again eagerly from its start.
        Every index is a device tensor (a 0-dim tensor used as an index is read on the host)."""
        if advance:
            ws.positions[:rows] += 1
            ws.column += 1
        token_logprobs = scaled.gather(1, tokens[:, None]).squeeze(1) - lse
        out_rows = ws.row_ids[:rows]
        at = (out_rows, ws.t.expand(rows))
        ws.completion.index_put_(at, tokens)
        ws.logprobs.index_put_(at, token_logprobs)
        alive = ws.alive[:rows]
        hit = alive & eos[tokens]
        ws.ends.index_put_((out_rows,), torch.where(hit, ws.t + 1, ws.ends[out_rows]))
        ws.reasons.index_put_((out_rows,), torch.where(hit, _EOS, ws.reasons[out_rows]))
        alive &= ~hit
        ws.tokens[:rows] = tokens
        ws.t += 1

    def _first_draw(
        self, ws: _Workspace, rows: int, logits: torch.Tensor, params: SamplingParams
    ) -> None:
        """Draw and record token 0 of the first `rows` rows from the prefill's `[rows, V]`
        logits, outside a step."""
        eos = self._eos_mask(logits.shape[-1], logits.device)
        settings = (params.temperature, params.min_new_tokens, eos)
        inputs = self._draw_inputs(ws, rows, logits, *settings)
        self._sample_and_record(ws, rows, inputs, eos, params)

    def _eos_mask(self, vocab: int, device: torch.device) -> torch.Tensor:
        """`[V]` True on EOS ids; made once per vocabulary size and device, before any capture,
        so that graphs read a tensor that outlives them."""
        key = (vocab, str(device))
        if getattr(self, "_eos", (None, None))[0] != key:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[[e for e in self.eos_ids if e < vocab]] = True
            self._eos = (key, mask.to(device))
        return self._eos[1]

    def _compact(self, ws: _Workspace, rows: int, smaller: int) -> None:
        """Gather the live decoder rows (then dead ones, to fill) into the first `smaller`."""
        alive = ws.alive[:rows]
        order = torch.cat([alive.nonzero().squeeze(1), (~alive).nonzero().squeeze(1)])[:smaller]
        for cache in (*ws.keys, *ws.values):
            cache[:smaller] = cache[order]
        for state in (ws.visible, ws.tokens, ws.positions, ws.row_ids, ws.alive):
            state[:smaller] = state[order]
