"""The models the benchmarks train, built from a config (nothing is downloaded): random
Qwen2-style models with the bundled character tokenizer (`tiny`, `30m`), the Qwen2.5-0.5B shape
with the Qwen3 tokenizer for the GPU, and the bundled `default` or a model directory by path."""

from __future__ import annotations

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
    "smoke": (128, 704, 2, 2, 1),
}
VOCAB = 151936
MODELS = CACHE / "models"
TOKENIZER = CACHE / "tokenizer"  # the Qwen3 tokenizer, copied once from ../shared or the bundle
SHARED_TOKENIZER = ROOT.parent / "shared" / "assets" / "qwen3-tokenizer"


def qwen2_config(shape: tuple[int, int, int, int, int], vocab_size: int, **extra: Any) -> Any:
    """A `transformers.Qwen2Config` with tied embeddings of `shape` (hidden, intermediate,
    layers, heads, kv_heads, as in `QWEN2_SIZES`); `extra` are further config fields."""
    import transformers

    hidden, intermediate, layers, heads, kv_heads = shape
    return transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
        **extra,
    )


def load_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) for `default` (the bundled model), a `QWEN2_SIZES` name (random,
    seed 0, float32, eval mode), or a path to a local Hugging Face model directory."""
    import torch
    import transformers

    from oncurve.model.char_tokenizer import char_tokenizer
    from oncurve.model.sources import load_model as load_dir
    from oncurve.model.sources import load_tokenizer, resolve_model_path

    if name in QWEN2_SIZES:
        tokenizer = char_tokenizer()
        torch.manual_seed(0)
        config = qwen2_config(QWEN2_SIZES[name], len(tokenizer), max_position_embeddings=512)
        model = transformers.Qwen2ForCausalLM(config).eval()
        for settings in (model.config, model.generation_config):
            settings.eos_token_id = tokenizer.eos_token_id
            settings.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer
    path = resolve_model_path(name)
    if not (Path(path) / "config.json").is_file():
        raise SystemExit(f"model {name}: {path} holds no model yet; use --model tiny")
    return load_dir(path), load_tokenizer(path)


def model_dir(name: str) -> Path:
    """A model directory any trainer loads: the bundled default, a path, or a `QWEN2_SIZES`
    model saved once under the cache."""
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
    """The files of `source` matching `pattern` into `dest`, contents only (the shared copy is
    read-only)."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.glob(pattern):
        shutil.copyfile(path, dest / path.name)


def tokenizer_dir(source: str | None = None) -> Path:
    """The Qwen3 tokenizer in the cache, copied there first from `source`, or from ../shared
    or the GPU bundle when the cache has none yet."""
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


def build_model(name: str, tokenizer_path: Path) -> Path:
    """The random bf16 model `name` of `SHAPES` with the Qwen3 tokenizer beside it, built once
    under the cache (seed 0); its eos, pad and bos ids are the tokenizer's."""
    import torch
    import transformers

    path = MODELS / name
    if (path / "config.json").is_file():
        return path
    print(f"building {name} in {path} ...", flush=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = qwen2_config(
        SHAPES[name],
        VOCAB,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dtype="bfloat16",
        **ids,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    partial = path.with_name(name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    copy_files(tokenizer_path, partial, "tokenizer*")
    partial.rename(path)
    return path
