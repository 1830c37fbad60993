"""What the training forward and the samplers share about a Hugging Face trunk: positions
that count real tokens, how its forward takes a KV cache, and tokens per forward."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

# glibc serves blocks over its mmap threshold (32 MB at most) by a fresh mapping whose every
# 4 KB page the kernel zeroes on first touch, and gives freed heap above twice that threshold
# back; at 16 MB per activation a microbatch's tensors stay in a heap that is reused.
CPU_ACTIVATION_BYTES = 16 * 2**20


def real_token_positions(mask: torch.Tensor) -> torch.Tensor:
    """`[N, L]` position ids that count real tokens only (0 on left padding) from a `[N, L]`
    attention mask: a left-padded prompt sees the positions an unpadded one does, in the
    sampler and in the training forward alike."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_argument(trunk: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`{name: cache}` for `trunk`'s forward: transformers 5.24 renamed `past_key_values` to
    `cache` (the old name warns on every call and goes in 5.40); earlier releases and remote
    code know only the old name."""
    return {_cache_parameter(type(trunk)): cache}


@functools.cache
def _cache_parameter(trunk_class: type) -> str:
    parameters = inspect.signature(trunk_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def microbatch_tokens(model: torch.nn.Module, configured: int | None) -> int:
    """Tokens per microbatch (0: no cap): `configured` when set, else on CPU as many as keep a
    layer's widest activation, `[tokens, max(hidden, intermediate)]`, within
    `CPU_ACTIVATION_BYTES`, and no cap on an accelerator.

    The cap follows the width rather than being a fixed token count: a wide model's activations
    past glibc's mmap threshold pay for freshly zeroed pages on every microbatch, while a fixed
    cap small enough for a wide model cuts a narrow one into so many microbatches that their
    per-microbatch overhead dominates the update.
    """
    if configured is not None:
        return configured
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu":
        return 0
    config = model.config
    hidden = config.hidden_size
    widest = max(hidden, getattr(config, "intermediate_size", None) or 4 * hidden)
    return max(1, CPU_ACTIVATION_BYTES // (widest * weight.element_size()))
