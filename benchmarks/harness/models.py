"""The models the benchmarks train, built from a config (nothing is downloaded): random
Qwen2-style models with the character tokenizer (`QWEN2_SIZES`) or the Qwen3 one for the GPU
(`SHAPES`, optionally ending at EOS: `end_at_eos`), and the bundled `default` or a path."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from harness.checkout import CACHE, GPU_BUNDLE, ROOT

# name -> (hidden, intermediate, layers, heads, kv_heads); parameter counts with the char
# tokenizer's 104-token vocabulary and tied embeddings.
QWEN2_SIZES = {
    "tiny": (128, 512, 4, 4, 2),  # 0.99M
    "30m": (512, 1536, 10, 8, 2),  # 30.2M
}
# The same fields for the GPU's models, whose vocabulary is Qwen2.5/Qwen3's; `smoke` is the
# family cut to 2 narrow layers, for a CPU check.
SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2),
    "smoke": (128, 704, 2, 2, 1),
}
VOCAB = 151936
MODELS = CACHE / "models"
TOKENIZER = CACHE / "tokenizer"  # the Qwen3 tokenizer, copied once from ../shared or the bundle
SHARED_TOKENIZER = ROOT.parent / "shared" / "assets" / "qwen3-tokenizer"


def qwen2_config(shape: tuple[int, int, int, int, int], vocab_size: int, **extra: Any) -> Any:
    """A tied-embedding `transformers.Qwen2Config` of `shape` (as in `QWEN2_SIZES`) and `extra`."""
    import transformers

    names = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")  # fmt: skip
    fields = dict(zip(names, shape, strict=True))
    return transformers.Qwen2Config(
        vocab_size=vocab_size, tie_word_embeddings=True, **fields, **extra
    )


def load_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) for `default` (the bundled model), a `QWEN2_SIZES` name (random,
    seed 0, float32, eval mode), or a path to a local Hugging Face model directory."""
    import torch
    import transformers

    from oncurve.model.char_tokenizer import char_tokenizer
    from oncurve.model.sources import load_model as load_dir
    from oncurve.model.sources import load_tokenizer

    if name in QWEN2_SIZES:
        tokenizer = char_tokenizer()
        torch.manual_seed(0)
        config = qwen2_config(QWEN2_SIZES[name], len(tokenizer), max_position_embeddings=512)
        model = transformers.Qwen2ForCausalLM(config).eval()
        for settings in (model.config, model.generation_config):
            settings.eos_token_id = tokenizer.eos_token_id
            settings.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer
    path = model_dir(name)
    return load_dir(path), load_tokenizer(path)


def model_dir(name: str) -> Path:
    """A model directory: the bundled default, a path, or a `QWEN2_SIZES` model cached once."""
    from oncurve.model.sources import resolve_model_path

    if name not in QWEN2_SIZES:
        path = resolve_model_path(name)
        if not (path / "config.json").is_file():
            raise SystemExit(f"model {name}: {path} holds no model yet; use --model tiny")
        return path
    path = MODELS / name
    if not (path / "config.json").is_file():
        model, tokenizer = load_model(name)
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
    return path


def copy_files(source: Path, dest: Path, pattern: str = "*") -> None:
    """The files of `source` matching `pattern` into `dest`, contents only (not read-only)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.glob(pattern):
        shutil.copyfile(path, dest / path.name)


def tokenizer_dir(source: str | None = None) -> Path:
    """The cached Qwen3 tokenizer, copied first from `source`, or ../shared or the GPU bundle."""
    if source or not (TOKENIZER / "tokenizer.json").is_file():
        found = [p for p in (SHARED_TOKENIZER, GPU_BUNDLE / "tokenizer") if p.is_dir()]
        origin = Path(source) if source else (found or [SHARED_TOKENIZER])[0]
        if not (origin / "tokenizer.json").is_file():
            raise SystemExit(
                f"no Qwen3 tokenizer in {TOKENIZER} nor in {origin}: run `make gpu-bundle` "
                f"where {SHARED_TOKENIZER} exists and carry "
                f"{GPU_BUNDLE.relative_to(ROOT)}, or pass --tokenizer DIR"
            )
        shutil.rmtree(TOKENIZER, ignore_errors=True)
        copy_files(origin, TOKENIZER)
    return TOKENIZER


def end_at_eos(model: Any, eos_id: int, mean_length: float) -> None:
    """Make a random Qwen2 model sample `eos_id` with probability 1 / `mean_length` at every
    position, so that sampled completions end at EOS with geometric lengths rather than always
    running to the cap; in place, with no calibration.

    Residual coordinate 0 becomes a large constant at every position: the first layer's value
    projection gives its first value dimension a constant bias, which its output projection
    routes into coordinate 0 alone, and which no embedding and no other projection writes. Every
    norm after it is dominated by that coordinate: the final norm's output is sqrt(hidden) there
    and near 0 elsewhere, so every logit is near 0 but EOS's, sqrt(hidden) x the output head's
    coordinate 0 of EOS, set to ln((V - 1) / (mean_length - 1)). The layers still run all their
    arithmetic; only what it computes is fixed.
    """
    import torch

    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    vocab, hidden = head.shape  # [V, H]; one tensor when the embeddings are tied
    first = model.model.layers[0].self_attn
    head_dim = first.head_dim
    heads_per_value = model.config.num_attention_heads // model.config.num_key_value_heads
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        first.v_proj.weight[0] = 0
        first.v_proj.bias[0] = 1e4
        for query in range(heads_per_value):  # the query heads that read value head 0
            first.o_proj.weight[:, query * head_dim] = 0
        first.o_proj.weight[0, 0] = 1
        embedding[:, 0] = 0
        head[:, 0] = 0
        head[eos_id, 0] = math.log((vocab - 1) / (mean_length - 1)) / math.sqrt(hidden)


def build_model(name: str, tokenizer_path: Path, eos_mean_length: float | None = None) -> Path:
    """The cached random `SHAPES` model `name` (seed 0, bf16, saved whole or not at all) with the
    Qwen3 tokenizer and its ids; `eos_mean_length`: ending at EOS (`end_at_eos`)."""
    import torch
    import transformers

    path = MODELS / (f"{name}-eos{eos_mean_length:g}" if eos_mean_length else name)
    if (path / "config.json").is_file():
        return path
    print(f"building {path.name} in {path} ...", flush=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    ids = {key: getattr(tokenizer, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = qwen2_config(
        SHAPES[name],
        VOCAB,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dtype="bfloat16",
        **ids,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    if eos_mean_length:
        end_at_eos(model, tokenizer.eos_token_id, eos_mean_length)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(partial)
    copy_files(tokenizer_path, partial, "tokenizer*")
    partial.rename(path)
    return path
