"""Helpers shared by the benchmark scripts: models made from a config, the machine's matmul rate,
peak memory of a call, and markdown tables.

Nothing here downloads anything: the named models are random Qwen2-style models built from a
config with the bundled character tokenizer; `default` is the bundled model once it exists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from oncurve.tokenizer import char_tokenizer

# name -> (hidden, intermediate, layers, heads, kv_heads); parameter counts with the char
# tokenizer's 104-token vocabulary and tied embeddings.
QWEN2_SIZES = {
    "tiny": (128, 512, 4, 4, 2),  # 0.99M
    "30m": (512, 1536, 10, 8, 2),  # 30.2M
}


def qwen2_model(name: str, vocab_size: int, seed: int = 0) -> transformers.PreTrainedModel:
    """A random Qwen2-style model of one of `QWEN2_SIZES`, float32, eval mode."""
    hidden, intermediate, layers, heads, kv_heads = QWEN2_SIZES[name]
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def load_model(name: str) -> tuple[transformers.PreTrainedModel, Any]:
    """(model, tokenizer) for `default` (the bundled model), a `QWEN2_SIZES` name, or a path to
    a local Hugging Face model directory."""
    from oncurve.models import load_model as load_dir
    from oncurve.models import load_tokenizer, resolve_model_path

    if name in QWEN2_SIZES:
        tokenizer = char_tokenizer()
        model = qwen2_model(name, len(tokenizer))
        model.config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer
    path = resolve_model_path(name)
    if not (Path(path) / "config.json").is_file():
        raise SystemExit(f"model {name}: {path} holds no model yet; use --model tiny")
    return load_dir(path), load_tokenizer(path)


def matmul_gflops(rows: int, inner: int, cols: int, seconds: float = 0.5) -> float:
    """fp32 GFLOP/s of torch's `[rows, inner] @ [inner, cols]` on this machine, best of a few
    timed batches (the floor a decode step's matmuls could reach at this shape)."""
    a, b = torch.randn(rows, inner), torch.randn(inner, cols)
    out = torch.empty(rows, cols)
    flops = 2 * rows * inner * cols
    reps = max(1, int(2e8 / flops))
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == float("inf"):
        start = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        best = min(best, (time.perf_counter() - start) / reps)
    return flops / best / 1e9


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_memory(fn: Callable[[], Any], interval: float = 0.0005) -> tuple[Any, float]:
    """Run `fn` and return (its result, peak resident memory above the start, in MB), sampled
    by a thread every `interval` seconds (large torch tensors are mmap'd, so RSS follows them)."""
    base = _rss_bytes()
    peak = base
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(interval)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        result = fn()
    finally:
        done.set()
        thread.join()
    peak = max(peak, _rss_bytes())
    return result, (peak - base) / 2**20


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
