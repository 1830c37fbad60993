"""A fast decode step for the Llama family (Llama, Qwen2, Mistral) over the HF model's own weights.

A generic Hugging Face forward for one token costs several times its matmuls on CPU at the sizes
GRPO samples with: mask construction, cache bookkeeping, module dispatch. This decoder does the
same arithmetic in plain torch ops: q, k, v in one matmul (for small models), rotary tables
computed once per call, a `[rows, kv_heads, width, head_dim]` cache per layer that grows with
the longest row, and an additive padding bias instead of a 4-D mask. The prompt is prefilled by
the HF forward itself, so only the one-token step is reimplemented; `tests/test_rollout.py`
checks its logits against the HF forward's to 1e-5. Small models run the step features first
through MKL with q/k/v fused; larger ones on CPU run it rows first through oneDNN on weights
reordered for its kernels, which stand in for the model's own during the decode (see
`LlamaDecoder.decoding`). What it simplifies: no dropout (sampling runs the model as in eval), no
sliding window (declined when the window is shorter than the sequence), no dynamic RoPE.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import transformers

from oncurve.algo.logprobs import float_logits
from oncurve.models import cache_argument, real_token_positions

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
# Fusing q/k/v saves three ops per layer and step, which matters for small models where per-op
# overhead dominates; the copy costs memory, which matters for large ones (where the matmuls
# dominate): fuse only while the copies stay under this size. (Fusing gate/up too would save one
# op more for four times the memory, and was measured to raise peak memory above
# `model.generate`'s on the 1M model.)
FUSE_MAX_BYTES = 4 * 2**20
# Models too large to fuse decode rows first through oneDNN's linear on weights reordered for
# it, where available: at 30M parameters and 64 rows, 0.79-0.82x the step time of MKL on the
# plain weights. The reordered copies would double the weights' memory, so they stand in for
# the model's own during the decode: the pages of the plain weights are handed back to the OS
# (Linux `madvise`) and refilled after it, exactly (a reorder only moves values). The weights
# keep their storage, so nothing that holds them (optimizer, FSDP's gathered copy) notices; the
# packed copies, allocated and freed at every rollout, are trimmed from glibc's heap after it.
_linear_pointwise = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_reorder_linear_weight = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_MADV_DONTNEED = 4  # Linux: the pages read as zeros until written again
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _madvise, _malloc_trim = _libc.madvise, _libc.malloc_trim
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
except (AttributeError, OSError):
    _madvise = _malloc_trim = None
# rows moved per copy when finished rows are dropped from the cache
_KEEP_CHUNK = 16
# The cache starts with room for the prompt and `reserve` tokens and grows by a quarter (at
# least this many columns) when the longest live row reaches its end, so that its size follows
# the lengths sampled, not max_new_tokens: GRPO budgets are often several times the typical
# completion. Growth moves one layer at a time, so it briefly costs one layer's cache extra.
_GROW_COLUMNS = 16


def first_columns(width: int, reserve: int, limit: int) -> int:
    """Cache columns to allocate up front: the prompt's `width`, then `reserve` (at least
    `_GROW_COLUMNS`) of the at most `limit` in all."""
    return min(limit, width + max(reserve, _GROW_COLUMNS))


def grown_columns(columns: int, limit: int) -> int:
    """Cache columns after a growth from `columns`: a quarter more, at least `_GROW_COLUMNS`."""
    return min(limit, max(columns + _GROW_COLUMNS, columns * 5 // 4))


def supports(model: torch.nn.Module, total_len: int) -> bool:
    """Whether `LlamaDecoder` reproduces `model`'s forward for sequences of `total_len` tokens:
    a plain (not adapter-wrapped) Llama/Qwen2/Mistral with static RoPE and no active window."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") in ("dynamic", "longrope"):
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and window < total_len:
        return False
    base = model.base_model
    linear_names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in base.layers:
        parts = {**dict(layer.self_attn.named_children()), **dict(layer.mlp.named_children())}
        # PEFT/LoRA replaces these modules; their forward is then more than the weight.
        if any(type(parts.get(name)) is not torch.nn.Linear for name in linear_names):
            return False
    return True


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module, mean_row: torch.Tensor) -> torch.Tensor:
    """RMSNorm of features-first `[H, n]` activations (see `LlamaDecoder.step`); `[H, n]`.

    In the HF order: normalise in float32, cast back, then scale by the weight. The mean square
    is a matmul with `mean_row` (`[1, H]` of 1/H): torch reduces over the features, the leading
    dimension here, at half the speed (on the 30M model, RMSNorm fell from 3.4 to 1.8 ms of a
    46 ms decode step). (`F.rms_norm` over the transpose was no faster.)"""
    h = x.float()
    mean_square = torch.mm(mean_row, h * h).add_(norm.variance_epsilon)
    h = h * mean_square.rsqrt_()
    return h.to(x.dtype).mul_(norm.weight[:, None])


