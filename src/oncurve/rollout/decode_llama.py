"""A fast decode step for the Llama family (Llama, Qwen2, Mistral) over the HF model's own weights.

A generic Hugging Face forward for one token costs several times its matmuls on CPU at the sizes
GRPO samples with: mask construction, cache bookkeeping, module dispatch. This decoder does the
same arithmetic in plain torch ops: q, k, v in one matmul (gate and up in another), rotary tables
computed once per call, a preallocated `[layers, rows, kv_heads, width, head_dim]` cache, and an
additive padding bias instead of a 4-D mask. The prompt is prefilled by the HF forward itself,
so only the one-token step is reimplemented; `tests/test_rollout.py` checks its logits against
the HF forward's to 1e-5. What it simplifies: no dropout (sampling runs the model as in eval),
no sliding window (declined when the window is shorter than the sequence), no dynamic RoPE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


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


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    # The HF order: normalise in float32, cast back, then scale by the weight.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


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
    """One decoder layer's weights, q/k/v and gate/up concatenated for one matmul each."""

    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv_weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        self.qkv_bias = _cat_bias(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_proj = attn.o_proj
        self.gate_up_weight = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.gate_up_bias = _cat_bias(mlp.gate_proj, mlp.up_proj)
        self.down_proj = mlp.down_proj
        self.act = mlp.act_fn
        self.norm_in = layer.input_layernorm
        self.norm_post = layer.post_attention_layernorm
        self.scaling = attn.scaling


class LlamaDecoder:
    """Decoding state for N rows: the KV cache, padding bias and positions, compacted as rows end.

    Cache column c holds prompt position c for c < P (prompts left-padded to P) and completion
    token c - P after that; every row writes the same column at a step, so a step is one copy.
    Position ids count real tokens only, as in `oncurve.train_step.completion_logprobs`.
    """

    def __init__(self, model: transformers.PreTrainedModel, rows: int, width: int, new: int):
        base = model.base_model
        config = model.config
        self.model = model
        self.layers = [_Layer(layer) for layer in base.layers]
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
        param = self.embed
        shape = (len(self.layers), rows, self.kv_heads, width + new, self.head_dim)
        self.keys = torch.empty(shape, dtype=param.dtype, device=param.device)
        self.values = torch.empty(shape, dtype=param.dtype, device=param.device)
        self.bias = torch.zeros(rows, width + new, dtype=param.dtype, device=param.device)
        # cos/sin for every position this call can reach, from the model's own rotary module
        # (so RoPE scaling variants and attention_scaling come along).
        positions = torch.arange(width + new, device=param.device)[None]
        cos, sin = base.rotary_emb(self.embed[:1], positions)
        half = self.head_dim // 2
        self.cos = cos[0]
        # rotate_half(x) * sin == flip_halves(x) * [-sin_1, sin_2]
        self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        self.positions = torch.empty(rows, dtype=torch.long, device=param.device)

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int):
        """Run the HF forward on the B distinct prompts `[B, P]` and copy their cache into the G
        rows of each group. Returns `[B*G, V]` float32 next-token logits."""
        batch, width = prompt_ids.shape
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        cache = transformers.DynamicCache(config=self.model.config)
        out = self.model.base_model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        for i, layer in enumerate(cache.layers):
            shape = (batch, group_size, self.kv_heads, width, self.head_dim)
            self.keys[i, :, :, :width].view(shape).copy_(layer.keys[:, None])
            self.values[i, :, :, :width].view(shape).copy_(layer.values[:, None])
        pad = prompt_mask.repeat_interleave(group_size, 0) == 0
        self.bias[:, :width].masked_fill_(pad, float("-inf"))
        self.positions.copy_(prompt_mask.sum(-1).repeat_interleave(group_size))
        hidden = out.last_hidden_state[:, -1].repeat_interleave(group_size, 0)
        return self._logits(hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.float() @ self.head_weight.float().T
        if self.head_bias is not None:
            logits += self.head_bias.float()
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `[n]` tokens (one per active row) and return `[n, V]` float32 next logits."""
        n = tokens.shape[0]
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        col = self.column
        end = col + 1
        positions = self.positions[:n]
        cos = self.cos[positions][:, None]  # [n, 1, d]
        sin = self.sin[positions][:, None]
        bias = self.bias[:n, None, None, :end]  # [n, 1, 1, end]
        x = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.norm_in)
            qkv = F.linear(h, layer.qkv_weight, layer.qkv_bias).view(n, heads + 2 * kv, d)
            qk = qkv[:, : heads + kv]
            flipped = qk.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
            qk = qk * cos + flipped * sin
            self.keys[i, :n, :, col] = qk[:, heads:]
            self.values[i, :n, :, col] = qkv[:, heads + kv :]
            q = qk[:, :heads].view(n, kv, heads // kv, d)
            scores = torch.matmul(q, self.keys[i, :n, :, :end].transpose(-1, -2))
            scores = (scores * layer.scaling + bias).softmax(-1)
            attn = torch.matmul(scores, self.values[i, :n, :, :end]).view(n, heads * d)
            x = x + layer.o_proj(attn)
            h = _rms_norm(x, layer.norm_post)
            gate, up = F.linear(h, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
            x = x + layer.down_proj(layer.act(gate) * up)
        self.column = end
        positions += 1
        return self._logits(_rms_norm(x, self.norm))

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (ascending), moved to the front; later steps see len(index)."""
        filled = self.column
        n = index.shape[0]
        # Layer by layer and only the filled columns: the temporary is one layer's live part.
        for i in range(len(self.layers)):
            self.keys[i, :n, :, :filled] = self.keys[i, index, :, :filled]
            self.values[i, :n, :, :filled] = self.values[i, index, :, :filled]
        self.bias[:n] = self.bias[index]
        self.positions[:n] = self.positions[index]
