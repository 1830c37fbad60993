"""The final model: written whole or not at all (a `transformers`-loadable directory, LoRA
merged), and what a partial one lacks."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import GenerationConfig, PreTrainedTokenizerBase

from oncurve.errors import CheckpointError, UserError
from oncurve.run.durable_files import follow_umask, fsync

GENERATION_FILE = "generation_config.json"


def save_final(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    generation: GenerationConfig,
) -> None:
    """A directory that `AutoModelForCausalLM.from_pretrained` loads as is (safetensors),
    written whole or not at all (`_written_whole`), with `generation` (`trained_generation`)
    as its generation_config.json."""
    with _written_whole(out) as partial:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        generation.save_pretrained(partial)


# The keys of a generation config that name the model's special tokens
_SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def trained_generation(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
) -> GenerationConfig:
    """The model's special tokens from its own generation config with the sampling a run
    trained with, which `transformers`' `generate` and `oncurve eval`/`sample --model` then use
    by default. Nothing else of the base's is kept: a logits processor it states
    (`repetition_penalty`, `no_repeat_ngram_size`) was never applied in training. Temperature 0
    is greedy; top_k 0 and min_p None keep every token, as the run did. The run's completions
    ended at `tokenizer`'s EOS as well as the model's own, and were padded with its pad token:
    the config's `eos_token_id` holds both, `pad_token_id` the tokenizer's where the model
    states none."""
    own = getattr(model, "generation_config", None)
    stated = own.to_diff_dict() if own is not None else {}
    settings = {key: stated[key] for key in _SPECIAL_TOKENS if stated.get(key) is not None}
    eos = settings.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids = [*eos_ids, tokenizer.eos_token_id]
        settings["eos_token_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    if "pad_token_id" not in settings and tokenizer.pad_token_id is not None:
        settings["pad_token_id"] = tokenizer.pad_token_id
    settings.update(do_sample=temperature > 0, max_new_tokens=max_new_tokens)
    if temperature > 0:
        settings.update(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p or None)
    return GenerationConfig(**settings)


def read_generation_config(model_dir: str | Path) -> dict[str, Any]:
    """The sampling settings a model directory's generation_config.json states ({} without
    one, or for a Hub id): `max_new_tokens`, and `temperature`, `top_p`, `top_k`, `min_p` when
    it samples (`do_sample`). Only the keys the file holds: `GenerationConfig`'s defaults
    (top_k 50) are not the model's."""
    file = Path(model_dir) / GENERATION_FILE
    if not file.is_file():
        return {}
    try:
        stated = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{file}: not readable as JSON ({err})") from None
    if not isinstance(stated, dict):
        raise UserError(f"{file}: not a JSON object")
    keys = ["max_new_tokens"]
    if stated.get("do_sample"):
        keys += ["temperature", "top_p", "top_k", "min_p"]
    return {key: stated[key] for key in keys if stated.get(key) is not None}


def missing_from_final(final: Path) -> str | None:
    """What keeps `final` from being a whole saved model (its config, its tokenizer, every
    weights file it names, each readable as safetensors), None when nothing does: a final model
    written before it was written whole can lack files or end early."""
    if not (final / "config.json").is_file():
        return "no config.json"
    if not (final / "tokenizer_config.json").is_file():
        return "no tokenizer_config.json"
    index = final / "model.safetensors.index.json"
    try:
        names = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.is_file()
            else ["model.safetensors"]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"an unreadable {index.name}"
    for name in names:
        try:
            with safe_open(final / name, framework="pt"):
                pass
        except (OSError, SafetensorError, ValueError):
            return f"no readable {name}"
    return None


@contextlib.contextmanager
def _written_whole(out: Path) -> Iterator[Path]:
    """A hidden directory beside `out` to write into, renamed to `out` when the block ends, its
    files and itself flushed to the disk before (and the rename after): a full disk, a
    file-size limit or a power loss never leaves a partial model at `out`; the first two give
    a one-line CheckpointError that says the run's checkpoints are kept."""
    out = Path(out)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    trash = out.parent / f".{out.name}.trash-{os.getpid()}"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        yield partial
        follow_umask(partial)
        for path in sorted(partial.rglob("*")):  # files, and folders (a LoRA adapter's) too
            fsync(path)
        fsync(partial)
        if out.exists():
            os.replace(out, trash)
        os.replace(partial, out)
        fsync(out.parent)
    except (OSError, RuntimeError, SafetensorError) as err:
        shutil.rmtree(partial, ignore_errors=True)
        if trash.exists() and not out.exists():
            os.replace(trash, out)
        reason = " ".join(str(err).split())[:300]
        raise CheckpointError(
            f"cannot write the final model {out}: {reason}; the run's checkpoints are kept "
            f"(resume with run.resume=auto run.dir={out.parent} to write it again)"
        ) from None
    shutil.rmtree(trash, ignore_errors=True)


def save_lora_final(
    peft_model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    adapter: bool,
    generation: GenerationConfig,
) -> None:
    """`out` gets the merged model (base + adapter), loadable without peft, with its
    `generation` as its generation_config.json; `out/adapter` the adapter alone when
    asked."""
    # merged on a CPU copy: a second copy of the model on the GPU is memory the run never had
    device = next(peft_model.parameters()).device
    merged = copy.deepcopy(peft_model.to("cpu")).merge_and_unload()
    peft_model.to(device)
    with _written_whole(out) as partial:
        if adapter:
            # only the adapters train and the embedding is never resized: the adapter's weights
            # are all there is to save, and peft's check for a resized vocabulary (which looks
            # the base up on the Hub) has nothing to find
            peft_model.save_pretrained(partial / "adapter", save_embedding_layers=False)
        merged.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        generation.save_pretrained(partial)
