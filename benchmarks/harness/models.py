"""The models the benchmarks train, built from a config (nothing is downloaded): random
Qwen2-style models with the bundled character tokenizer (`tiny`, `30m`), the Qwen2.5-0.5B and
1.5B shapes with the Qwen3 tokenizer for the GPU (optionally ending their completions at EOS
after a set mean length: `end_at_eos`), and the bundled `default` or a model directory by path."""

from __future__ import annotations

import math
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor
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


def end_at_eos(model: Any, eos_id: int, mean_length: float, calibration_ids: Any) -> None:
    """Make a random Qwen2 model with tied embeddings sample `eos_id` with probability about
    1 / `mean_length` on average over positions, so that sampled completions end at EOS with
    lengths drawn (about geometrically) rather than always running to the cap; in place.

    Hidden coordinate 0 of the residual stream is made the same at every position (each
    token's embedding holds 1 there and no layer's output projection writes it), so the final
    norm's coordinate 0 varies only with the norm of the other coordinates, which concentrates.
    The tied output head multiplies it by each token's embedding coordinate 0: the same for
    every token but EOS, whose value is then set so that EOS's probability, averaged over the
    positions of `calibration_ids` ([B, T], no EOS in them), is 1 / mean_length.
    """
    import torch

    embedding = model.get_input_embeddings().weight  # [V, H], also the output head
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        embedding[:, 0] = 1
        normed: list[Any] = []
        hook = model.model.norm.register_forward_hook(
            lambda module, inputs, output: normed.append(output[..., 0].float())
        )
        logits = model(calibration_ids).logits.float()  # [B, T, V]
        hook.remove()
        others = torch.cat([logits[..., :eos_id], logits[..., eos_id + 1 :]], dim=-1)
        # EOS's probability at a position is sigmoid(its logit - logsumexp(the others')), its
        # logit rising by normed * delta: each position's own delta brackets the one whose mean
        # probability is 1 / mean_length, found by bisection
        gap, slope = logits[..., eos_id] - others.logsumexp(-1), normed[0]
        p = 1 / mean_length
        own = (math.log(p / (1 - p)) - gap) / slope
        low, high = own.min().item(), own.max().item()
        for _ in range(60):
            middle = (low + high) / 2
            if torch.sigmoid(gap + slope * middle).mean() < p:
                low = middle
            else:
                high = middle
        embedding[eos_id, 0] += (low + high) / 2


def build_model(name: str, tokenizer_path: Path, eos_mean_length: float | None = None) -> Path:
    """The directory of the random bf16 model `name` of `SHAPES` with the Qwen3 tokenizer
    beside it, built once under the cache by a child process (`write_model`). With
    `eos_mean_length`, its completions end at EOS after that many tokens on average, in a folder
    of its own. The child calibrates that model on the GPU when there is one, and its exit
    leaves this process, which runs the trainers, without a CUDA context or cached GPU memory."""
    path = MODELS / (f"{name}-eos{eos_mean_length:g}" if eos_mean_length else name)
    if not (path / "config.json").is_file():
        print(f"building {path.name} in {path} ...", flush=True)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            pool.submit(write_model, name, tokenizer_path, eos_mean_length, path).result()
    return path


def write_model(name: str, tokenizer_path: Path, eos_mean_length: float | None, path: Path) -> None:
    """`build_model`'s work: the random model `name` (seed 0), made to end at EOS after
    `eos_mean_length` tokens on average when given (`end_at_eos`, calibrated on random ids), its
    eos, pad and bos ids the tokenizer's, saved in bf16 with the tokenizer to `path` (whole or
    not at all)."""
    import torch
    import transformers

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
    if eos_mean_length:
        if torch.cuda.is_available():  # the calibration's forward pass: minutes on a CPU
            model.cuda()
        calibration = torch.randint(0, tokenizer.pad_token_id, (2, 512), device=model.device)
        end_at_eos(model, tokenizer.eos_token_id, eos_mean_length, calibration)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    copy_files(tokenizer_path, partial, "tokenizer*")
    partial.rename(path)
