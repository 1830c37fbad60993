"""A checkpoint as a model to evaluate or sample from: the run's config it was saved with
(`state.json`), and the policy it holds on the base model the run started from, a LoRA adapter
merged into it."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from oncurve.config import Config, build_config
from oncurve.errors import UserError
from oncurve.model.sources import load_model, load_tokenizer, resolve_model_path
from oncurve.model.weights import add_lora
from oncurve.run.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    named_checkpoint,
    read_state,
    verify_checksums,
)
from oncurve.run.checkpoint_weights import load_trainable, load_weights


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint directory `path` names, None when it names none: a checkpoint
    (`RUN/checkpoints/step-N`, its `state.json` beside its weights, complete or not), or the
    `RUN/checkpoints/latest` pointer, the run's newest complete checkpoint."""
    path = Path(path)
    if (named := named_checkpoint(path)) != path:
        return named
    if (path / STATE_FILE).is_file() and (path / MODEL_FILE).is_file():
        return path
    return None


def checkpoint_config(path: str | Path) -> Config:
    """The run's resolved config at the step `path` saved (its rollout's sampling and its data's
    prompt format among it); UserError naming the checkpoint when it is not complete or holds
    none."""
    path = Path(path)
    saved = read_state(path).get("config")
    if not isinstance(saved, dict):
        raise UserError(
            f"checkpoint {path}: its {STATE_FILE} holds no run config; name the run with --run"
        )
    return build_config(saved)


def load_checkpoint_model(
    path: str | Path,
    config: Config,
    dtype: str,
    device: str | torch.device,
    trust_remote_code: bool = False,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The policy `path` holds, in eval mode, and its tokenizer: `config`'s base model (the run's
    `model.path`) with the checkpoint's weights, or its LoRA adapter merged in; the files'
    weights' checksum verified first (UserError naming the file when it does not match; the
    optimizer's state, which a policy does not need, is not read). The code the base model
    ships runs only with `trust_remote_code`, whatever the run's `model.trust_remote_code`:
    that was trust for its training, not for whoever loads its checkpoint."""
    path = Path(path)
    verify_checksums(path, (MODEL_FILE,))
    model_config = config.model
    base = resolve_model_path(model_config.path, model_config.revision)
    tokenizer = load_tokenizer(base, trust_remote_code)
    model = load_model(base, dtype, device, trust_remote_code)
    if model_config.lora.r > 0:
        peft_model = add_lora(model, model_config.lora)
        load_trainable(path / MODEL_FILE, peft_model.get_base_model())
        model = peft_model.merge_and_unload()
    else:
        load_weights(path / MODEL_FILE, model)
    return model.eval(), tokenizer