def _rms_norm_rows(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """RMSNorm of rows-first `[n, H]` activations, in the HF order; `[n, H]`."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return h.to(x.dtype).mul_(norm.weight)


def _rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """RoPE on `heads` whose head_dim is dimension `dim`; `sin` carries rotate_half's signs."""
    half = heads.shape[dim] // 2
    flipped = heads.unflatten(dim, (2, half)).flip(dim).flatten(dim, dim + 1)
    return torch.addcmul(heads * cos, flipped, sin)


def can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN's linear on a reordered copy can stand in for `weight`: float32 on a Linux
    CPU build with oneDNN, and a plain tensor (not an FSDP shard or another tensor subclass)."""
    return (
        _reorder_linear_weight is not None
        and _linear_pointwise is not None
        and _madvise is not None
        and sys.platform.startswith("linux")
        and torch.backends.mkldnn.is_available()
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and type(weight.data) is torch.Tensor
    )


def _release_pages(weight: torch.Tensor) -> None:
    """Hand the whole pages inside `weight`'s memory back to the OS; they read as zeros until
    written. The allocation itself stays, so the tensor can be refilled in place."""
    start = -(-weight.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (weight.data_ptr() + weight.numel() * weight.element_size()) // mmap.PAGESIZE
    end *= mmap.PAGESIZE
    if end > start and _madvise(start, end - start, _MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise failed on a weight's pages")


def _packed_linear(
    h: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`h @ weight.T (+ bias)` for rows-first `[n, in]`, on oneDNN's reordered weight."""
    return _linear_pointwise(h, packed, bias, "none", [], "")


def _projections(layer: torch.nn.Module) -> list[torch.Tensor]:
    attn = layer.self_attn
    return [m.weight for m in (attn.q_proj, attn.k_proj, attn.v_proj)]


def _linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`weight @ h (+ bias)` for features-first `[in, n]` -> `[out, n]`."""
    if bias is None:
        return torch.mm(weight, h)
    return torch.addmm(bias[:, None], weight, h)


def _add_linear(x: torch.Tensor, h: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """x + linear(h), features first; the residual add fused into the matmul."""
    out = torch.addmm(x, linear.weight, h)
    if linear.bias is not None:
        out += linear.bias[:, None]
    return out


def _cat_bias(*linears: torch.nn.Linear) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat(
        [
            lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
            for lin in linears
        ]
    )


class _Layer:
    """One decoder layer's weights; with `fuse`, q/k/v are one concatenated copy so that they
    take one matmul, and the attention scale is folded into the query rows (equal to
    scaling the scores up to float rounding). Unfused, `packed` holds oneDNN's reordered
    weights of `packed_groups` (each group concatenated) while `LlamaDecoder.decoding` has
    them stand in for the model's."""

    def __init__(self, layer: torch.nn.Module, fuse: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v = attn.q_proj, attn.k_proj, attn.v_proj
        self.gate, self.up = mlp.gate_proj, mlp.up_proj
        self.scaling = attn.scaling
        self.fused = fuse
        self.qkv_bias = _cat_bias(self.q, self.k, self.v)
        if fuse:
            q_rows = self.q.out_features
            scale = self.q.weight.new_ones(q_rows + self.k.out_features + self.v.out_features)
            scale[:q_rows] = attn.scaling
            self.qkv_weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
            self.qkv_weight.mul_(scale[:, None])
            if self.qkv_bias is not None:
                self.qkv_bias.mul_(scale)
        self.gate_up_bias = _cat_bias(self.gate, self.up)
        self.o_proj = attn.o_proj
        self.down_proj = mlp.down_proj
        self.packed_groups = ((self.q, self.k, self.v), (self.o_proj,), (self.gate, self.up))
        self.packed_groups += ((self.down_proj,),)
        self.packed: list[torch.Tensor] = []
        self.act = mlp.act_fn
        self.norm_in = layer.input_layernorm
        self.norm_post = layer.post_attention_layernorm

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        """`[H, n]` -> `[(heads + 2 kv_heads) * head_dim, n]`, queries already scaled."""
        if self.fused:
            return _linear(h, self.qkv_weight, self.qkv_bias)
        q_rows, k_rows = self.q.out_features, self.k.out_features
        # each projection writes its rows of one tensor: no concatenated copy
        out = h.new_empty(q_rows + k_rows + self.v.out_features, h.shape[1])
        q, k, v = out[:q_rows], out[q_rows : q_rows + k_rows], out[q_rows + k_rows :]
        for part, proj in ((q, self.q), (k, self.k), (v, self.v)):
            if proj.bias is None:
                torch.mm(proj.weight, h, out=part)
            else:
                torch.addmm(proj.bias[:, None], proj.weight, h, out=part)
        q *= self.scaling
        return out

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """`[H, n]` -> `[intermediate, n]`."""
        gate = _linear(h, self.gate.weight, self.gate.bias)
        return self.act(gate).mul_(_linear(h, self.up.weight, self.up.bias))


class LlamaDecoder:
    """Decoding state for N rows: the KV cache, padding bias and positions, compacted as rows end.

    Cache column c holds prompt position c for c < P (prompts left-padded to P) and completion
    token c - P after that; every row writes the same column at a step, so a step is one copy.
    Position ids count real tokens only, as in `oncurve.train_step.completion_logprobs`.
    """

    def __init__(
        self,
        model: transformers.PreTrainedModel,
        rows: int,
        width: int,
        new: int,
        reserve: int = 0,
    ):
        """Room for `rows` rows of a `width`-token prompt and up to `new` fed-back tokens, of
        which `reserve` (e.g. min_new_tokens, known to be needed) are allocated up front."""
        base = model.base_model
        config = model.config
        self.model = model
        fused_bytes = sum(
            sum(p.numel() * p.element_size() for p in _projections(layer)) for layer in base.layers
        )
        fuse = fused_bytes <= FUSE_MAX_BYTES
        self.layers = [_Layer(layer, fuse) for layer in base.layers]
        self.packs = not fuse and can_pack(base.layers[0].self_attn.q_proj.weight)
        self.embed = base.embed_tokens.weight
        self.norm = base.norm
        head = model.get_output_embeddings()
        self.head_weight, self.head_bias = head.weight, head.bias
        attn = base.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.width = width
        self.column = width  # next cache column to write
        self.max_columns = width + new
        param = self.embed
        shape = (
            rows,
            self.kv_heads,
            first_columns(width, reserve, self.max_columns),
            self.head_dim,
        )
        # one tensor per layer, `[rows, kv_heads, columns, head_dim]`, so growth is per layer
        self.keys = [param.new_empty(shape) for _ in self.layers]
        self.values = [param.new_empty(shape) for _ in self.layers]
        self.bias = torch.zeros(rows, width + new, dtype=param.dtype, device=param.device)
        # cos/sin for every position this call can reach, from the model's own rotary module
        # (so RoPE scaling variants and attention_scaling come along).
        positions = torch.arange(width + new, device=param.device)[None]
        cos, sin = base.rotary_emb(self.embed[:1], positions)
        half = self.head_dim // 2
        # rotate_half(x) * sin == flip_halves(x) * [-sin_1, sin_2]
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        # `[positions, head_dim]` rows first, `[head_dim, positions]` features first
        self.cos = cos[0] if self.packs else cos[0].T.contiguous()
        self.sin = signed_sin if self.packs else signed_sin.T.contiguous()
        self.positions = torch.empty(rows, dtype=torch.long, device=param.device)
        self.mean_row = torch.full(
            (1, config.hidden_size),
            1.0 / config.hidden_size,
            dtype=torch.float32,
            device=param.device,
        )

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int):
        """Run the HF forward on the B distinct prompts `[B, P]` and copy their cache into the G
        rows of each group. Returns `[B*G, V]` float32 next-token logits."""
        batch, width = prompt_ids.shape
        positions = real_token_positions(prompt_mask)
        cache = transformers.DynamicCache(config=self.model.config)
        out = self.model.base_model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=positions,
            use_cache=True,
            **cache_argument(self.model.base_model, cache),
        )
        for i, layer in enumerate(cache.layers):
            shape = (batch, group_size, self.kv_heads, width, self.head_dim)
            self.keys[i][:, :, :width].view(shape).copy_(layer.keys[:, None])
            self.values[i][:, :, :width].view(shape).copy_(layer.values[:, None])
        pad = prompt_mask.repeat_interleave(group_size, 0) == 0
        self.bias[:, :width].masked_fill_(pad, float("-inf"))
        self.positions.copy_(prompt_mask.sum(-1).repeat_interleave(group_size))
        hidden = out.last_hidden_state[:, -1].repeat_interleave(group_size, 0)
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return float_logits(hidden, self.head_weight, self.head_bias)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `[n]` tokens (one per active row) and return `[n, V]` float32 next logits;
        with packed layers, only inside `decoding`."""
        n = tokens.shape[0]
        if self.column == self.keys[0].shape[2]:
            self._grow(n)
        positions = self.positions[:n]
        bias = self.bias[:n, None, None, : self.column + 1]  # [n, 1, 1, columns so far]
        if self.packs:
            hidden = self._layers_rows_first(tokens, positions, bias)
        else:
            hidden = self._layers_features_first(tokens, positions, bias)
        self.column += 1
        positions += 1
        return self._logits(hidden)

    def _layers_features_first(
        self, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """`[n, H]` final hidden states, the layers run on features-first `[H, n]` activations,
        so that every matmul is `weight @ h`: with the few rows of a decode step MKL runs that
        form 1.2-1.6x faster than `h @ weight.T` (e.g. 64 rows through a 512 -> 1536
        projection: 0.65 against 0.77 ms), while the training forward's thousands of rows
        prefer the usual form."""
        n = tokens.shape[0]
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[:, positions], self.sin[:, positions]  # [d, n]
        x = F.embedding(tokens, self.embed).T.contiguous()
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.norm_in, self.mean_row)
            qkv = layer.qkv(h).view(heads + 2 * kv, d, n)
            qk = _rotate(qkv[: heads + kv], cos, sin, dim=1)
            attn = self._attend(i, qk.permute(2, 0, 1), qkv[heads + kv :].permute(2, 0, 1), bias)
            x = _add_linear(x, attn.T, layer.o_proj)
            h = _rms_norm(x, layer.norm_post, self.mean_row)
            x = _add_linear(x, layer.mlp(h), layer.down_proj)
        return _rms_norm(x, self.norm, self.mean_row).T

    def _layers_rows_first(
        self, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """`[n, H]` final hidden states, the layers run on rows-first `[n, H]` activations
        through oneDNN's linear on the packed weights."""
        n = tokens.shape[0]
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[positions, None], self.sin[positions, None]  # [n, 1, d]
        x = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            qkv_weight, o_weight, gate_up_weight, down_weight = layer.packed
            h = _rms_norm_rows(x, layer.norm_in)
            qkv = _packed_linear(h, qkv_weight, layer.qkv_bias).view(n, heads + 2 * kv, d)
            qkv[:, :heads] *= layer.scaling
            qk = _rotate(qkv[:, : heads + kv], cos, sin, dim=2)
            attn = self._attend(i, qk, qkv[:, heads + kv :], bias)
            x = x + _packed_linear(attn, o_weight, layer.o_proj.bias)
            h = _rms_norm_rows(x, layer.norm_post)
            gate_up = _packed_linear(h, gate_up_weight, layer.gate_up_bias)
            inter = layer.gate.out_features
            mlp = layer.act(gate_up[:, :inter]).mul_(gate_up[:, inter:])
            x = x + _packed_linear(mlp, down_weight, layer.down_proj.bias)
        return _rms_norm_rows(x, self.norm)

    def _attend(
        self, i: int, qk: torch.Tensor, values_new: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """Layer `i`'s attention for rows-first heads: `qk` `[n, heads + kv, d]` rotated
        queries then keys, `values_new` `[n, kv, d]`. Writes this step's cache column;
        returns `[n, heads * d]`."""
        n, heads, kv, d = qk.shape[0], self.heads, self.kv_heads, self.head_dim
        group, col = heads // kv, self.column
        end = col + 1
        keys, values = self.keys[i][:n], self.values[i][:n]
        keys[:, :, col] = qk[:, heads:]
        values[:, :, col] = values_new
        # one (row, kv head) pair per matrix; bmm on 3-D views skips matmul's broadcasting
        q = qk[:, :heads].reshape(n * kv, group, d)
        scores = torch.bmm(q, keys.view(n * kv, -1, d)[:, :end].transpose(1, 2))
        scores = scores.view(n, kv, group, end).add_(bias).softmax(-1)
        attn = torch.bmm(scores.view(n * kv, group, end), values.view(n * kv, -1, d)[:, :end])
        return attn.view(n, heads * d)

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """Wraps the decode steps, after `prefill` (which runs the HF forward on the model's own
        weights). With packed layers, oneDNN's reordered copies stand in for the model's linear
        weights meanwhile, whose pages go back to the OS group by group, so that memory never
        holds both of more than one group; on exit, whatever raised, the cache is dropped (the
        decoder is spent) and the weights are refilled in place, bit for bit."""
        if not self.packs:
            yield
            return
        released: list[tuple[torch.Tensor, tuple[torch.nn.Linear, ...]]] = []
        try:
            for layer in self.layers:
                for linears in layer.packed_groups:
                    weights = [lin.weight.detach() for lin in linears]
                    plain = torch.cat(weights) if len(weights) > 1 else weights[0]
                    layer.packed.append(_reorder_linear_weight(plain, self.keys[0].shape[0]))
                    del plain, weights
                    released.append((layer.packed[-1], linears))
                    for lin in linears:
                        _release_pages(lin.weight)
            yield
        finally:
            self.keys, self.values = [], []
            for layer in self.layers:
                layer.packed = []
            with torch.no_grad():
                while released:
                    packed, linears = released.pop()
                    plain = packed.to_dense()
                    del packed
                    parts = plain.split([lin.out_features for lin in linears])
                    for lin, part in zip(linears, parts, strict=True):
                        lin.weight.copy_(part)
                    del plain, parts
            if _malloc_trim is not None:
                _malloc_trim(0)

    def _grow(self, n: int) -> None:
        """More cache columns for the first `n` rows (the live ones; the rest are dropped)."""
        grown = grown_columns(self.keys[0].shape[2], self.max_columns)
        for cache in (self.keys, self.values):
            for i, old in enumerate(cache):
                new = old.new_empty((n, self.kv_heads, grown, self.head_dim))
                new[:, :, : self.column] = old[:n, :, : self.column]
                cache[i] = new

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (ascending), moved to the front; later steps see len(index)."""
        filled = self.column
        # In place, a few rows at a time, so the gathered temporary stays small. Safe because
        # index is ascending: row j's source index[j] >= j lies after every row written so far.
        for start in range(0, index.shape[0], _KEEP_CHUNK):
            rows = index[start : start + _KEEP_CHUNK]
            end = start + rows.shape[0]
            for cache in (*self.keys, *self.values):
                cache[start:end, :, :filled] = cache[rows, :, :filled]
        n = index.shape[0]
        self.bias[:n] = self.bias[index]
        self.positions[:n] = self.positions[index]
