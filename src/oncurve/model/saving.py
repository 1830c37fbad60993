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

import torch
from safetensors import SafetensorError, safe_open
from transformers import PreTrainedTokenizerBase

from oncurve.errors import CheckpointError


def save_final(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """A directory that `AutoModelForCausalLM.from_pretrained` loads as is (safetensors),
    written whole or not at all (`_written_whole`)."""
    with _written_whole(out) as partial:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)


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
    """A hidden directory beside `out` to write into, renamed to `out` when the block ends: a
    full disk or a file-size limit never leaves a partial model at `out`, only a one-line
    CheckpointError that says the run's checkpoints are kept."""
    out = Path(out)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    trash = out.parent / f".{out.name}.trash-{os.getpid()}"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        yield partial
        if out.exists():
            os.replace(out, trash)
        os.replace(partial, out)
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
    peft_model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path, adapter: bool
) -> None:
    """`out` gets the merged model (base + adapter), loadable without peft; `out/adapter` the
    adapter alone when asked."""
    # merged on a CPU copy: a second copy of the model on the GPU is memory the run never had
    device = next(peft_model.parameters()).device
    merged = copy.deepcopy(peft_model.to("cpu")).merge_and_unload()
    peft_model.to(device)
    with _written_whole(out) as partial:
        if adapter:
            peft_model.save_pretrained(partial / "adapter")
        merged.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
