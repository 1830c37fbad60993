"""What `oncurve eval` and `oncurve sample` share: a run's config, the prompt format, the sampler."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from oncurve.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from oncurve.rollout import Sampler


def run_config(args: argparse.Namespace):
    """The resolved config of `--run RUN_DIR` (None without it); fills in `--model` (the run's
    final model) and `--max-new-tokens` (its rollout.max_new_tokens; without a run, the
    default of a run of `--model`) when they are not given."""
    from oncurve.config import build_config, load_config
    from oncurve.model.saving import missing_from_final

    if args.run_dir is None:
        if args.model is None:
            raise UserError("--model or --run is required")
        # the run a config would make of this model: 64 for the bundled one, else 256
        default = build_config({"model": {"path": args.model}}).rollout.max_new_tokens
        args.max_new_tokens = args.max_new_tokens or default
        return None
    path = Path(args.run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"--run {args.run_dir}: no config.yaml (not a run directory)")
    config = load_config(path)
    if args.model is None:
        final = Path(args.run_dir) / "final"
        if not final.exists():
            raise UserError(f"--run {args.run_dir}: no final/ model yet (the run has not finished)")
        missing = missing_from_final(final)
        if missing:
            raise UserError(
                f"--run {args.run_dir}: final/ is incomplete ({missing}; its save was cut "
                f"short): write it again with oncurve train run.resume=auto run.dir={args.run_dir}"
            )
        args.model = str(final)
    args.max_new_tokens = args.max_new_tokens or config.rollout.max_new_tokens
    return config


def prompt_format(args: argparse.Namespace, config, tokenizer):
    """How prompts are formatted and answers read, as training does: the run's data settings
    under `--run`, else the defaults with the chat template when the tokenizer has one; the
    flags (`--chat-template`, `--system-prompt`, `--prompt-field`, ...) override either."""
    from oncurve.config import DataConfig

    data = config.data if config is not None else DataConfig()
    chat = args.chat_template
    if chat is None:
        chat = data.chat_template if config is not None else bool(tokenizer.chat_template)
    if chat and not tokenizer.chat_template:
        raise UserError("--chat-template: the tokenizer has no chat template")
    system = args.system_prompt if args.system_prompt is not None else data.system_prompt
    # `oncurve eval`'s data flags; `oncurve sample` has none
    given = {
        key: getattr(args, key)
        for key in ("prompt_field", "answer_field", "answer_format", "prompt_template", "config")
        if getattr(args, key, None) is not None
    }
    return dataclasses.replace(data, chat_template=chat, system_prompt=system, **given)


def load_sampler(args: argparse.Namespace, config=None) -> tuple[Sampler, PreTrainedModel]:
    """The `--backend` sampler of the `--model` model (a run's `config`: its tokenizer's
    remote-code setting), and the model."""
    from oncurve.model.devices import resolve_device, resolve_dtype
    from oncurve.model.sources import load_model, load_tokenizer, resolve_model_path
    from oncurve.rollout import build_sampler

    path = resolve_model_path(args.model, args.revision, what="--model")
    if config is not None:
        args.trust_remote_code = args.trust_remote_code or config.model.trust_remote_code
    tokenizer = load_tokenizer(path, args.trust_remote_code)
    device = resolve_device(args.device, what="--device")
    dtype = resolve_dtype(args.dtype, device)
    model = load_model(path, dtype, device, trust_remote_code=args.trust_remote_code)
    return build_sampler(args.backend, model, tokenizer, name="--backend"), model
