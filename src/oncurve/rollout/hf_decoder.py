"""The `hf` backend: decode through the Hugging Face model's own forward, for any causal LM.

The cache is a `DynamicCache` whose full-attention layers are `_GrowingLayer`s (sliding-window
ones stay HF's own): their columns are allocated ahead and grown as the longest row needs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import transformers
from transformers.cache_utils import DynamicLayer

from oncurve.algo.logprobs import float_logits
from oncurve.model.kv_cache import cache_argument, real_token_positions
from oncurve.rollout.base import first_columns, grown_columns

# What `_GrowingLayer` writes of `DynamicLayer`'s own state, for HF's attention and cache
# bookkeeping to read; `tests/unit/rollout/test_rollout.py` fails if transformers renames one of them.
DYNAMIC_LAYER_ATTRIBUTES = ("keys", "values", "device", "is_initialized")


class _GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose columns are allocated ahead and grown as `LlamaDecoder`'s are:
    HF's own layer concatenates, copying the whole cache at every step, and a `StaticLayer`
    attends over every column it holds, written or not (with GRPO's budgets, mostly not).
    `keys` and `values` are views of the written columns, as HF's layer would hold them."""

    def __init__(self, reserve: int, limit: int) -> None:
        super().__init__()
        self.reserve, self.limit = reserve, limit
        self.length = 0
        self.storage: list[torch.Tensor] = []

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `[rows, kv_heads, t, head_dim]` states; returns the `[rows, kv_heads,
        written columns, head_dim]` keys and values."""
        end = self.length + key_states.shape[-2]
        if not self.storage:
            columns = first_columns(end, self.reserve, self.limit)
            self.storage = [
                states.new_empty((*states.shape[:2], columns, states.shape[3]))
                for states in (key_states, value_states)
            ]
            self.device, self.is_initialized = key_states.device, True
        elif end > self.storage[0].shape[2]:
            self._resize(grown_columns(self.storage[0].shape[2], self.limit))
        for cache, states in zip(self.storage, (key_states, value_states), strict=True):
            cache[:, :, self.length : end] = states
        self.length = end
        self.keys, self.values = (cache[:, :, :end] for cache in self.storage)
        return self.keys, self.values

    def _resize(self, columns: int) -> None:
        for i, old in enumerate(self.storage):
            self.storage[i] = old.new_empty((*old.shape[:2], columns, old.shape[3]))
            self.storage[i][:, :, : self.length] = old[:, :, : self.length]

    def rows(self, index: torch.Tensor) -> None:
        """Keep rows `index` (which may repeat one, e.g. a prompt's for its G completions)."""
        self.storage = [cache[index] for cache in self.storage]
        self.keys, self.values = (cache[:, :, : self.length] for cache in self.storage)


class HFDecoder:
    """A `Decoder` (see `oncurve.rollout.base`) over the model's own forward.

    Args:
        model: a Hugging Face causal LM (`base_model` trunk + output embeddings).
        rows, width, new, reserve: room for `rows` rows of a `width`-token prompt and up to
            `new` fed-back tokens, of which `reserve` are allocated up front.
    """

    def __init__(
        self, model: transformers.PreTrainedModel, rows: int, width: int, new: int, reserve: int
    ) -> None:
        self.model = model
        device = model.get_output_embeddings().weight.device
        self.cache = transformers.DynamicCache(config=model.config)
        self.cache.layers = [
            _GrowingLayer(reserve, width + new) if type(layer) is DynamicLayer else layer
            for layer in self.cache.layers
        ]
        self.mask = torch.ones(rows, width + new, dtype=torch.long, device=device)
        self.positions = torch.empty(rows, dtype=torch.long, device=device)
        self.column = width  # next cache column to write

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        out = self.model.base_model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **cache_argument(self.model.base_model, self.cache),
        )
        head = self.model.get_output_embeddings()
        return float_logits(out.last_hidden_state[:, -1], head.weight, head.bias)

    def prefill(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int
    ) -> torch.Tensor:
        """Forward the B prompts `[B, P]`, then repeat each one's cache G times.
        Returns `[B*G, V]` float32 next-token logits."""
        width = prompt_ids.shape[1]
        self.mask[:, :width] = prompt_mask.repeat_interleave(group_size, 0)
        positions = real_token_positions(prompt_mask)
        logits = self._forward(prompt_ids, prompt_mask, positions)
        self._rows(
            torch.arange(prompt_ids.shape[0], device=logits.device).repeat_interleave(group_size)
        )
        self.positions.copy_(prompt_mask.sum(-1).repeat_interleave(group_size))
        return logits.repeat_interleave(group_size, 0)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed `[n]` tokens and return `[n, V]` float32 next-token logits."""
        n = tokens.shape[0]
        positions = self.positions[:n]
        mask = self.mask[:n, : self.column + 1]
        logits = self._forward(tokens[:, None], mask, positions[:, None])
        self.column += 1
        positions += 1
        return logits

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (ascending), moved to the front."""
        self._rows(index)
        n = index.shape[0]
        self.mask[:n] = self.mask[index]
        self.positions[:n] = self.positions[index]

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """Nothing to hold during the decode: the steps run on the model as it is."""
        yield

    def _rows(self, index: torch.Tensor) -> None:
        for layer in self.cache.layers:
            if isinstance(layer, _GrowingLayer):
                layer.rows(index)
            else:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
