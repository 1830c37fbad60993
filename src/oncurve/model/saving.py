"""The final model: written whole or not at all (a `transformers`-loadable directory, LoRA
merged), and what a partial one lacks."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
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
# What a save writes in final/ (the model's config, weights and index; the tokenizer's files,
# its vocabulary under the names causal LMs' tokenizers give it; peft's adapter): a file of
# another name there is the user's (a model card, an eval result).
SAVED_FILES = re.compile(
    r"(?:generation_)?config\.json|model(?:-\d{5}-of-\d{5})?\.safetensors"
    r"|model\.safetensors\.index\.json|tokenizer(?:_config)?\.json|special_tokens_map\.json"
    r"|added_tokens\.json|chat_template\.(?:jinja|json)|additional_chat_templates/[\w.-]+\.jinja"
    r"|vocab\.(?:json|txt)|merges\.txt|tekken\.json|[\w.-]+\.(?:model|tiktoken)"
    r"|adapter/(?:adapter_config\.json|adapter_model\.safetensors|README\.md)"
)


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
    a one-line CheckpointError that says the run's checkpoints are kept. `out` a link (to
    another disk) stays one: the directory it points to is the one replaced. The files of the
    `out` it replaces that no save writes (`SAVED_FILES`) are in the new one too, as
    `save_pretrained` keeps them; the previous save's own (a weight shard or an adapter this
    save does not write) are not."""
    out = _saved_at(out)
    partial, trash = _scratch(out, "partial"), _scratch(out, "trash")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        yield partial
        follow_umask(partial)  # before the user's files join: they keep their own modes
        if out.is_dir():
            _keep_users_files(out, partial)
        for path in sorted(partial.rglob("*")):  # files, and folders (a LoRA adapter's) too
            if not path.is_symlink():  # a user's link may point anywhere, or nowhere
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


def _saved_at(out: Path) -> Path:
    """Where a save to `out` writes: where `out` points when it is a link."""
    out = Path(out)
    return out.resolve() if out.is_symlink() else out


def _scratch(out: Path, kind: str) -> Path:
    """The hidden directory beside `out` a save of this process writes into (`partial`) or
    moves the previous `out` to (`trash`)."""
    return out.parent / f".{out.name}.{kind}-{os.getpid()}"


def _keep_users_files(old: Path, new: Path) -> None:
    """Link into `new` every file (or link) of `old` that no save writes and `new` lacks, in
    its folder: linked, not moved, so that until `new` replaces `old` they are in `old` still."""
    for path in sorted(old.rglob("*")):
        relative = path.relative_to(old)
        if (path.is_dir() and not path.is_symlink()) or SAVED_FILES.fullmatch(relative.as_posix()):
            continue
        kept = new / relative
        if kept.exists() or kept.is_symlink():  # this save wrote it
            continue
        kept.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), kept)
        else:
            try:
                os.link(path, kept)
            except OSError:  # a file system without hard links
                shutil.copy2(path, kept)


def recover_interrupted_save(out: Path) -> None:
    """Clear what a save to `out` killed midway (any process's) left beside it: the previous
    model moved aside while the new one was not yet in its place is put back, the rest
    removed, so that `out` is the old model or the new one, never neither."""
    out = _saved_at(out)
    if not out.parent.is_dir():
        return
    for path in sorted(out.parent.iterdir()):
        kind = re.fullmatch(rf"\.{re.escape(out.name)}\.(partial|trash)-\d+", path.name)
        if kind is None:
            continue
        if kind[1] == "trash" and not out.exists():
            os.replace(path, out)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
